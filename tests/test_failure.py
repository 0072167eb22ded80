"""remote/jobs/failure.py: script errors told from faults, on tracebacks that real Python printed.

Each script below (and in tests/script_errors.py) is run with this test's Python, once per simulated
worker in its own directory (so paths in the tracebacks differ between workers, as they do between
nodes); its output, stdout and stderr interleaved as a worker's log holds them, is what the functions judge.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from script_errors import RAISED_AT, VALUES, per_replica_error

from homegpu.remote.jobs.failure import (
    TAIL_LINES, ErrorTail, WorkerEnd, error_tail, judge, might_be_script_error, repeatable_errors, shows_progress,
)
from homegpu.remote.logs.tracebacks import TRACEBACK_HEADER, TracebackReader

SCRIPTS = {
    "import_error": """
        import json
        import homegpu_no_such_module  # the user forgot to install it
        print("never")
        """,
    "mid_training": """
        import sys
        def train_step(step):
            if step == 3:
                raise RuntimeError("Collective ops is aborted by: another worker failed")
        for step in range(1, 5):
            train_step(step)
            print('HOMEGPU_METRIC {"event":"step","epoch":1,"step":%d,"loss":0.5}' % step, flush=True)
        """,
    "syntax_error": """
        def broken(:
            pass
        """,
    "exit_message": """
        import sys
        sys.exit("config.yaml not found: pass --config")
        """,
    "chained": """
        def load():
            try:
                {}["weights"]
            except KeyError:
                raise ValueError("the checkpoint has no weights")
        load()
        """,
    "deep": """
        def even(n):
            return odd(n - 1) if n else int("not a number")
        def odd(n):
            return even(n - 1)
        even(40)
        """,
    "keras_mid_epoch": """
        print("Epoch 1/3")
        print("12/40 [=======>......................] - ETA: 2s - loss: 0.91", flush=True)
        raise MemoryError("out of memory allocating the batch")
        """,
}


def _run(tmp_path: Path, name: str, worker: int = 0) -> tuple[int, tuple[str, ...]]:
    """(exit status, output lines) of SCRIPTS[name] run as worker `worker`."""
    folder = tmp_path / f"node{worker}"
    folder.mkdir(exist_ok=True)
    script = folder / f"{name}.py"
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    result = subprocess.run([sys.executable, str(script)], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=60)
    return result.returncode, tuple(result.stdout.splitlines())


def _end(tmp_path: Path, name: str, worker: int, **overrides) -> WorkerEnd:
    status, lines = _run(tmp_path, name, worker)
    fields = dict(label=f"n{worker}", exit_status=status, progressed=any(map(shows_progress, lines)),
                  last_lines=lines)
    return WorkerEnd(**{**fields, **overrides})


# -- the traceback tail --------------------------------------------------------------------------

@pytest.mark.parametrize("name, exception, last_frame", [
    ("import_error", "ModuleNotFoundError: No module named 'homegpu_no_such_module'", "import homegpu_no_such_module"),
    ("mid_training", "RuntimeError: Collective ops is aborted by: another worker failed", "raise RuntimeError"),
    ("chained", "ValueError: the checkpoint has no weights", 'raise ValueError("the checkpoint'),
    ("keras_mid_epoch", "MemoryError: out of memory allocating the batch", 'raise MemoryError("out of'),
])
def test_error_tail_is_the_last_traceback_and_its_exception(tmp_path, name, exception, last_frame):
    status, lines = _run(tmp_path, name)
    assert status == 1
    tail = error_tail(lines)
    assert tail.exception == exception
    assert tail.lines[0] == TRACEBACK_HEADER and tail.lines[-1] == exception
    assert last_frame in tail.lines[-2] or last_frame in tail.lines[-3]  # the line that raised (and ^^^)
    assert not any(line.startswith("HOMEGPU_METRIC") for line in tail.lines)
    if name == "chained":  # only the last of the two tracebacks
        assert tail.lines.count(TRACEBACK_HEADER) == 1 and "KeyError" not in "\n".join(tail.lines)


def test_error_tail_of_a_syntax_error_which_prints_no_header(tmp_path):
    status, lines = _run(tmp_path, "syntax_error")
    tail = error_tail(lines)
    assert status == 1 and tail.exception.startswith("SyntaxError:")
    assert tail.lines[0].lstrip().startswith('File "') and "def broken(:" in tail.lines[1]


def test_error_tail_is_bounded_and_keeps_header_and_exception(tmp_path):
    status, lines = _run(tmp_path, "deep")
    assert len(lines) > 2 * TAIL_LINES  # 41 frames, two lines each
    tail = error_tail(lines)
    assert len(tail.lines) == TAIL_LINES
    assert tail.lines[0] == TRACEBACK_HEADER and "lines left out" in tail.lines[1]
    assert tail.exception == "ValueError: invalid literal for int() with base 10: 'not a number'"
    assert tail.lines[-1] == tail.exception
    assert int(tail.lines[1].split("(")[1].split()[0]) == len(lines) - TAIL_LINES + 1  # the count is right


@pytest.mark.parametrize("lines", [
    (),
    ("epoch 1/2 loss 0.4", "all good"),
    (TRACEBACK_HEADER, '  File "/x/train.py", line 3, in <module>', "    import foo"),  # cut off
])
def test_error_tail_without_a_complete_traceback_is_empty(lines):
    assert error_tail(lines) == ErrorTail()


def test_error_tail_of_an_exit_message_is_empty(tmp_path):
    status, lines = _run(tmp_path, "exit_message")
    assert status == 1 and lines == ("config.yaml not found: pass --config",)
    assert error_tail(lines) == ErrorTail()


# -- progress ------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, progress", [
    ('HOMEGPU_METRIC {"event":"step","epoch":1,"step":20,"loss":0.4}', True),
    ('HOMEGPU_METRIC {"event":"epoch","epoch":1}', True),
    ('HOMEGPU_METRIC {"event":"start","initial_epoch":0}', False),
    ("Epoch 1/3", False),
    ("12/40 [=======>......................] - ETA: 2s - loss: 0.91", True),
    ("40/40 [==============================] - 3s 81ms/step - loss: 0.0045 - accuracy: 1.0000", True),
    (" 1/40 ━━━━━━━━━━━━━━━━━━━━ 10s 270ms/step - loss: 2.3", True),
    ("1/40 [>....] - ETA: 9s\r2/40 [>....] - ETA: 8s", True),
    ("Traceback (most recent call last):", False),
    ("loaded 1/2 shards", False),
])
def test_shows_progress(line, progress):
    assert shows_progress(line) is progress


# -- script error or fault -----------------------------------------------------------------------

def test_the_same_import_error_on_every_worker_is_a_script_error(tmp_path):
    ends = [_end(tmp_path, "import_error", worker) for worker in (0, 1)]
    assert ends[0].last_lines != ends[1].last_lines  # each node's own paths
    assert all(might_be_script_error(end) for end in ends)
    verdict = judge(ends)
    assert verdict.script_error and not verdict.retry
    assert "ModuleNotFoundError: No module named 'homegpu_no_such_module'" in verdict.summary
    assert "n0, n1" in verdict.summary and "\n" not in verdict.summary
    assert verdict.tail == error_tail(ends[0].last_lines).lines  # shown once, the first worker's


def test_the_same_exit_message_on_every_worker_is_a_script_error(tmp_path):
    verdict = judge([_end(tmp_path, "exit_message", worker) for worker in (0, 1)])
    assert verdict.script_error and "config.yaml not found: pass --config" in verdict.summary
    assert verdict.tail == ()


def test_an_exit_message_is_named_even_after_the_supervisors_exit_note():
    """The worker's log ends with the note of its supervisor (node_side/scripts/worker_process.py); the summary
    names the script's own last words, as the queue and `run` show them."""
    lines = ("the experiment is broken: exit 3", "=== homegpu: node1 generation 1 exited with status 1 ===")
    verdict = judge([WorkerEnd("node1", 1, last_lines=lines)])
    assert verdict.script_error and "before training started: the experiment is broken: exit 3 (exit 1;" in verdict.summary


@pytest.mark.parametrize("name, second, overrides, cause", [
    ("mid_training", "mid_training", {}, "n0 failed after training began: RuntimeError: Collective ops"),
    ("keras_mid_epoch", "keras_mid_epoch", {}, "after training began: MemoryError"),
    ("import_error", "syntax_error", {}, "different errors"),
    ("import_error", "import_error", {"exit_status": -9}, "n1 was killed by signal 9"),
    ("import_error", "import_error", {"exit_status": 137}, "n1 was killed (exit 137: signal 9)"),
    ("import_error", "import_error", {"exit_status": None}, "n1 vanished"),
    ("import_error", "import_error", {"stalled": True}, "n1 stalled"),
    ("import_error", "import_error", {"stopped": True, "exit_status": 143}, "n1 was stopped"),
    ("import_error", "import_error", {"exit_status": 0}, "n1 succeeded while another worker failed"),
    ("import_error", "import_error", {"progressed": True}, "n1 failed after training began"),
])
def test_faults_are_retried(tmp_path, name, second, overrides, cause):
    verdict = judge([_end(tmp_path, name, 0), _end(tmp_path, second, 1, **overrides)])
    assert verdict.retry and not verdict.script_error
    assert cause in verdict.summary and verdict.tail == ()


def test_a_failure_after_progress_is_not_a_script_error_candidate(tmp_path):
    end = _end(tmp_path, "mid_training", 0)
    assert end.progressed and end.exit_status == 1
    assert not might_be_script_error(end)
    assert not might_be_script_error(WorkerEnd("n0", -15))


# -- a message of hundreds of lines, with values that differ between workers ---------------------

def _captured(tmp_path, worker: int, place: str = "", window: int = 60) -> WorkerEnd:
    """A worker's end as the run sees it: the traceback read as its lines came, its last `window` lines."""
    code_dir, lines = per_replica_error(tmp_path, worker, place=place)
    reader = TracebackReader()
    for line in lines:
        reader.feed(line)
    return WorkerEnd(f"n{worker}", 1, last_lines=lines[-window:], traceback=reader.last, code_dir=code_dir)


def test_the_same_error_with_a_300_line_message_of_differing_values_is_a_script_error(tmp_path):
    ends = [_captured(tmp_path, worker) for worker in (0, 1)]
    assert TRACEBACK_HEADER not in ends[0].last_lines  # its header is far above the last lines
    assert ends[0].last_lines[-1] != ends[1].last_lines[-1]  # TensorFlow's line at exit, stamped on each node
    assert ends[0].last_lines[-3] != ends[1].last_lines[-3]  # the dumped values
    assert all(might_be_script_error(end) for end in ends)
    verdict = judge(ends)
    assert verdict.script_error and not verdict.retry, verdict.summary
    assert verdict.summary == (
        "script error on every worker (n0, n1) before training started: ValueError: Attempt to convert a value "
        f"(PerReplica:{{ … at {RAISED_AT} (exit 1; not restarted) — known cause: Keras 3 under "
        "MultiWorkerMirroredStrategy; fix: write `import tf_keras as keras` in the script, or set "
        'keras = "tf-keras" in the job')
    assert verdict.tail[0] == TRACEBACK_HEADER and len(verdict.tail) <= TAIL_LINES
    assert any(line.startswith(f"… {VALUES - 5} lines cut") for line in verdict.tail)
    assert verdict.tail[-1].endswith("to a Tensor.")
    # What the last lines alone say: no traceback, two different last lines, so a fault
    assert judge([replace(end, traceback=None) for end in ends]).retry


def test_the_same_type_raised_at_another_place_of_the_users_code_is_a_fault(tmp_path):
    verdict = judge([_captured(tmp_path, 0), _captured(tmp_path, 1, place="elsewhere")])
    assert verdict.retry and "different errors" in verdict.summary
    assert len(verdict.summary) < 400  # the first lines of the messages, not 300 of them


def test_without_the_code_dir_the_place_is_the_files_basename(tmp_path):
    ends = [replace(_captured(tmp_path, worker), code_dir="") for worker in (0, 1)]
    verdict = judge(ends)
    assert verdict.script_error and " at model.py:6 " in verdict.summary


def test_a_summary_names_a_bounded_number_of_workers_and_a_bounded_message():
    long = "ValueError: " + "x" * 5000
    lines = (TRACEBACK_HEADER, '  File "/w/train.py", line 2, in <module>', long)
    verdict = judge([WorkerEnd(f"n{i}", 1, last_lines=lines) for i in range(40)])
    assert verdict.script_error and "(n0, n1, n2, n3, n4, n5, n6, n7 and 32 more)" in verdict.summary
    assert len(verdict.summary) < 300 and " at train.py:2 " in verdict.summary


@pytest.mark.parametrize("line, progress", [
    ("[GPU0] Epoch 3 | Batchsize: 32 | Steps: 32 | Loss 0.13463", True),  # pytorch/examples' ddp tutorial
    ("epoch 2: loss=0.51", True),
    ("Epoch 2/5", False),  # Keras before the epoch's first step
    ("Epoch 3 | Training snapshot saved at snapshot.pt", False),
])
def test_a_scripts_own_epoch_line_with_a_loss_is_progress(line, progress):
    assert shows_progress(line) is progress


# -- the same error in two generations -----------------------------------------------------------

def test_the_errors_a_generation_repeats_are_its_own_tracebacks_and_never_a_kill_or_a_stall(tmp_path):
    failed, peer = _end(tmp_path, "mid_training", 0), _end(tmp_path, "import_error", 1)
    errors = repeatable_errors([failed, replace(peer, exit_status=None, stopped=True)])  # the peer stopped by homegpu
    assert list(errors) == [("n0", "RuntimeError", "mid_training.py:5")]
    assert errors[("n0", "RuntimeError", "mid_training.py:5")] == (
        "n0: RuntimeError: Collective ops is aborted by: another worker failed at mid_training.py:5")
    assert repeatable_errors([failed, peer]).keys() == {("n0", "RuntimeError", "mid_training.py:5"),
                                                         ("n1", "ModuleNotFoundError", "import_error.py:3")}
    for cause in (replace(peer, exit_status=-9), replace(peer, exit_status=137), replace(peer, exit_status=None),
                  replace(peer, stalled=True), replace(peer, last_lines=("exitcode  : -9",))):  # none of the script's
        assert repeatable_errors([failed, cause]) == {}
