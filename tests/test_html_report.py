"""The run report: built from a run folder like the one a run leaves (a timeline recorded from the hub's
real event dataclasses and the agent's recorded stats, a real run's metrics.jsonl and logs, run.json),
rendered in a real browser (headless Chromium, Debian's package), with data checked in its plots."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
from dataclasses import replace
from html import unescape
from pathlib import Path

import pytest

from helpers import homegpu
from script_errors import VALUES, per_replica_error
from homegpu.remote.events import (
    REJOINED, SHRUNK, JobState, JobStateChanged, Metric, NodeState, NodeStateChanged, Straggler, WorkerMetric,
)
from homegpu.remote.logs.tracebacks import MESSAGE_LINES
from homegpu.remote.record.energy import energy_of
from homegpu.remote.record.experiment import ExperimentLog, write_run_manifest
from homegpu.remote.record.html_report import ReportError, write_report
from homegpu.remote.record.html_report_inputs import workers_from_metrics
from homegpu.remote.record.html_report_svg import PLOT_BG, SERIES_COLOURS
from homegpu.remote.record.run_folder import RunFolder
from homegpu.remote.record.timeline import TimelineRecorder, load_timeline
from png_pixels import count_near, read_png
from timeline_events import FIXTURES, scripted_run

SETTINGS = {"name": "demo", "script": "train.py", "epochs": 2, "workers_per_node": 1, "image": "homegpu-trainer"}
BANDWIDTH = {"at": 1795315000.0, "links": [{"src": "gpu1", "dst": "gpu2", "gbits": 0.94, "error": ""},
                                          {"src": "gpu2", "dst": "gpu1", "gbits": 9.41, "error": ""}]}
WINDOW = (1200, 3000)
# Colours of lines that must be inside plot areas: loss and gpu1's GPU (blue), gpu2's throughput and its
# second GPU (teal), val_loss/val_accuracy (purple), CPU (slate).
DRAWN = {"blue": SERIES_COLOURS[0], "teal": SERIES_COLOURS[1], "purple": SERIES_COLOURS[2], "slate": SERIES_COLOURS[5]}


def make_run_dir(root: Path, events: list[object], logs: bool = True) -> Path:
    """experiments/RUN-ID as a run leaves it: logs and metrics through ExperimentLog, a timeline, run.json."""
    log = ExperimentLog(root, "demo-run")
    for event in events:
        if isinstance(event, WorkerMetric):  # what JobRun does with each metric line
            log.metric(event.worker, event.metric)
    if logs:
        for worker, name in (("gpu1", "demo_worker0.log"), ("gpu2", "demo_worker1.log")):
            for line in (FIXTURES / name).read_text().splitlines():
                log.log_line(worker, line)
    log.close()
    recorder = TimelineRecorder(log.folder.timeline)
    for event in events:
        recorder.handle(event)
    recorder.close()
    tf_configs = {w: json.dumps({"cluster": {"worker": ["10.0.0.1:23456", "10.0.0.2:23456"]},
                                 "task": {"type": "worker", "index": i}}) for i, w in enumerate(("gpu1", "gpu2"))}
    write_run_manifest(log.folder.path, SETTINGS, tf_configs, BANDWIDTH)
    return log.folder.path


def screenshot(chromium: str, html: Path, tmp_path: Path) -> Path:
    png = tmp_path / "report.png"
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={png}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}", html.as_uri()]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert png.is_file(), f"chromium wrote no screenshot (exit {result.returncode}): {result.stderr[-2000:]}"
    return png


def drawn_pixels(png: Path) -> dict[str, int]:
    image = read_png(png.read_bytes())
    assert (image.width, image.height) == WINDOW
    return {name: count_near(image, colour, PLOT_BG) for name, colour in DRAWN.items()}


def test_the_report_renders_in_chromium_with_data_in_its_plots(chromium, tmp_path):
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    path, _ = write_report(run_dir)
    assert path == RunFolder(run_dir).report
    pixels = drawn_pixels(screenshot(chromium, path, tmp_path))
    for name, count in pixels.items():
        assert count > 150, f"too few {name} pixels inside plot areas: {pixels}"
    shutil.copy(tmp_path / "report.png", run_dir / "report.png")  # kept for a look when it fails


def test_a_run_without_samples_draws_no_lines(chromium, tmp_path):
    """The pixel check above can fail: the same page with no samples has no series colour in its plots."""
    events = [e for e in scripted_run() if type(e).__name__ not in ("NodeStatsUpdated", "WorkerMetric")]
    run_dir = make_run_dir(tmp_path / "experiments", events, logs=False)
    path, summary = write_report(run_dir)
    assert "No metric lines" in path.read_text()
    pixels = drawn_pixels(screenshot(chromium, path, tmp_path))
    assert pixels == dict.fromkeys(DRAWN, 0)
    assert summary.startswith("demo demo-run: succeeded after 1 restart")


def test_the_page_needs_no_network_and_shows_the_settings_and_the_network(tmp_path):
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    path, _ = write_report(run_dir)
    html = unescape(path.read_text())
    assert not re.search(r"(?i)https?://|\bsrc=|\bhref=|url\(|@import|<script|<link", html)
    assert '"task": {"type": "worker", "index": 1}' in html  # gpu2's TF_CONFIG
    assert "homegpu-trainer" in html and "0.94 Gbit/s" in html and "Slowest link: gpu1 → gpu2" in html
    assert html.count("<svg") == 3 + 4 * 2  # loss, accuracy, throughput; 4 charts per node
    assert "=== homegpu: local generation 1 exited with status 0 ===" in html  # the logs' tails


def test_the_summary_says_what_limited_the_run(tmp_path):
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    _, summary = write_report(run_dir)
    lines = summary.splitlines()
    assert lines[0] == "demo demo-run: succeeded after 1 restart in 30 s"
    assert "final loss 0.09595, accuracy 0.9775, val_loss 0.03739, val_accuracy 0.9922" in lines
    limits = [line for line in lines if line.startswith("limited by: ")]
    assert limits[0].startswith("limited by: gpu2 was a straggler: 410 examples/s against 1,221")
    assert any("restarted at 0:20 after gpu2: no progress for 5s (stalled)" in line for line in limits)
    assert any("gpu2 was offline for 3 s" in line for line in limits)
    # The recorded gpu2 (H100 NVL) was idle: util 0 while the workers ran.
    assert any("GPUs were busy only 0% of the time while a step took 52 ms" in line for line in limits)


def test_the_summary_says_who_went_on_when_a_machine_left_and_each_offline_spell_once(tmp_path):
    """A node away is told offline again at each try; the run went on without it (jobs/fewer.py's line)."""
    t0 = 1_795_316_000.0
    going_on = "gpu2 lost (offline 300 s): going on with gpu1 from epoch 2 (global batch 64 kept: 64 per worker)"
    away = [NodeStateChanged("gpu2", NodeState.OFFLINE, f"try {n}: connection refused", at=t0 + 16.0 + n)
            for n in range(3)]
    shrunk = JobStateChanged("demo", "demo-run", JobState.RESTARTING, 1, 1, going_on, at=t0 + 20.2, regroup=SHRUNK)
    rejoining = "gpu2 back: rejoining with gpu1, gpu2 from epoch 3 (global batch 64 as at the start: 32 per worker)"
    back = JobStateChanged("demo", "demo-run", JobState.RESTARTING, 2, 1, rejoining, at=t0 + 25.0, regroup=REJOINED)
    events = sorted([*scripted_run(t0), *away, shrunk, back], key=lambda event: event.at)
    _, summary = write_report(make_run_dir(tmp_path / "experiments", events))
    limits = [line for line in summary.splitlines() if line.startswith("limited by: ")]
    assert any(f"At 0:20, {going_on}." in line for line in limits), limits
    assert any(f"At 0:25, {rejoining}." in line for line in limits), limits
    assert sum(line.count(going_on) + line.count(rejoining) for line in limits) == 2, limits  # each once
    assert sum(line.count("gpu2 was offline") for line in limits) == 2, limits  # 0:12-0:15, then from 0:16 on


def test_a_folder_without_a_run_is_one_clear_error(tmp_path):
    with pytest.raises(ReportError, match=r"no timeline.sqlite or metrics.jsonl; is this a run's folder"):
        write_report(tmp_path)


def test_a_broken_run_json_names_the_file(tmp_path):
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(ReportError, match=r"run.json: not valid JSON .*delete it"):
        write_report(run_dir)


@pytest.mark.parametrize("key, value, named", [
    ("bandwidth", {"at": 1795315000.0, "links": [{"src": "gpu1", "dst": "gpu2", "gbits": "fast"}]}, "gbits 'fast'"),
    ("bandwidth", {"at": "yesterday", "links": []}, "'at' is 'yesterday'"),
    ("job", ["demo"], "job is list"),
    ("run_id", 7, "run_id is int"),
])
def test_a_run_json_of_the_wrong_shape_names_the_file_and_the_key(tmp_path, key, value, named):
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    manifest = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**manifest, key: value}))
    with pytest.raises(ReportError, match=r"run.json: not what a run writes \(.*" + re.escape(named) + r".*delete it"):
        write_report(run_dir)
    (run_dir / "run.json").unlink()  # what the line says to do
    assert write_report(run_dir)[0].is_file()


