"""What `run --no-tui` prints for the events it gets: each epoch once, nodes back online, no TF noise."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from homegpu.remote.config.job_spec import JobSpec
from homegpu.remote.jobs.outputs import FetchedOutputs, plan_fetch
from homegpu.remote.jobs.run import RunOutcome
from homegpu.remote.logs.classify import LineClassifier
from homegpu.remote.logs.console import ConsoleLines
from homegpu.remote.logs.metric import Metric, WorkerMetric
from homegpu.remote.logs.tail import LogLine
from homegpu.remote.nodes.events import EventHub, JobState, NodeState, NodeStateChanged, Straggler
from homegpu.remote.runtimes.base import WorkerStatus
from homegpu.tui.headless import LinePrinter, Pump, record_line, summary

KERAS = Path(__file__).parent / "fixtures" / "keras"


def printed(events) -> list[str]:
    out = io.StringIO()
    printer = LinePrinter(JobSpec(name="demo"), out)
    for event in events:
        printer.show(event)
    return out.getvalue().splitlines()


def log(text: str, worker: str = "n1") -> LogLine:
    return LogLine("n1", "x.log", 1, text, worker)


def test_an_epoch_is_printed_once_per_worker_with_its_val_figures():
    epoch = {"event": "epoch", "epoch": 1, "epochs": 2, "loss": 0.5, "accuracy": 0.9, "val_loss": 0.4,
             "val_accuracy": 0.95, "examples_per_sec": 1000.0}
    lines = printed([WorkerMetric("demo", "r", "n1", 0, Metric(epoch)),
                     log("epoch 1/2  loss 0.5000  accuracy 0.9000  (2.0 s, 1000 examples/s on this worker)"),
                     log("a line of the script's own")])
    assert lines == ["      n1 * epoch 1/2  loss 0.5000  accuracy 0.9000  val_loss 0.4000  val_accuracy 0.9500  "
                     "1000 examples/s", "      n1 | a line of the script's own"]


def test_a_node_back_online_is_said_once_and_offline_repeats_are_not():
    down = NodeStateChanged("n2", NodeState.OFFLINE, "connection lost")
    lines = printed([down, NodeStateChanged("n2", NodeState.OFFLINE, "no answer"),
                     NodeStateChanged("n2", NodeState.CONNECTING), NodeStateChanged("n2", NodeState.ONLINE),
                     NodeStateChanged("n3", NodeState.ONLINE)])
    assert lines == ["== node n2 offline: connection lost", "== node n2 back online"]


def test_tensorflow_start_up_noise_is_not_shown_as_an_error():
    noise = ("E0000 00:00:1795367106.880219   12320 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
             "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
    assert printed([log(noise), log("Traceback (most recent call last):")]) == [
        "      n1 | Traceback (most recent call last):"]


def test_a_straggler_in_steps_says_steps():
    assert printed([Straggler("demo", "r", "n2", 3.0, 9.0, unit="steps/s")]) == [
        "== straggler: n2 runs 3 steps/s, the others 9"]


def test_keras_output_of_an_unmodified_script_is_progress_and_the_summary_has_it():
    classifier = LineClassifier()
    text = (KERAS / "tf_keras_mwms_default.txt").read_bytes()
    console = ConsoleLines()
    metrics = [m for line in console.feed(text) + console.flush() if (m := classifier.classify(line))]
    epochs = [m for m in metrics if m.event == "epoch"]
    assert [m.epoch for m in epochs] == list(range(1, len(epochs) + 1)) and epochs
    assert isinstance(epochs[-1].loss, float) and epochs[-1].steps_per_sec is not None
    outcome = RunOutcome(JobState.SUCCEEDED, "every worker succeeded",
                         (("n1", WorkerStatus("n1", "exited", 0), epochs[-1]),))
    row = summary(outcome).splitlines()[-1].split()
    assert row[:3] == ["n1", "0", str(epochs[-1].epoch)] and float(row[3]) == round(epochs[-1].loss, 4)
    assert summary(outcome).splitlines()[1].split()[-1] == "STEPS/S"


def test_a_script_that_prints_metric_lines_is_not_also_read_as_keras():
    classifier = LineClassifier()
    assert classifier.classify('HOMEGPU_METRIC {"event":"start"}') == Metric({"event": "start"})
    assert classifier.classify("Epoch 1/2") is None
    assert classifier.classify("40/40 [==============================] - 1s 5ms/step - loss: 0.1") is None


def test_outputs_skip_temp_saves_and_stop_at_the_cap(tmp_path):
    listing = {"keras-model/saved_model.pb": (300, 0), "keras-model/variables/v": (500, 0),
               "workertemp_1/keras-model/x": (800, 0), "tb/events": (100, 0), "zz.bin": (2000, 0)}
    fetch, size, left = plan_fetch(listing, cap=1000)
    assert fetch == ["keras-model", "tb"] and size == 900
    assert left == ["zz.bin (0 MiB, past the 9.31323e-07 GiB cap)"]
    (tmp_path / "metrics.jsonl").write_text("")
    outcome = RunOutcome(JobState.SUCCEEDED, "", (), outputs=FetchedOutputs(("keras-model",), 800, ()))
    assert record_line(tmp_path, outcome) == f"logs, the chief's output (keras-model): {tmp_path}"


def test_a_flood_that_outruns_the_terminal_is_said_with_where_every_line_is():
    hub = EventHub(max_queue=5)
    events = hub.subscribe()
    for n in range(20):
        hub.publish(log(f"line {n}"))
    out = io.StringIO()
    Pump(events, LinePrinter(JobSpec(name="demo"), out), SimpleNamespace(experiment=None)).flush()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("== 15 lines and events were not shown here") and "homegpu logs" in lines[0]
    assert lines[1:] == [f"      n1 | line {n}" for n in range(15, 20)]


def test_alerts_are_lines_and_a_failing_command_says_so():
    from homegpu.remote.nodes.events import Alert, AlertCommandFailed, AlertState

    lines = printed([Alert("gpu_temperature", AlertState.FIRING, "n1 GPU 0 is at 91 °C (alert at 85 °C)"),
                     Alert("gpu_temperature", AlertState.CLEARED, "n1 GPU 0 cooled to 70 °C (at or below 80 °C)"),
                     AlertCommandFailed("notify-send '{title}'", "cannot run notify-send: No such file")])
    assert lines == ["== alert: n1 GPU 0 is at 91 °C (alert at 85 °C)",
                     "== alert cleared: n1 GPU 0 cooled to 70 °C (at or below 80 °C)",
                     "== alert command failed: cannot run notify-send: No such file (command: notify-send "
                     "'{title}'; said once until it works again)"]
