"""ConsoleLines: raw console bytes to the lines a terminal would finally show.

Table tests for the terminal model, every split of the input, a 50 MB line without a newline, and
the real Keras output recorded in tests/fixtures/keras/ (README.md there says how).
"""

from __future__ import annotations

import json
import pathlib
import tracemalloc

import pytest

from homegpu.remote.logs.console import MAX_LINE, ConsoleLines

KERAS = pathlib.Path(__file__).parent / "fixtures" / "keras"
RECORDINGS = sorted(KERAS.glob("*.txt"))


def replay(data: bytes, chunk: int | None = None, **kwargs) -> list[str]:
    """All lines of `data` fed in pieces of `chunk` bytes (all at once when None), then flushed."""
    console = ConsoleLines(**kwargs)
    step = chunk or max(1, len(data))
    lines = []
    for start in range(0, len(data), step):
        lines += console.feed(data[start:start + step])
    return lines + console.flush()


@pytest.mark.parametrize("data, lines", [
    (b"", []),
    (b"one\ntwo\n", ["one", "two"]),
    (b"no newline at the end", ["no newline at the end"]),
    (b"\n\n", ["", ""]),
    (b"windows\r\nline\r\n", ["windows", "line"]),
    (b"10%\r50%\r100%\n", ["100%"]),
    (b"long text\rshort\n", ["shorttext"]),  # a terminal overwrites, it does not erase
    (b"abc\b\bXY\n", ["aXY"]),
    (b"\b\b\bstart\n", ["start"]),  # backspace stops at the line's start
    (b"bar 1/3    \b\b\b\b\b\b\b\b\b\b\b\rbar 3/3\n", ["bar 3/3"]),
    (b"padded   \n", ["padded"]),
    (b"tab\there\n", ["tab\there"]),
    (b"\x1b[1m\x1b[32mgreen bold\x1b[0m text\n", ["green bold text"]),
    (b"progress 10%\x1b[2K\rprogress 99%\n", ["progress 99%"]),
    (b"erase tail\x1b[5D\x1b[K\n", ["erase"]),
    (b"xxxxxx\x1b[3Gab\n", ["xxabxx"]),
    (b"a\x1b[3Cb\n", ["a   b"]),
    (b"\x1b]0;window title\x07visible\n", ["visible"]),
    (b"up\x1b[Aand on\n", ["upand on"]),
    (b"\x1b[1mbold\x1b(B\x1b[m plain\n", ["bold plain"]),  # tput bold, tput sgr0
    (b"\x1b[?25lhidden cursor\x1b[?25h\n", ["hidden cursor"]),
    (b"bad \x1b[12\nescape\n", ["bad [12", "escape"]),
    (b"bell\x07 and nul\x00 dropped\n", ["bell and nul dropped"]),
    (b"caf\xc3\xa9 \xe2\x94\x81\n", ["café ━"]),
    (b"bad \xff\xfe bytes\n", ["bad \ufffd\ufffd bytes"]),
    (b"cut \xe2\x94\n", ["cut \ufffd"]),
    (b"tail \xe2\x94", ["tail \ufffd"]),
])
def test_lines_as_a_terminal_shows_them(data: bytes, lines: list[str]) -> None:
    assert replay(data) == lines


@pytest.mark.parametrize("data", [
    b"caf\xc3\xa9 \xe2\x94\x81\x1b[32mgreen\x1b[0m\r\nnext\rNEXT\b!\n\x1b]0;t\x07end",
    b"\xf0\x9f\x98\x80 four-byte \xff\n\x1b[1m 1/40\x1b[0m\b\b\b\b\r\x1b[1m40/40\x1b[0m\n",
    b"\x1b(B\x1b[m\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \x1b[?25l\x1b[2Kdone\x1b[K\n",
])
def test_any_split_gives_the_same_lines(data: bytes) -> None:
    whole = replay(data)
    for size in range(1, 8):
        assert replay(data, size) == whole, f"chunks of {size} bytes"
    for cut in range(1, len(data)):
        console = ConsoleLines()
        assert console.feed(data[:cut]) + console.feed(data[cut:]) + console.flush() == whole, f"cut at {cut}"


def test_consumed_counts_complete_lines_only() -> None:
    console = ConsoleLines()
    assert console.feed(b"first\nsec") == ["first"]
    assert console.consumed == len(b"first\n")
    assert console.partial == "sec"
    assert console.feed(b"ond \xe2\x94") == []
    assert console.consumed == len(b"first\n")
    assert console.feed(b"\x81\r\nthird") == ["second ━"]
    assert console.consumed == len(b"first\nsecond \xe2\x94\x81\r\n")
    assert console.flush() == ["third"]
    assert console.consumed == len(b"first\nsecond \xe2\x94\x81\r\nthird")
    assert console.flush() == []