def damage(path: Path, how: str) -> None:
    """Damage a real timeline the ways one is met: cut short (a copy that stopped half way),
    overwritten with something else, or left empty."""
    if how == "truncated":
        with path.open("r+b") as file:
            file.truncate(path.stat().st_size // 2)
    elif how == "not a database":
        path.write_bytes(b"these are not the bytes of an SQLite file\n" * 200)
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how, why", [
    ("truncated", "database disk image is malformed"), ("not a database", "file is not a database"),
    ("empty", "an empty file")])
def test_a_damaged_timeline_is_one_line_and_the_report_is_made_from_the_rest(tmp_path, how, why):
    """`homegpu report` as a user types it: one line naming the file and what to do, no traceback, and
    the report from metrics.jsonl, logs/ and run.json; doing what the line says ends the warning."""
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    damage(run_dir / "timeline.sqlite", how)
    result = homegpu("report", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    named = [line for line in result.stdout.splitlines() if "timeline.sqlite" in line]
    assert named == [f"warning: experiments/demo-run/timeline.sqlite is damaged ({why}): this report is made from "
                     "metrics.jsonl, logs/ and run.json without it (no node samples, no events); rename it (e.g. to "
                     "timeline.sqlite.damaged) to keep it and stop this warning"]
    assert "demo demo-run: unknown in 26 s (its timeline is damaged)" in result.stdout
    assert "final loss 0.09595, accuracy 0.9775, val_loss 0.03739, val_accuracy 0.9922" in result.stdout
    html = (run_dir / "report.html").read_text()
    assert html.count("<svg") == 3 and "is damaged" in html and "0.94 Gbit/s" in html  # metrics' charts, run.json

    (run_dir / "timeline.sqlite").rename(run_dir / "timeline.sqlite.damaged")
    again = homegpu("report", cwd=tmp_path)
    assert again.returncode == 0 and "damaged" not in again.stdout + again.stderr, again.stdout + again.stderr


def test_a_damaged_timeline_without_metrics_is_one_line_and_exit_2(tmp_path):
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    damage(run_dir / "timeline.sqlite", "truncated")
    (run_dir / "metrics.jsonl").unlink()
    result = homegpu("report", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr == ("homegpu: error: experiments/demo-run/timeline.sqlite is damaged (database disk image is "
                             "malformed), and there is no metrics.jsonl to make a report from instead; what the "
                             "workers printed is in experiments/demo-run/logs/\n")


def test_a_run_with_only_metrics_still_gets_a_report(tmp_path):
    """A run from before the timeline existed: metrics.jsonl alone (a real run's, unchanged)."""
    run_dir = tmp_path / "experiments" / "demo-old"
    run_dir.mkdir(parents=True)
    shutil.copy(FIXTURES / "demo_metrics.jsonl", run_dir / "metrics.jsonl")
    path, summary = write_report(run_dir)
    html = path.read_text()
    assert html.count("<svg") == 3 and "No bandwidth matrix" in html and "No events recorded" in html
    assert "final loss 0.09595, accuracy 0.9775, val_loss 0.03739, val_accuracy 0.9922" in summary.splitlines()
    assert "unfinished" in summary.splitlines()[0]


def test_a_pytorch_runs_throughput_comes_from_its_epoch_lines(tmp_path):
    """The PyTorch demo (and a script through epoch_done) says examples/s only on its epoch lines, no step lines:
    the report's throughput reads them, from the timeline and from metrics.jsonl alone. The lines are a real
    `homegpu run demo` of `init --framework pytorch` on this machine (tests/fixtures/tui/torch_demo_metrics.jsonl)."""
    rows = [json.loads(line) for line in (FIXTURES / "torch_demo_metrics.jsonl").read_text().splitlines()]
    rates = sorted(row["examples_per_sec"] for row in rows if row["event"] == "epoch")
    steady = statistics.median([row["examples_per_sec"] for row in rows if row["event"] == "epoch"][1:])  # no warm-up
    events = [WorkerMetric("demo", "demo-run", "local", 0, Metric({k: v for k, v in row.items() if k != "worker_label"}),
                           at=row["time"]) for row in rows]
    timeline_run = make_run_dir(tmp_path / "timeline", events, logs=False)
    metrics_run = tmp_path / "metrics-only"
    metrics_run.mkdir()
    shutil.copy(FIXTURES / "torch_demo_metrics.jsonl", metrics_run / "metrics.jsonl")
    for run_dir in (timeline_run, metrics_run):
        html = write_report(run_dir)[0].read_text()
        assert f'<b>{steady:,.0f}</b><span>examples/s, all workers' in html, run_dir
        assert f'<td class="num">{rates[len(rates) // 2]:,.1f}</td>' in html, run_dir


def test_a_slow_link_is_named_when_the_all_reduce_takes_most_of_a_step(tmp_path):
    from homegpu.remote.events import BandwidthMatrix, LinkResult

    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    slow = BandwidthMatrix((LinkResult("gpu1", "gpu2", 0.1), LinkResult("gpu2", "gpu1", 0.1)))
    _, summary = write_report(run_dir, bandwidth=slow)
    # 545,098 float32 parameters, 2 workers: 2.18 MB at 0.1 Gbit/s is 174 ms, against 52 ms steps.
    assert ("limited by: The network: an all-reduce of 545,098 parameters over the slowest link (gpu1 → gpu2, "
            "0.1 Gbit/s) takes about 174 ms, 333% of a 52 ms step") in summary
    _, summary = write_report(run_dir)  # run.json's 0.94 Gbit/s: 19 ms, under half a step
    assert "The network" not in summary


def test_a_failed_runs_report_says_why_and_shows_each_traceback_once_bounded(tmp_path):
    why = ("script error on every worker (gpu1, gpu2) before training started: ValueError: Attempt to convert a "
           "value (PerReplica:{ … at src/model.py:6 (exit 1; not restarted)")
    events = [replace(e, state=JobState.FAILED, detail=why) if getattr(e, "state", None) is JobState.SUCCEEDED else e
              for e in scripted_run()]
    run_dir = make_run_dir(tmp_path / "experiments", events, logs=False)
    for index, worker in enumerate(("gpu1", "gpu2")):  # the logs as a run keeps them: every line
        _, lines = per_replica_error(tmp_path / "nodes", index)
        RunFolder(run_dir).log(worker).write_text("\n".join(lines) + "\n")
    html = unescape(write_report(run_dir)[0].read_text())
    assert "Why it failed" in html and why in html
    assert html.count("Traceback (most recent call last):") == 1 and html.count("tf.Tensor") == MESSAGE_LINES
    assert f"… {VALUES - MESSAGE_LINES} lines cut (whole in logs/gpu1.log)" in html
    assert "the same ValueError at model.py:6 as gpu1 (whole in logs/gpu2.log)" in html
    assert "↳ Keras 3 under MultiWorkerMirroredStrategy" in html


def test_the_report_and_the_run_summary_tell_the_same_energy_and_cost(tmp_path):
    """Its GPUs' kWh from the recorded power samples (each GPU's draw, integrated), priced by the tariff
    run.json kept: the summary line, the report's Energy table and what `homegpu run` prints agree."""
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    manifest = json.loads((run_dir / "run.json").read_text())
    manifest["tariff"] = {"price_per_kwh": 0.35, "currency": "EUR", "tariffs": {}}
    (run_dir / "run.json").write_text(json.dumps(manifest))
    path, summary = write_report(run_dir)
    energy = energy_of(run_dir)
    (line,) = [line for line in summary.splitlines() if line.startswith("energy ")]
    assert line == energy.line()
    assert set(energy.nodes) == {"gpu1", "gpu2"} and energy.total.cost == pytest.approx(energy.total.kwh * 0.35)
    timeline = load_timeline(RunFolder(run_dir).timeline)
    for node in timeline.nodes:  # between its GPUs' lowest and highest draw over the time they were sampled
        watts = [w for gpu in node.gpus for w in gpu.power.values if w is not None]
        joules = energy.nodes[node.name].joules
        seconds = energy.nodes[node.name].seconds
        assert min(watts) * seconds * 0.999999 <= joules <= max(watts) * seconds * len(node.gpus) * 1.000001
    assert re.search(r"energy [\d.e-]+ kWh on GPUs \(gpu1 [\d.e-]+ kWh, gpu2 [\d.e-]+ kWh; integrated from power "
                     r"samples\), [\d.e-]+ kWh per epoch(, \d+ s without samples not counted)?, cost [\d.e-]+ EUR$", line), line
    assert energy.epochs == 4  # each worker's 2 epochs in each of its 2 generations
    html = unescape(path.read_text())
    assert "<h2>Energy</h2>" in html and f"{energy.total.cost:.4g} EUR" in html


def test_without_a_price_the_energy_is_shown_and_how_to_price_it_said(tmp_path):
    run_dir = make_run_dir(tmp_path / "experiments", scripted_run())
    _, summary = write_report(run_dir)
    assert summary.splitlines()[-1].endswith("; set price_per_kwh in [cluster] for its cost")


def test_a_straggler_held_back_by_its_gpu_says_so_in_what_limited_the_run(tmp_path):
    """The Straggler event's sentences (remote/nodes/health.py's, as the node's stats showed them) are kept
    in the timeline and named with the straggler."""
    cause = "GPU 0 thermal slowdown at 87 °C since 09:00: clocks 1,200 of 1,860 MHz; improve the case's airflow"
    events = [replace(event, held_back=(cause,)) if isinstance(event, Straggler) else event
              for event in scripted_run()]
    _, summary = write_report(make_run_dir(tmp_path / "experiments", events))
    limits = [line for line in summary.splitlines() if line.startswith("limited by: ")]
    assert limits[0].startswith("limited by: gpu2 was a straggler: 410 examples/s against 1,221")
    assert limits[0].endswith(f"at every step. Held back: {cause}.")


def test_a_balanced_runs_shares_are_drawn_per_worker(tmp_path):
    """Epoch lines as the balanced trainer prints them (trainer/PROTOCOL.md: `shares` in rank order): a chart of
    each worker's share of a step; a run without shares has no such chart."""
    run_dir = tmp_path / "experiments" / "demo-balanced"
    run_dir.mkdir(parents=True)
    rows = []
    for epoch, split in enumerate(([256, 256], [422, 90], [430, 82]), 1):
        for rank, label in enumerate(("desktop", "laptop")):
            rows.append({"worker_label": label, "event": "epoch", "worker": rank, "workers": 2, "epoch": epoch,
                         "time": 1795316664.0 + 10 * epoch, "loss": 1.0 / epoch, "examples_per_sec": 900.0,
                         "shares": split})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    workers = workers_from_metrics(run_dir / "metrics.jsonl")
    assert [w.share.values for w in workers] == [(256.0, 422.0, 430.0), (256.0, 90.0, 82.0)]
    html = write_report(run_dir)[0].read_text()
    assert "Share of each step per worker" in html
    shutil.copy(FIXTURES / "demo_metrics.jsonl", run_dir / "metrics.jsonl")
    assert "Share of each step" not in write_report(run_dir)[0].read_text()


def test_a_balanced_runs_slowest_worker_is_not_what_limited_it(tmp_path):
    """A desktop and a laptop balanced by speed (their rates as a try on the test LAN gave them): the laptop does
    fewer examples a second by design and nobody waits for it, so the summary does not call it a straggler; the
    same rates unbalanced do."""
    def summary(shares: bool) -> str:
        run_dir = tmp_path / "experiments" / f"demo-{'balanced' if shares else 'even'}"
        run_dir.mkdir(parents=True)
        rows = [{"worker_label": label, "event": "epoch", "worker": rank, "workers": 2, "epoch": epoch,
                 "time": 1795316664.0 + 10 * epoch, "loss": 1.0 / epoch, "examples_per_sec": rate,
                 **({"shares": [445, 67]} if shares else {})}
                for epoch in (1, 2, 3) for rank, (label, rate) in enumerate((("desktop", 1654.0), ("laptop", 249.0)))]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return write_report(run_dir)[1]
    balanced = summary(shares=True)
    assert "laptop was a straggler" not in balanced
    assert "balanced by speed: each step's examples desktop 445/512, laptop 67/512 (at the end)" in balanced
    assert "limited by: laptop was a straggler: 249 examples/s against 1,654" in summary(shares=False)
