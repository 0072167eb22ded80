"""remote/logs/tracebacks.py: a worker's last traceback, read line by line, bounded however long it is.

The long tracebacks are real Python output (tests/script_errors.py): a ValueError raised by a library
below the user's code, with a 300-line message of per-worker values, as Keras 3 prints under
MultiWorkerMirroredStrategy.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from script_errors import RAISED_AT, VALUES, per_replica_error

from homegpu.remote.logs.tracebacks import (
    CHAIN, EXCEPTION, FRAME, FRAME_LINES, MESSAGE, MESSAGE_LINES, RELEASED, START, TEXT, TRACEBACK_HEADER, Frame,
    TracebackReader, is_user_file, read_traceback,
)


def _output(tmp_path, source: str) -> tuple[str, ...]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=60)
    return tuple(result.stdout.splitlines())


def test_a_300_line_message_is_kept_bounded_with_its_header_frames_and_place(tmp_path):
    code_dir, lines = per_replica_error(tmp_path, 0)
    reader = TracebackReader()
    roles = [reader.feed(line) for line in lines]
    traceback = reader.last
    assert roles[:3] == [TEXT, START, FRAME] and roles.count(EXCEPTION) == 1
    assert roles.count(MESSAGE) == VALUES + 1  # each value's line and the closing one
    assert traceback.exception == "ValueError: Attempt to convert a value (PerReplica:{"
    assert traceback.type == "ValueError" and traceback.first_line == "Attempt to convert a value (PerReplica:{"
    assert len(traceback.message) == MESSAGE_LINES and traceback.message_cut == VALUES + 1 - MESSAGE_LINES
    assert traceback.message[0].endswith("numpy=0.0>") and traceback.message_last.endswith("to a Tensor.")
    assert traceback.message_lines == VALUES + 2
    assert traceback.user_frame.file == f"{code_dir}/src/model.py" and "fakelib" in traceback.last_frame.file
    assert traceback.place(code_dir) == RAISED_AT and traceback.place() == "model.py:6"
    assert traceback.key(code_dir) == ("ValueError", RAISED_AT)
    shown = traceback.lines(30, "logs/n0.log")
    assert shown[0] == TRACEBACK_HEADER and shown[-1] == traceback.message_last
    assert f"… {VALUES - MESSAGE_LINES} lines cut (whole in logs/n0.log)" in shown and len(shown) < 20


def test_the_header_far_above_the_last_lines_is_not_lost(tmp_path):
    _, lines = per_replica_error(tmp_path, 0)
    assert TRACEBACK_HEADER not in lines[-60:]  # what a worker's last lines hold
    assert read_traceback(lines[-60:]) is None
    assert read_traceback(lines).exception.startswith("ValueError: Attempt to convert")


def test_the_deepest_frames_are_kept_with_the_users_frame_however_deep(tmp_path):
    lines = _output(tmp_path, """
        import json
        def even(n):
            return odd(n - 1) if n else json.loads("{not json")
        def odd(n):
            return even(n - 1)
        even(200)
        """)
    traceback = read_traceback(lines)
    assert traceback.short_type == "JSONDecodeError" and len(traceback.frame_lines) == FRAME_LINES
    assert traceback.frames_left_out > 100
    assert traceback.user_frame.line == 4 and traceback.place() == "script.py:4"  # below it: json's own frames
    assert not is_user_file(traceback.last_frame.file)
    head = traceback.head(12)
    assert head[0] == TRACEBACK_HEADER and head[-1] == traceback.exception and len(head) == 14
    left = int(head[1].split("(")[1].split()[0])
    assert left == traceback.frames_left_out + FRAME_LINES - 11  # 11 of the budget's 12: the count is one
    assert any("script.py\", line 4" in line for line in head)  # the user's frame is shown


def test_the_last_of_chained_tracebacks_is_kept_and_the_chain_line_said(tmp_path):
    lines = _output(tmp_path, """
        try:
            {}["weights"]
        except KeyError:
            raise ValueError("the checkpoint has no weights")
        """)
    reader = TracebackReader()
    roles = [reader.feed(line) for line in lines]
    assert CHAIN in roles and roles.count(START) == 2
    assert reader.last.exception == "ValueError: the checkpoint has no weights"


def test_a_syntax_error_without_a_header_is_read(tmp_path):
    lines = _output(tmp_path, "def broken(:\n    pass\n")
    traceback = read_traceback(lines)
    assert traceback.type == "SyntaxError" and not traceback.header
    assert traceback.place() == "script.py:1"


@pytest.mark.parametrize("after", [
    "2025-01-02 10:00:00.123456: W tensorflow/core/framework/op_kernel.cc:1839] OP_REQUIRES failed",
    "W0000 00:00:1795367106.880219   12320 grpc_server.cc:100] shutting down",
    "WARNING:tensorflow:something",
    'HOMEGPU_METRIC {"event":"epoch","epoch":1}',
    "Epoch 2/3",
    "=== homegpu: n0 generation 1 exited with status 1 ===",
    "12/40 [=======>......................] - ETA: 2s - loss: 0.91",
    TRACEBACK_HEADER,
])
def test_a_message_ends_at_a_line_that_is_plainly_something_else(after):
    reader = TracebackReader()
    for line in (TRACEBACK_HEADER, '  File "/x/train.py", line 3, in <module>', "ValueError: bad", "more words"):
        reader.feed(line)
    assert reader.current is not None
    assert reader.feed(after) in (TEXT, START)
    assert reader.last.message == ("more words",) and reader.current is None


def test_another_threads_line_among_the_frames_passes_and_the_traceback_is_still_read():
    reader = TracebackReader()
    lines = (TRACEBACK_HEADER, '  File "/x/train.py", line 3, in <module>',
             "2025-01-02 10:00:00.123456: I tensorflow/core/x.cc:1] hello", "    fit()", "RuntimeError: no")
    assert [reader.feed(line) for line in lines] == [START, FRAME, TEXT, FRAME, EXCEPTION]
    assert reader.last.place() == "train.py:3"


def test_what_only_looked_like_a_traceback_is_released_as_it_was():
    reader = TracebackReader()
    assert reader.feed('  File "notes.txt", line 3') == START
    assert reader.feed("not an exception at all") == RELEASED
    assert reader.released == ('  File "notes.txt", line 3',) and reader.last is None
    assert reader.feed("plain") == TEXT


def test_a_cut_off_traceback_is_pending_not_last():
    reader = TracebackReader()
    for line in (TRACEBACK_HEADER, '  File "/x/train.py", line 3, in <module>', "    import foo"):
        reader.feed(line)
    assert reader.last is None and reader.in_frames
    assert reader.pending() == (TRACEBACK_HEADER, '  File "/x/train.py", line 3, in <module>', "    import foo")


def test_a_megabyte_line_is_kept_bounded():
    reader = TracebackReader()
    for line in (TRACEBACK_HEADER, '  File "/x/train.py", line 3, in <module>', "ValueError: " + "x" * 1_000_000,
                 "y" * 1_000_000):
        reader.feed(line)
    assert len(reader.last.exception) < 1000 and len(reader.last.message[0]) < 1000


@pytest.mark.parametrize("path, users", [
    ("/home/me/project/train.py", True),
    ("/srv/homegpu/work/code/job/src/model.py", True),
    ("/usr/lib/python3.11/runpy.py", False),
    ("/opt/conda/lib/python3.10/json/decoder.py", False),
    ("/home/me/.venv/lib/python3.11/site-packages/keras/src/trainer.py", False),
    ("/usr/lib/python3/dist-packages/tensorflow/python/ops.py", False),
    ("<frozen runpy>", False),
    ("/srv/homegpu/work/code/job/_homegpu/bootstrap.py", False),
    ("_homegpu/homegpu/trainer/__main__.py", False),
])
def test_whose_file_a_frame_is_in(path, users):
    assert is_user_file(path) is users


@pytest.mark.parametrize("code_dir, where", [
    ("/a/code", "src/model.py:6"),
    ("/a/code/", "src/model.py:6"),
    ("/b/code", "model.py:6"),  # not in the code dir (or it is not known): the basename
    ("", "model.py:6"),
])
def test_a_frame_is_named_relative_to_the_code_dir_else_by_basename(code_dir, where):
    assert Frame("/a/code/src/model.py", 6).where(code_dir) == where


TORCHRUN_LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/root/.homegpu/code/ddp/multinode.py", line 65, in _run_batch
[rank0]:     loss.backward()
[rank0]: RuntimeError: Connection closed by peer [10.213.0.3]:47845. This is typically caused by a remote worker crashing.
E1126 18:24:21.505000 26982 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 386, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/root/.homegpu/code/ddp/multinode.py FAILED
""".splitlines()


def test_under_torchrun_the_process_own_traceback_is_the_last_not_torchruns():
    traceback = read_traceback(TORCHRUN_LOG)
    assert traceback.exception.startswith("RuntimeError: Connection closed by peer")
    assert traceback.place("/root/.homegpu/code/ddp") == "multinode.py:65"
    assert read_traceback(TORCHRUN_LOG[4:]) is None  # torchrun's alone says nothing of the process
