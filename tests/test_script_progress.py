"""ScriptProgress: a script's own epoch lines and tqdm bars as progress events, and where LineClassifier
reads them (only from a log that has shown no protocol line and no Keras output)."""

from __future__ import annotations

import pytest

from homegpu.remote.jobs.failure import shows_progress
from homegpu.remote.logs.classify import LineClassifier
from homegpu.remote.logs.script_progress import EpochNumbers, ScriptProgress

# line -> the event a fresh reader makes of it (pytorch/examples, the DDP tutorial, tqdm's own formats)
ONE_LINE = [
    ("Epoch [3/10], Loss: 0.2345", {"event": "epoch", "epoch": 3, "epochs": 10, "loss": 0.2345}),
    ("epoch 3 of 10 - loss=0.5 - acc=0.9", {"event": "epoch", "epoch": 3, "epochs": 10, "loss": 0.5, "acc": 0.9}),
    ("[GPU0] Epoch 3 | Batchsize: 32 | Steps: 64 | Loss 0.2345",
     {"event": "epoch", "epoch": 3, "epochs": None, "batchsize": 32.0, "loss": 0.2345}),
    ("Epoch [1/5], Step [100/600], Loss: 2.2323",
     {"event": "step", "epoch": 1, "step": 100, "steps": 600, "loss": 2.2323}),
    ("Train Epoch: 1 [640/60000 (1%)]\tLoss: 2.299823",
     {"event": "step", "epoch": 1, "step": 640, "steps": 60000, "loss": 2.299823}),
    ("Epoch 3:  45%|████▌     | 45/100 [00:02<00:01, 20.10it/s, loss=0.234]",
     {"event": "step", "epoch": 3, "step": 45, "steps": 100, "loss": 0.234, "steps_per_sec": 20.1}),
    ("Epoch 3/10: 100%|██████████| 100/100 [00:05<00:00, 19.9it/s, loss=0.2]",
     {"event": "epoch", "epoch": 3, "epochs": 10, "steps": 100, "loss": 0.2, "steps_per_sec": 19.9}),
    ("100%|██████████| 100/100 [00:05<00:00, 19.9it/s]", {"event": "step", "step": 100, "steps": 100,
                                                          "steps_per_sec": 19.9}),
    ("Training: 100%|##########| 50/50 [00:10<00:00,  4.85batch/s, train_loss=0.112, val acc=nan]",
     {"event": "step", "step": 50, "steps": 50, "train_loss": 0.112, "val_acc": None, "steps_per_sec": 4.85}),
    (" 10%|█         | 1/10 [00:02<00:18,  2.00s/it]", {"event": "step", "step": 1, "steps": 10, "steps_per_sec": 0.5}),
    ("  5%|▌         | 5/100 [00:00<?, ?it/s]", {"event": "step", "step": 5, "steps": 100}),
    ("Epoch 3/10", {"event": "start", "epochs": 10, "initial_epoch": 2, "resumed": True}),
    # text, not progress
    ("Resuming training from snapshot at Epoch 3", None),
    ("epochs: 5", None),
    ("Saved the model after epoch 3, loss 0.2", None),
    ("HOMEGPU_METRIC is not this", None),
]


@pytest.mark.parametrize("line, event", ONE_LINE, ids=[line[:40] for line, _ in ONE_LINE])
def test_one_line(line, event):
    assert ScriptProgress().feed(line) == event


def feed(lines: list[str]) -> list[dict | None]:
    progress = ScriptProgress()
    return [progress.feed(line) for line in lines]


def test_bare_epoch_headers_say_the_previous_epoch_is_done_once():
    """The tutorial's own lines: an epoch's start, repeated by a second line (its snapshot), not a summary.
    It counts from 0: its `Epoch 0` is the first epoch, its `Epoch 1` header says that one is done."""
    events = feed(["[GPU0] Epoch 0 | Batchsize: 32 | Steps: 64", "Epoch 0 | Training snapshot saved at snapshot.pt",
                   "[GPU0] Epoch 1 | Batchsize: 32 | Steps: 64", "Epoch 1 | Training snapshot saved at snapshot.pt",
                   "[GPU0] Epoch 2 | Batchsize: 32 | Steps: 64"])
    assert events == [{"event": "start", "epochs": None, "initial_epoch": 0, "resumed": False}, None,
                      {"event": "epoch", "epoch": 1, "epochs": None}, None, {"event": "epoch", "epoch": 2, "epochs": None}]


def test_once_epoch_lines_carry_figures_bare_ones_say_nothing():
    events = feed(["[GPU0] Epoch 0 | Loss 0.5", "Epoch 0 | Training snapshot saved", "[GPU0] Epoch 1 | Loss 0.3",
                   "Epoch 1 | Training snapshot saved"])
    assert [event and event["event"] for event in events] == ["epoch", None, "epoch", None]
    assert [event["epoch"] for event in events if event] == [1, 2]


