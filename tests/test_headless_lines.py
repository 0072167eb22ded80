"""What `run --no-tui` prints for the events it gets: each epoch once, nodes back online, no TF noise."""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from types import SimpleNamespace

from script_errors import VALUES, per_replica_error

from homegpu.remote.config.job_spec import JobSpec
from homegpu.remote.events import (
    EventHub, JobState, JobStateChanged, LogLine, Metric, NodeState, NodeStateChanged, Straggler, WorkerMetric,
)
from homegpu.remote.jobs.outputs import FetchedOutputs, plan_fetch
from homegpu.remote.jobs import RunOutcome
from homegpu.remote.logs.classify import LineClassifier
from homegpu.remote.logs.console import ConsoleLines
from homegpu.remote.logs.tracebacks import MESSAGE_LINES
from homegpu.remote.runtimes.base import WorkerStatus
from homegpu.tui.cli.headless import LinePrinter, Pump, record_line, summary

KERAS = Path(__file__).parent / "fixtures" / "keras"


def printed(events) -> list[str]:
    out = io.StringIO()
    printer = LinePrinter(JobSpec(name="demo"), out)
    for event in events:
        printer.show(event)
    return out.getvalue().splitlines()


def log(text: str, worker: str = "n1") -> LogLine:
    return LogLine(worker, "x.log", 1, text, worker)


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
    error = ("Traceback (most recent call last):", '  File "/w/train.py", line 1, in <module>', "    import x",
             "ModuleNotFoundError: No module named 'x'")
    assert printed([log(noise), *map(log, error)]) == [f"      n1 | {line}" for line in error]


def test_a_straggler_in_steps_says_steps():
    assert printed([Straggler("demo", "r", "n2", 3.0, 9.0, unit="steps/s")]) == [
        "== straggler: n2 runs 3 steps/s, the others 9"]
    riser = "GPU 1 runs PCIe 3.0 x1 of 4.0 x16: a riser or a card not fully seated; seat it in the slot itself"
    assert printed([Straggler("demo", "r", "n2", 3.0, 9.0, unit="steps/s", held_back=(riser,))]) == [
        f"== straggler: n2 runs 3 steps/s, the others 9. Held back: {riser}"]


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
    from homegpu.remote.events import Alert, AlertCommandFailed, AlertState

    lines = printed([Alert("gpu_temperature", AlertState.FIRING, "n1 GPU 0 is at 91 °C (alert at 85 °C)"),
                     Alert("gpu_temperature", AlertState.CLEARED, "n1 GPU 0 cooled to 70 °C (at or below 80 °C)"),
                     AlertCommandFailed("notify-send '{title}'", "cannot run notify-send: No such file")])
    assert lines == ["== alert: n1 GPU 0 is at 91 °C (alert at 85 °C)",
                     "== alert cleared: n1 GPU 0 cooled to 70 °C (at or below 80 °C)",
                     "== alert command failed: cannot run notify-send: No such file (command: notify-send "
                     "'{title}'; said once until it works again)"]


def test_the_same_long_traceback_is_printed_once_bounded_with_where_its_whole_text_is(tmp_path):
    (_, n0), (_, n1) = per_replica_error(tmp_path, 0), per_replica_error(tmp_path, 1)
    logs = tmp_path / "experiments" / "demo-1" / "logs"
    events = [JobStateChanged("demo", "demo-1", JobState.RUNNING, 1, 0)]
    for pair in itertools.zip_longest(n0[:-1], n1[:-1]):  # no line at exit: the messages run on
        events += [log(text, worker) for worker, text in zip(("n0", "n1"), pair) if text is not None]
    events.append(WorkerMetric("demo", "demo-1", "n0", 0, Metric({"event": "start"})))  # n0's message is over
    events.append(JobStateChanged("demo", "demo-1", JobState.FAILED, 1, 0, "script error"))
    out = io.StringIO()
    printer = LinePrinter(JobSpec(name="demo"), out, tmp_path / "experiments")
    for event in events:
        printer.show(event)
    lines = out.getvalue().splitlines()
    assert len(lines) < 25 and sum(line.endswith("| Traceback (most recent call last):") for line in lines) == 1
    assert sum("tf.Tensor" in line for line in lines) == MESSAGE_LINES
    cut = lines.index(f"      n0 | … {VALUES - MESSAGE_LINES} lines cut (whole in {logs}/n0.log)")
    assert lines[cut + 1].endswith("to a Tensor.") and lines[cut + 2].startswith("      n0 | ↳ Keras 3 under")
    assert lines[cut + 3] == "      n0 * training started"
    assert [line for line in lines if line.startswith("      n1")] == [
        "      n1 | building the model", f"      n1 | the same ValueError at model.py:6 as n0 (whole in {logs}/n1.log)"]
    assert lines[-1].startswith("== demo failed")
