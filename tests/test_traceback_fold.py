"""remote/logs/traceback_fold.py: each traceback shown once and bounded, line by line as the lines stream.

The workers' output is real Python output (tests/script_errors.py): two workers in their own folders
raise the same ValueError with a 300-line message of their own values, their lines interleaved as
they arrive at a front end.
"""

from __future__ import annotations

import itertools

from script_errors import VALUES, per_replica_error

from homegpu.remote.logs.traceback_fold import FRAME_BUDGET, TracebackFold
from homegpu.remote.logs.tracebacks import MESSAGE_LINES, TRACEBACK_HEADER


def interleaved(*outputs: tuple[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """(worker, line) of each worker's lines, taken in turn."""
    rows = itertools.zip_longest(*([(worker, line) for line in lines] for worker, lines in outputs))
    return [pair for row in rows for pair in row if pair is not None]


def shown(fold: TracebackFold, lines: list[tuple[str, str]], finish: bool = True) -> list[tuple[str, str]]:
    out = [(worker, text) for worker, line in lines for text in fold.feed(worker, line)]
    return out + (fold.finish() if finish else [])


def test_the_same_long_traceback_on_two_workers_is_shown_once_bounded(tmp_path):
    (_, n0), (_, n1) = per_replica_error(tmp_path, 0), per_replica_error(tmp_path, 1)
    fold = TracebackFold(lambda worker: f"experiments/run-1/logs/{worker}.log")
    out = shown(fold, interleaved(("n0", n0), ("n1", n1)))
    text = [line for _, line in out]
    assert len(n0) + len(n1) > 2 * VALUES and len(out) < 25
    assert text.count(TRACEBACK_HEADER) == 1 and ("n0", "building the model") in out
    assert ("n1", "the same ValueError at model.py:6 as n0 (whole in experiments/run-1/logs/n1.log)") in out
    mine = [line for worker, line in out if worker == "n0"]
    values = [line for line in mine if "tf.Tensor" in line]
    assert len(values) == MESSAGE_LINES and values[0].endswith("numpy=0.0>")
    assert f"… {VALUES - MESSAGE_LINES} lines cut (whole in experiments/run-1/logs/n0.log)" in mine
    assert mine[mine.index(TRACEBACK_HEADER) + 7] == "ValueError: Attempt to convert a value (PerReplica:{"
    last = mine.index(f"… {VALUES - MESSAGE_LINES} lines cut (whole in experiments/run-1/logs/n0.log)") + 1
    assert mine[last].endswith("to a Tensor.")
    assert mine[last + 1].startswith("↳ Keras 3 under MultiWorkerMirroredStrategy; fix: write `import tf_keras")
    assert mine[last + 2] == n0[-1]  # TensorFlow's line at exit ended the message
    assert [line for worker, line in out if worker == "n1"] == [
        "building the model", "the same ValueError at model.py:6 as n0 (whole in experiments/run-1/logs/n1.log)",
        n1[-1]]


def test_errors_from_different_places_are_each_shown(tmp_path):
    (_, n0), (_, n1) = per_replica_error(tmp_path, 0, 3), per_replica_error(tmp_path, 1, 3, place="elsewhere")
    out = shown(TracebackFold(), interleaved(("n0", n0), ("n1", n1)))
    assert [worker for worker, line in out if line == TRACEBACK_HEADER] == ["n0", "n1"]
    assert not any("the same" in line for _, line in out)
    assert len(out) == len(n0) + len(n1) + 2  # short messages: every line, and each one's known cause


def test_lines_stream_through_at_once_and_a_traceback_as_soon_as_its_exception_line_comes():
    fold = TracebackFold()
    assert fold.feed("n0", "loading data") == ["loading data"]
    assert fold.feed("n0", TRACEBACK_HEADER) == []
    assert fold.feed("n0", '  File "/w/train.py", line 9, in <module>') == []
    assert fold.feed("n1", "n1 goes on meanwhile") == ["n1 goes on meanwhile"]
    assert fold.feed("n0", "    fit()") == []
    assert fold.feed("n0", "RuntimeError: boom") == [
        TRACEBACK_HEADER, '  File "/w/train.py", line 9, in <module>', "    fit()", "RuntimeError: boom"]
    assert fold.feed("n0", "and a second line") == ["and a second line"]
    assert fold.feed("n0", "Epoch 1/2") == ["Epoch 1/2"]  # the message is over: plain lines again
    assert fold.feed("n0", "after") == ["after"]
    assert fold.finish() == []


def test_a_pause_counts_what_was_cut_so_far_and_later_lines_afresh():
    fold = TracebackFold()
    head = [TRACEBACK_HEADER, '  File "/w/train.py", line 9, in <module>', "ValueError: long"]
    message = [f"line {i}" for i in range(20)]
    out = [line for text in head + message[:12] for line in fold.feed("n0", text)]
    assert out[-MESSAGE_LINES:] == message[:MESSAGE_LINES]
    assert fold.pause() == [("n0", "… 6 lines cut (whole in logs/n0.log)"), ("n0", "line 11")]
    assert [line for text in message[12:] for line in fold.feed("n0", text)] == []
    assert fold.finish() == [("n0", "… 7 lines cut (whole in logs/n0.log)"), ("n0", "line 19")]
    assert fold.feed("n0", "the next generation") == ["the next generation"]


def test_a_metric_line_ends_the_message():
    fold = TracebackFold()
    for text in (TRACEBACK_HEADER, '  File "/w/train.py", line 9, in <module>', "ValueError: x", *"abcdefgh"):
        fold.feed("n0", text)
    assert fold.end("n0") == ["… 2 lines cut (whole in logs/n0.log)", "h"]
    assert fold.feed("n0", "i") == ["i"] and fold.end("n7") == []


def test_the_same_worker_repeating_its_traceback_says_so_in_one_line():
    fold = TracebackFold()
    error = (TRACEBACK_HEADER, '  File "/w/train.py", line 9, in <module>', "ModuleNotFoundError: No module named 'x'")
    first = shown(fold, [("n0", line) for line in error])
    again = shown(fold, [("n0", line) for line in error])
    assert [line for _, line in first][:3] == list(error)
    assert first[-1] == ("n0", "↳ no module x where the worker runs; fix: install x in the node's python "
                               "(or the job's Docker image)")
    assert again == [("n0", "the same ModuleNotFoundError at train.py:9 as before (whole in logs/n0.log)")]


def test_a_repeated_chain_of_tracebacks_is_one_line():
    chain = (TRACEBACK_HEADER, '  File "/{w}/train.py", line 3, in load', '    {{}}["weights"]', "KeyError: 'weights'",
             "", "During handling of the above exception, another exception occurred:", "", TRACEBACK_HEADER,
             '  File "/{w}/train.py", line 5, in load', "ValueError: the checkpoint has no weights")
    fold = TracebackFold()
    n0 = shown(fold, [("n0", line.format(w="a")) for line in chain])
    n1 = shown(fold, [("n1", line.format(w="b")) for line in chain])
    assert [line for _, line in n0] == [line.format(w="a") for line in chain]
    assert n1 == [("n1", "the same KeyError at train.py:3 as n0 (whole in logs/n1.log)")]


def test_a_deep_traceback_shows_a_bounded_number_of_frames():
    frames = [line for n in range(500) for line in (f'  File "/w/train.py", line {n + 1}, in f{n}', f"    f{n + 1}()")]
    fold = TracebackFold()
    out = [line for text in (TRACEBACK_HEADER, *frames, "RecursionError: too deep") for line in fold.feed("n0", text)]
    assert len(out) == FRAME_BUDGET + 2 and out[1] == f"  ... ({len(frames) - FRAME_BUDGET + 1} lines left out)"
    assert out[-2] == "    f500()" and out[-1] == "RecursionError: too deep"


def test_an_unfinished_traceback_is_shown_as_it_was_when_the_logs_end():
    fold = TracebackFold()
    for text in (TRACEBACK_HEADER, '  File "/w/train.py", line 9, in <module>'):
        assert fold.feed("n0", text) == []
    assert fold.finish() == [("n0", TRACEBACK_HEADER), ("n0", '  File "/w/train.py", line 9, in <module>')]
