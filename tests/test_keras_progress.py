"""KerasProgress: metric events from what Keras prints, on table lines and on real recordings.

Recordings and how they were made: tests/fixtures/keras/README.md.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from homegpu.remote.logs.console import ConsoleLines
from homegpu.remote.logs.keras_progress import KerasProgress

KERAS = pathlib.Path(__file__).parent / "fixtures" / "keras"
RECORDINGS = sorted(KERAS.glob("*.txt"))


def events(lines: list[str], **kwargs) -> list[dict]:
    progress = KerasProgress(**kwargs)
    return [event for event in map(progress.feed, lines) if event is not None]


def recorded_lines(recording: pathlib.Path) -> list[str]:
    console = ConsoleLines()
    return console.feed(recording.read_bytes()) + console.flush()


def test_an_epoch_of_tf_keras() -> None:
    assert events(["Epoch 3/12",
                   "40/40 [==============================] - 3s 81ms/step - loss: 0.0045 - accuracy: 1.0000"
                   " - val_loss: 0.0100 - val_accuracy: 0.9900"], batch_size=64) == [
        {"event": "start", "epochs": 12, "initial_epoch": 2, "resumed": True},
        {"event": "epoch", "epoch": 3, "epochs": 12, "loss": 0.0045, "accuracy": 1.0, "val_loss": 0.01,
         "val_accuracy": 0.99, "seconds": 3.0, "ms_per_step": 81.0, "steps_per_sec": 12.35,
         "examples_per_sec": 790.1, "steps": 40},
    ]


def test_an_epoch_of_keras_3_and_of_verbose_2() -> None:
    keras3 = events(["Epoch 1/2", "40/40 ━━━━━━━━━━━━━━━━━━━━ 2s 500us/step - accuracy: 0.5000 - loss: 0.6931"])
    assert keras3[1] == {"event": "epoch", "epoch": 1, "epochs": 2, "accuracy": 0.5, "loss": 0.6931,
                         "seconds": 2.0, "ms_per_step": 0.5, "steps_per_sec": 2000.0, "steps": 40}
    verbose2 = events(["Epoch 1/2", "40/40 - 5s - loss: 0.6931 - 4512ms/epoch - 2s/step"])
    assert verbose2[1] == {"event": "epoch", "epoch": 1, "epochs": 2, "loss": 0.6931, "seconds": 4.512,
                           "ms_per_step": 2000.0, "steps_per_sec": 0.5, "steps": 40}


def test_later_epochs_continue_and_a_second_fit_starts_again() -> None:
    summary = "2/2 [==============================] - 0s 5ms/step - loss: 0.5000"
    got = events(["Epoch 1/2", summary, "Epoch 2/2", summary, "Epoch 1/5", summary])
    assert [(e["event"], e.get("epoch"), e.get("epochs")) for e in got] == [
        ("start", None, 2), ("epoch", 1, 2), ("epoch", 2, 2), ("start", None, 5), ("epoch", 1, 5)]


def test_unfinished_bars_are_steps_and_bars_outside_fit_are_evaluate() -> None:
    got = events([
        " 12/40 [=========>....................] - ETA: 1s - loss: 0.0101 - accuracy: 0.9800",  # before fit
        "Epoch 1/1",
        " 12/40 [=========>....................] - ETA: 1s - loss: 0.0101 - accuracy: 0.9800",
        "     10/Unknown - 1s 6ms/step - loss: 0.6609 - accuracy: 0.6281",
        "12/40 ━━━━━━━━━━━━━━━━━━━━ 3s 9ms/step - accuracy: 0.9000 - loss: 0.2000",
        "40/40 [==============================] - 1s 9ms/step - loss: nan - accuracy: 0.5000",
        "16/16 [==============================] - 0s 2ms/step - loss: 0.1520 - accuracy: 0.9805",
        "16/16 [==============================] - 0s 2ms/step",  # predict(): no metrics
    ])
    assert got[1:] == [
        {"event": "step", "epoch": 1, "step": 12, "loss": 0.0101, "accuracy": 0.98},
        {"event": "step", "epoch": 1, "step": 10, "loss": 0.6609, "accuracy": 0.6281, "ms_per_step": 6.0,
         "steps_per_sec": 166.67},
        {"event": "step", "epoch": 1, "step": 12, "accuracy": 0.9, "loss": 0.2, "ms_per_step": 9.0,
         "steps_per_sec": 111.11},
        {"event": "epoch", "epoch": 1, "epochs": 1, "loss": None, "accuracy": 0.5, "seconds": 1.0,
         "ms_per_step": 9.0, "steps_per_sec": 111.11, "steps": 40},
        {"event": "evaluate", "loss": 0.152, "accuracy": 0.9805, "seconds": 0.0, "ms_per_step": 2.0,
         "steps_per_sec": 500.0, "steps": 16},
    ]
    assert got[0]["event"] == "start"


@pytest.mark.parametrize("line", [
    "", "Epoch 3/12 done", "epoch 3/12", "1/2 of the files copied", "3/4 - half: way",
    'HOMEGPU_METRIC {"event":"epoch","epoch":1}', "40/40 [=====] no dash", "Epoch 1/3\r40/40",
])
def test_other_lines_are_not_events(line: str) -> None:
    progress = KerasProgress()
    progress.feed("Epoch 1/3")
    assert progress.feed(line) is None


def test_end_repeats_the_last_epoch() -> None:
    progress = KerasProgress(batch_size=8)
    assert progress.end() is None
    progress.feed("Epoch 1/1")
    progress.feed("4/4 [==============================] - 1s 10ms/step - loss: 0.2500 - accuracy: 0.7500")
    assert progress.end() == {"event": "end", "epoch": 1, "epochs": 1, "loss": 0.25, "accuracy": 0.75}


def _last_redraw_figures(data: bytes) -> list[dict[str, float]]:
    """Independently of ConsoleLines: for every raw line with a step time, the metrics of its last
    redraw (the text after its last carriage return), ANSI codes removed."""
    figures = []
    for raw in data.split(b"\n"):
        text = re.sub(r"\x1b\[[0-9;]*m", "", raw.decode("utf-8").rsplit("\r", 1)[-1])
        if "/step" in text:
            figures.append({name: float(value) for name, value in re.findall(r"(\w+): ([0-9.]+)", text)})
    return figures


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda path: path.stem)
def test_recorded_epochs_give_the_last_printed_figures(recording: pathlib.Path) -> None:
    lines = recorded_lines(recording)
    got = events(lines, batch_size=32)
    headers = [line for line in lines if line.startswith("Epoch ")]
    total = len(headers)
    assert [e["event"] for e in got] == ["start"] + ["epoch"] * total + ["evaluate"]
    assert got[0] == {"event": "start", "epochs": total, "initial_epoch": 0, "resumed": False}
    *printed_epochs, printed_evaluate = _last_redraw_figures(recording.read_bytes())
    assert len(printed_epochs) == total
    for number, (event, printed) in enumerate(zip(got[1:-1], printed_epochs), start=1):
        assert event["epoch"] == number and event["epochs"] == total and event["steps"] == 40
        assert set(printed) == {"loss", "accuracy", "val_loss", "val_accuracy"}
        assert {key: event[key] for key in printed} == printed
        assert event["seconds"] >= 0 and event["ms_per_step"] > 0
        assert event["steps_per_sec"] == round(1000 / event["ms_per_step"], 2)
        assert event["examples_per_sec"] == round(32 * 1000 / event["ms_per_step"], 1)
    evaluate = got[-1]
    assert {key: evaluate[key] for key in printed_evaluate} == printed_evaluate
    said = re.search(r"evaluate: loss ([0-9.]+) accuracy ([0-9.]+)", "\n".join(lines))  # the script's own print
    assert (evaluate["loss"], evaluate["accuracy"]) == (float(said.group(1)), float(said.group(2)))


def test_two_recorded_workers_print_the_same_global_figures() -> None:
    """Under MultiWorkerMirroredStrategy each worker prints the epoch's global loss and accuracy;
    only the times are its own."""
    chief, other = (events(recorded_lines(KERAS / f"tf_keras_mwms_two_workers_w{i}.txt")) for i in (0, 1))
    figures = ("epoch", "epochs", "loss", "accuracy", "val_loss", "val_accuracy", "steps")
    assert [e["event"] for e in chief] == [e["event"] for e in other]
    for mine, theirs in zip(chief, other):
        if mine["event"] == "epoch":
            assert {k: mine[k] for k in figures} == {k: theirs[k] for k in figures}


def test_live_steps_from_the_unfinished_line_of_a_recording() -> None:
    """Fed in the pieces the recording arrived in, the console's unfinished line (`partial`) gives
    step events while an epoch runs; the completed lines give the epochs."""
    recording = KERAS / "tf_keras_mwms_default"
    data = recording.with_suffix(".txt").read_bytes()
    pieces = json.loads(recording.with_suffix(".chunks.json").read_text())
    console, progress, got, offset = ConsoleLines(), KerasProgress(), [], 0
    for _, length in pieces:
        for line in console.feed(data[offset:offset + length]):
            got.append(progress.feed(line))
        offset += length
        got.append(progress.feed(console.partial))
    got = [event for event in got if event is not None]
    steps = [(e["epoch"], e["step"]) for e in got if e["event"] == "step"]
    assert {epoch for epoch, _ in steps} == {1, 2, 3}
    assert steps == sorted(steps) and all(0 < step <= 40 for _, step in steps)
    assert [e["epoch"] for e in got if e["event"] == "epoch"] == [1, 2, 3]


def test_an_accuracy_is_found_under_the_name_of_the_metric_that_was_compiled():
    """keras.io's scripts compile keras.metrics.SparseCategoricalAccuracy(), which Keras prints by its own name."""
    from homegpu.remote.events import Metric
    line = ("63/63 - 1s - loss: 1.4584 - sparse_categorical_accuracy: 0.6295 - val_loss: 1.4700 - "
            "val_sparse_categorical_accuracy: 0.5790 - 1s/epoch - 22ms/step")
    progress = KerasProgress()
    progress.feed("Epoch 3/4")
    metric = Metric(progress.feed(line))
    assert (metric.accuracy, metric.val_accuracy) == (0.6295, 0.5790)
    assert metric.figures() == {"loss": 1.4584, "accuracy": 0.6295, "val_loss": 1.47, "val_accuracy": 0.579}
    assert Metric({"loss": 1.0}).figures() == {"loss": 1.0, "accuracy": None}