def test_rewind_re_reads_the_unfinished_line_from_consumed() -> None:
    console = ConsoleLines()
    data = b"done\n\x1b[1mhalf a li\xe2\x94"
    assert console.feed(data) == ["done"]
    console.rewind()  # the tail dropped; it resumes at byte `consumed`
    assert console.partial == ""
    assert console.feed(data[console.consumed:] + b"\x81ne\x1b[0m\n") == ["half a li━ne"]
    assert console.consumed == len(data + b"\x81ne\x1b[0m\n")
    assert console.flush() == []


def test_partial_shows_the_current_redraw() -> None:
    console = ConsoleLines()
    assert console.feed(b"Epoch 1/3\n 1/40 [..]\b\b\b\b\b\b\b\b\b\b\r20/40 [=.]") == ["Epoch 1/3"]
    assert console.partial == "20/40 [=.]"


def test_a_long_line_is_cut_with_a_marker() -> None:
    [line] = replay(b"x" * 150 + b"\n", max_line=100)
    assert line == "x" * 100 + " … [50 characters cut: line longer than 100]"
    assert replay(b"y" * 150 + b"\rshort\n", max_line=100)[0].startswith("short" + "y" * 95 + " … [50 ")
    assert replay(b"z" * 150 + b"\r\x1b[Kshort\n", max_line=100) == ["short"]  # erased: nothing cut


def test_a_50_mb_line_without_newline_stays_bounded() -> None:
    chunk = b"0123456789abcdef" * 4096  # 64 KiB, as a tail would deliver it
    total = 800 * len(chunk)  # 50 MiB, no newline
    console = ConsoleLines()
    tracemalloc.start()
    try:
        for _ in range(800):
            assert console.feed(chunk) == []
        assert console.consumed == 0
        [line] = console.flush()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert line.startswith("0123456789abcdef" * 16)
    assert len(line) < MAX_LINE + 100
    assert line.endswith(f" … [{total - MAX_LINE} characters cut: line longer than {MAX_LINE}]")
    assert console.consumed == total
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes while reading a {total}-byte line"


def test_many_progress_redraws_stay_bounded() -> None:
    redraws = b"".join(b"\b" * 40 + b"\r%5d/99999 [" % step + b"=" * 20 + b"]" for step in range(99_999))
    lines = replay(redraws + b"\n", 65536)
    assert lines == ["99998/99999 [====================]"]


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda path: path.stem)
def test_keras_progress_bars_collapse_to_one_line_per_epoch(recording: pathlib.Path) -> None:
    data = recording.read_bytes()
    lines = replay(data, 13)  # chunks that split lines, escapes and UTF-8 sequences
    assert lines == replay(data)
    assert max(len(line) for line in lines) < 1000
    assert not any(control in line for line in lines for control in "\r\b\x1b")
    epochs = [line for line in lines if line.startswith("Epoch ")]
    total = int(epochs[0].split("/")[1])
    assert epochs == [f"Epoch {n}/{total}" for n in range(1, total + 1)]
    if "verbose2" not in recording.name:  # a bar redrawn more than once per epoch, collapsed
        assert data.count(b"\r") > total + 1
    for epoch_line in epochs:  # the line after each epoch's header is its summary, alone
        summary = lines[lines.index(epoch_line) + 1]
        assert summary.startswith("40/40 ") and " - val_loss: " in summary, summary
        assert summary.count("/step") == 1
    assert lines[-2].startswith("evaluate: loss ")


def test_the_recorded_progress_bar_is_written_to_stdout_in_one_write_per_redraw() -> None:
    """What record.py saw: the bar goes to stdout, each redraw one piece that begins with the
    backspaces over the previous one and a carriage return (TensorFlow logs to stderr)."""
    data = (KERAS / "tf_keras_mwms_default.txt").read_bytes()
    chunks = json.loads((KERAS / "tf_keras_mwms_default.chunks.json").read_text())
    offset, pieces = 0, []
    for stream, length in chunks:
        pieces.append((stream, data[offset:offset + length]))
        offset += length
    assert offset == len(data)
    redraws = [(stream, piece) for stream, piece in pieces if b"\r" in piece]
    assert redraws and all(stream == "stdout" for stream, _ in redraws)
    assert all(piece.lstrip(b"\b").startswith(b"\r") for _, piece in redraws)
    assert any(stream == "stderr" and b"cuInit" in piece for stream, piece in pieces)