# (lines, the epochs their "epoch" events say): a script counting from 0 and one counting from 1 both read 1, 2, 3
NUMBERED = [
    ([f"[GPU0] Epoch {n} | Batchsize: 32 | Steps: 64 | loss {loss}" for n, loss in enumerate((0.1605, 0.09, 0.05))],
     [1, 2, 3]),
    (["Epoch [1/3], Loss: 0.5", "Epoch [2/3], Loss: 0.4", "Epoch [3/3], Loss: 0.3"], [1, 2, 3]),
    (["Epoch 0: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.9]",
      "Epoch 1: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.8]",
      "Epoch 2: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.7]"], [1, 2, 3]),
    (["Epoch 1/3", "Epoch 1: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.9]", "Epoch 2/3",
      "Epoch 2: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.8]", "Epoch 3/3",
      "Epoch 3: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.7]"], [1, 2, 3]),
]


@pytest.mark.parametrize("lines, epochs", NUMBERED, ids=["tutorial from 0", "from 1", "bars from 0", "bars from 1"])
def test_epochs_read_as_the_script_numbers_them(lines, epochs):
    """The DDP tutorial's `Epoch 0` is the first epoch: a run of its epochs 0..2 has done 3, as `Epoch [1/3]` to
    `[3/3]` of a script that counts from 1 has (the summary's EPOCHS column and `epoch N/?` show the last)."""
    assert [event["epoch"] for event in feed(lines) if event and event["event"] == "epoch"] == epochs


def test_a_step_of_a_script_counting_from_0_is_in_epoch_1():
    events = feed(["Epoch 0:  45%|████▌     | 45/100 [00:02<00:01, 20.10it/s, loss=0.234]",
                   "Epoch [0/5], Step [100/600], Loss: 2.2323"])
    assert [event["epoch"] for event in events] == [1, 1]


def test_a_resumed_generation_counts_as_the_first_one_did():
    """The run's first generation said the script counts from 0; its next one resumes with `Epoch 3` (three
    done), which alone would read as a count from 1."""
    numbers = EpochNumbers()
    first = ScriptProgress(numbers)
    assert [first.feed(f"[GPU0] Epoch {n} | Loss 0.5")["epoch"] for n in range(3)] == [1, 2, 3]
    resumed = ScriptProgress(numbers)
    assert resumed.feed("Resuming training from snapshot at Epoch 3") is None
    assert resumed.feed("[GPU0] Epoch 3 | Batchsize: 32 | Steps: 64") == {
        "event": "start", "epochs": None, "initial_epoch": 3, "resumed": True}
    assert resumed.feed("[GPU0] Epoch 4 | Batchsize: 32 | Steps: 64") == {"event": "epoch", "epoch": 4, "epochs": None}
    assert ScriptProgress().feed("[GPU0] Epoch 3 | Loss 0.5")["epoch"] == 3  # a fresh reader: a count from 1


def classified(lines: list[str]) -> list[str | None]:
    classifier = LineClassifier()
    return [(metric.event if (metric := classifier.classify(line)) else None) for line in lines]


def test_keras_output_is_read_as_keras_not_twice():
    lines = ["Epoch 1/2", "40/40 [====] - 3s 81ms/step - loss: 0.0045 - accuracy: 1.0000",
             "Epoch 2/2", "40/40 [====] - 3s 81ms/step - loss: 0.0040 - accuracy: 1.0000"]
    assert classified(lines) == ["start", "epoch", None, "epoch"]


def test_a_protocol_line_silences_the_scripts_own_lines():
    lines = ["Epoch [1/5], Loss: 0.5", 'HOMEGPU_METRIC {"event": "epoch", "epoch": 1}', "Epoch [2/5], Loss: 0.4"]
    assert classified(lines) == ["epoch", "epoch", None]


def test_an_epoch_done_by_its_bar_is_not_done_again_by_the_next_header():
    lines = ["Epoch 1/3", "Epoch 1: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.9]", "Epoch 2/3",
             "Epoch 2: 100%|██████████| 10/10 [00:01<00:00, 9.1it/s, loss=0.8]"]
    assert classified(lines) == ["start", "epoch", None, "epoch"]


@pytest.mark.parametrize("line, progressed", [
    ("[GPU1] Epoch 4 | Batchsize: 32 | Steps: 64 | Loss 0.0123", True),
    ("Epoch 3:  45%|████▌     | 45/100 [00:02<00:01, 20.10it/s]", True),
    ("Epoch 1/3", False),
    ("Resuming training from snapshot at Epoch 3", False),
])
def test_a_scripts_own_lines_prove_it_trained(line, progressed):
    assert shows_progress(line) is progressed
