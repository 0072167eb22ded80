"""The TUI's pure parts: the view model fed with events, the text charts, the panel renderings, log
filtering and wrapping. Stats come from tests/fixtures/tui/, lines the real stats agent printed from
recorded real-GPU nvidia-smi output (see record.py there)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from script_errors import VALUES, per_replica_error

from homegpu.remote.config.cluster_spec import embedded_default, parse_cluster
from homegpu.remote.events import (
    BandwidthMatrix, BandwidthMeasured, GpuProcess, JobState, JobStateChanged, LinkResult, LogLine, Metric,
    NodeState, NodeStateChanged, NodeStatsUpdated, PreflightResult, ProcessOwner, Straggler, WorkerMetric,
)
from homegpu.remote.logs.tracebacks import MESSAGE_LINES
from homegpu.remote.net import bandwidth_store
from homegpu.remote.nodes import GpuHealth
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.tui.app.log_pane import clean, format_entries, matching, wrap_rows
from homegpu.tui.app.main import left_running_note
from homegpu.tui.view.plot import BRAILLE_BASE, braille_plot, progress_bar, sparkline
from homegpu.tui.view.render import (
    HELD_MARK, key_bar,
    age, bandwidth_summary, drawn_alike, job_summary, level_style, node_cells, node_detail,
)
from homegpu.tui.view.state import JOB, LOGS, MAX_LINE, NODES, ClusterView, LogBuffers, LogEntry
from homegpu.tui.view.text import format_status

FIXTURES = Path(__file__).parent / "fixtures" / "tui"

THREE_NODES = """
[cluster]
name = "lab"
[[nodes]]
name = "big"
host = "10.0.0.1"
[[nodes]]
name = "small"
host = "10.0.0.2"
[[nodes]]
name = "laptop"
host = "10.0.0.3"
"""


def recorded(name: str):
    return parse_agent_line((FIXTURES / f"{name}.json").read_text())


@pytest.fixture
def view() -> ClusterView:
    return ClusterView(parse_cluster(THREE_NODES, "cluster.toml"))


def run_event(state: JobState, run_id: str = "demo-1", **kw) -> JobStateChanged:
    return JobStateChanged("demo", run_id, state, kw.get("generation", 1), kw.get("restarts", 0), kw.get("detail", ""))


def metric(worker: str, index: int, **data) -> WorkerMetric:
    return WorkerMetric("demo", "demo-1", worker, index, Metric(data))


# -- view model ------------------------------------------------------------------------------------


def test_stats_fill_the_node_and_its_gpu_history(view: ClusterView) -> None:
    assert view.apply(NodeStateChanged("big", NodeState.ONLINE)) == {NODES}
    stats = recorded("h100nvl_idle")
    for second in range(700):
        view.apply(NodeStatsUpdated("big", replace(stats, timestamp=stats.timestamp + second)))
    node = view.nodes["big"]
    assert node.online and node.stats.timestamp == stats.timestamp + 699
    assert sorted(node.trail) == [0, 1]
    assert len(node.trail[0].util.tiers[0].values) == 600  # the 1 s tier keeps 10 minutes however long it runs
    assert node.trail[1].mem.window(300, 10)[-1] == 0.0


def test_events_for_unknown_nodes_or_jobs_change_nothing(view: ClusterView) -> None:
    assert view.apply(NodeStateChanged("ghost", NodeState.ONLINE)) == set()
    assert view.apply(metric("big", 0, event="epoch", epoch=1, loss=1.0)) == set()  # no run on screen yet
    assert view.apply(object()) == set()


def test_a_run_collects_progress_loss_and_speed_from_the_chief(view: ClusterView) -> None:
    assert view.apply(run_event(JobState.RUNNING)) == {JOB}
    view.apply(metric("big", 0, event="start", epochs=3, steps_per_epoch=10, params=1234, initial_epoch=0))
    view.apply(metric("big", 0, event="step", epoch=1, step=5, loss=2.0, examples_per_sec=500.0))
    view.apply(metric("small", 1, event="step", epoch=1, step=5, loss=2.0, examples_per_sec=200.0))
    view.apply(metric("big", 0, event="epoch", epoch=1, epochs=3, loss=1.5, accuracy=0.5, examples_per_sec=510.0))
    view.apply(Straggler("demo", "demo-1", "small", 200.0, 510.0))
    job = view.job
    assert (job.epochs, job.epoch, job.params, job.accuracy) == (3, 1, 1234, 0.5)
    assert list(job.loss) == [(0.5, 2.0), (1.0, 1.5)]  # the step at half of epoch 1, then epoch 1's end
    assert job.rates == {"big": 510.0, "small": 200.0}
    assert job.stragglers == {"small"}


def publish(view: ClusterView, worker: str, index: int, lines: list[str]) -> None:
    """A worker's log as its run publishes it: each metric line (LineClassifier) as its metric, the rest as lines."""
    from homegpu.remote.logs.classify import LineClassifier

    classifier = LineClassifier()
    for seq, text in enumerate(lines, 1):
        found = classifier.classify(text)
        view.apply(LogLine(worker, "log", seq, text, worker=worker) if found is None
                   else WorkerMetric("demo", "demo-1", worker, index, found))


def test_a_scripts_keras_epoch_figures_are_a_line_of_the_logs(view: ClusterView) -> None:
    """keras.io's fit(verbose=2) prints an epoch's figures as one progress line, which is a metric: the logs
    show it as `run --no-tui` does, under its `Epoch N/M` line, not a bare header."""
    view.apply(run_event(JobState.RUNNING))
    publish(view, "big", 0, ["Epoch 1/6", "63/63 - 2s - 27ms/step - loss: 1.8467 - sparse_categorical_accuracy: "
                             "0.4083 - val_loss: 1.7759 - val_sparse_categorical_accuracy: 0.4240", "Epoch 2/6"])
    assert [e.text for e in view.logs.buffers["big"]] == [  # the first `Epoch` line is the start's metric
        "* epoch 1/6  loss 1.8467  accuracy 0.4083  val_loss 1.7759  val_accuracy 0.4240  37.0 steps/s", "Epoch 2/6"]


def test_the_built_in_trainers_epoch_is_shown_once(view: ClusterView) -> None:
    view.apply(run_event(JobState.RUNNING))
    record = ('{"event":"epoch","worker":0,"workers":2,"epoch":1,"epochs":2,"loss":1.0089,"accuracy":0.7614,'
              '"examples_per_sec":926.7}')
    publish(view, "big", 0, ["HOMEGPU_METRIC " + record, "epoch 1/2  loss 1.0089  accuracy 0.7614  (3.9 s, 927 "
                             "examples/s on this worker)", "after"])
    assert [e.text for e in view.logs.buffers["big"]] == ["* epoch 1/2  loss 1.0089  accuracy 0.7614  927 examples/s",
                                                          "after"]


def test_a_new_run_starts_afresh_and_clears_the_logs(view: ClusterView) -> None:
    view.apply(run_event(JobState.RUNNING))
    view.apply(metric("big", 0, event="epoch", epoch=1, epochs=2, loss=1.0))
    view.apply(LogLine("big", "log", 1, "hello", worker="big"))
    view.apply(run_event(JobState.PREFLIGHT, run_id="demo-2"))
    assert view.job.run_id == "demo-2" and not view.job.loss
    assert not view.logs.buffers[LogBuffers.MERGED]


def test_restarts_keep_the_run_and_count(view: ClusterView) -> None:
    view.apply(run_event(JobState.RUNNING))
    view.apply(metric("big", 0, event="epoch", epoch=1, epochs=2, loss=1.0))
    view.apply(run_event(JobState.RESTARTING, generation=1, restarts=1, detail="small: killed"))
    view.apply(run_event(JobState.RUNNING, generation=2, restarts=1))
    assert (view.job.generation, view.job.restarts, len(view.job.loss)) == (2, 1, 1)


def test_log_buffers_are_bounded_in_lines_and_line_length() -> None:
    logs = LogBuffers(["a", "b"], max_lines=100)
    for seq in range(1000):
        logs.add(LogLine("a" if seq % 2 else "b", "log", seq, "x" * 10_000, worker="w"))
    assert len(logs.buffers[LogBuffers.MERGED]) == 100
    assert len(logs.buffers["a"]) == 100
    assert {len(e.text) for e in logs.buffers["a"]} == {MAX_LINE}
    assert logs.version == 1000


def test_the_same_long_traceback_of_two_workers_is_shown_once_bounded(tmp_path) -> None:
    view = ClusterView(parse_cluster(THREE_NODES, "cluster.toml"), tmp_path / "experiments")
    (_, big), (_, small) = per_replica_error(tmp_path, 0), per_replica_error(tmp_path, 1)
    view.apply(run_event(JobState.RUNNING))
    for pair in itertools.zip_longest(big[:-1], small[:-1]):  # no line at exit: the message runs to the end
        for node, text in zip(("big", "small"), pair):
            if text is not None:
                view.apply(LogLine(node, "log", 1, text, worker=node))
    assert LOGS in view.apply(run_event(JobState.FAILED))  # the logs were read to their end: the cut is said
    merged = format_entries(view.logs.buffers[LogBuffers.MERGED])
    assert len(merged) < 25 and merged.count("big | Traceback (most recent call last):") == 1
    assert sum("tf.Tensor" in line for line in merged) == MESSAGE_LINES
    logs = tmp_path / "experiments" / "demo-1" / "logs"
    assert f"big | … {VALUES - MESSAGE_LINES} lines cut (whole in {logs}/big.log)" in merged
    assert format_entries(view.logs.buffers["small"], "small") == [
        "building the model", f"the same ValueError at model.py:6 as big (whole in {logs}/small.log)"]


def test_bandwidth_progress_and_result(view: ClusterView) -> None:
    bw = view.bandwidth
    bw.begin(2)
    bw.link("big", "small", None)
    assert bw.running and bw.current == "big → small"
    result = LinkResult("big", "small", 9.4, "")
    bw.link("big", "small", result)
    matrix = BandwidthMatrix((result,))
    assert view.apply(BandwidthMeasured(matrix)) == {"bandwidth"}
    bw.finish(matrix)
    assert (bw.running, bw.done, bw.matrix) == (False, 1, matrix)


# -- charts ----------------------------------------------------------------------------------------


def test_sparkline_scales_right_aligns_and_shows_gaps() -> None:
    assert sparkline([0, 50, 100], 5) == "  ▁▅█"
    assert sparkline([100] * 10, 3) == "███"
    assert sparkline([0, 0, 0, 100, 50, 0], 3) == "█▅▁"  # a longer history: its newest `width`, newest right
    assert sparkline([float("nan"), "n/a", 0], 3) == "  ▁"


def test_braille_plot_draws_a_falling_line_corner_to_corner() -> None:
    rows = braille_plot([(0, 10.0), (1, 0.0)], width=4, height=2)
    assert len(rows) == 2 and all(len(row) == 4 for row in rows)
    assert ord(rows[0][0]) & 0x01  # top-left dot: the first (highest) point
    assert ord(rows[1][3]) & 0x80  # bottom-right dot: the last (lowest) point
    assert rows[0][3] == chr(BRAILLE_BASE)  # nothing in the top-right corner


def test_braille_plot_of_nothing_or_one_point_keeps_its_size() -> None:
    assert braille_plot([], 3, 2) == [chr(BRAILLE_BASE) * 3] * 2
    assert sum(ch != chr(BRAILLE_BASE) for row in braille_plot([(1, 1)], 3, 2) for ch in row) == 1


def test_progress_bar_halves_and_unknown_total() -> None:
    assert progress_bar(1, 2, 4) == "━━  "
    assert progress_bar(1, 6, 3) == "╸  "
    assert progress_bar(5, 4, 2) == "━━"
    assert progress_bar(1, 0, 3) == "   "


# -- panels ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, style", [(10, "green"), (60, "yellow"), (95, "red"), ("n/a", "dim")])
def test_level_style(value, style) -> None:
    assert level_style(value, (50, 90)) == style


def test_ages() -> None:
    assert [age(s) for s in (1, 42, 180, 7200)] == ["just now", "42 s ago", "3 min ago", "2 h ago"]


def test_node_row_has_a_line_per_gpu_and_says_cpu_only(view: ClusterView) -> None:
    view.apply(NodeStateChanged("big", NodeState.ONLINE))
    view.apply(NodeStatsUpdated("big", recorded("h100nvl_idle")))
    cells, height = node_cells(view.nodes["big"])
    assert height == 2
    assert cells[1].plain.splitlines() == ["0 H100 NVL", "1 H100 NVL"]
    assert cells[5].plain.splitlines() == [" 62/310W", " 62/310W"]
    view.apply(NodeStateChanged("laptop", NodeState.ONLINE))
    view.apply(NodeStatsUpdated("laptop", recorded("cpu_only")))
    cells, height = node_cells(view.nodes["laptop"])
    assert (cells[1].plain, height) == ("CPU only", 1)


def test_an_offline_node_keeps_its_figures_greyed(view: ClusterView) -> None:
    view.apply(NodeStatsUpdated("big", recorded("h100_mig_load")))
    view.apply(NodeStateChanged("big", NodeState.OFFLINE, reason="connection lost"))
    cells, _ = node_cells(view.nodes["big"])
    assert cells[0].plain == "✗ big"
    assert all(str(cell.style) == "dim" for cell in cells[1:])
    cells, _ = node_cells(view.nodes["small"])  # never connected: says why instead of blanks
    assert cells[1].plain == "connecting"


def test_a_node_that_goes_offline_with_the_same_figures_is_drawn_again_greyed(view: ClusterView) -> None:
    """The table redraws only the cells that differ (drawn_alike): the figures are the same text once greyed, and
    rich's Text equality alone would keep them coloured."""
    view.apply(NodeStateChanged("big", NodeState.ONLINE))
    view.apply(NodeStatsUpdated("big", recorded("h100_mig_load")))
    shown, _ = node_cells(view.nodes["big"])
    view.apply(NodeStateChanged("big", NodeState.OFFLINE, reason="connection lost"))
    greyed, _ = node_cells(view.nodes["big"])
    assert [cell.plain for cell in greyed[1:]] == [cell.plain for cell in shown[1:]]
    assert not any(drawn_alike(cell, before) for cell, before in zip(greyed[1:], shown[1:]) if cell.plain)
    assert all(drawn_alike(cell, cell.copy()) for cell in greyed)


def test_node_detail_shows_versions_history_and_processes(view: ClusterView) -> None:
    view.apply(NodeStateChanged("big", NodeState.ONLINE))
    view.apply(NodeStatsUpdated("big", recorded("h100_mig_load")))
    text = node_detail(view.nodes["big"], 40).plain
    assert "GPUs via nvidia-smi · driver 590.48.01 · CUDA 13.1" in text
    assert "pid 21198 ./gpu_burn (7.3 GiB)" in text
    assert " util " in text and " n/a" in text  # MIG hides utilisation: said, not guessed


def sweep_on_gpu_0(view: ClusterView) -> None:
    """`big`'s recorded idle H100 NVLs with three runs of a sweep on GPU 0, each held to gpu_memory = "5GiB" (the
    agent reads the budget off each worker's environment: tests/test_process_owners.py), and another user's
    process beside them."""
    stats = recorded("h100nvl_idle")
    runs = [GpuProcess(4100 + n, "python3", 4200, ProcessOwner("worker", "root", 0, f"sweep-q-{n}", "sweep", 0,
                                                               gpu_memory=5 * 1024 ** 3)) for n in range(3)]
    stranger = GpuProcess(4242, "python3", 20076, ProcessOwner("process", "bob", 1001))
    card = replace(stats.gpus[0], processes=(*runs, stranger))
    view.apply(NodeStateChanged("big", NodeState.ONLINE))
    view.apply(NodeStatsUpdated("big", replace(stats, gpus=(card, stats.gpus[1]))))


def test_a_card_runs_share_says_their_budgets_in_the_detail_and_in_status(view: ClusterView) -> None:
    sweep_on_gpu_0(view)
    lines = node_detail(view.nodes["big"], 80).plain.splitlines()
    assert "[0] NVIDIA H100 NVL · budgets 15.0 GiB of 93.6 GiB, for 3 runs" in lines
    assert "[1] NVIDIA H100 NVL" in lines  # nobody's budget on the other card: nothing said
    assert "  pid 4101 python3 (4.1 GiB) homegpu worker 0 of job sweep run sweep-q-1, gpu_memory 5.0 GiB" in lines
    assert "  pid 4242 python3 (19.6 GiB) user bob" in lines
    session = SimpleNamespace(name="big", spec=SimpleNamespace(host="big"), address="10.0.0.1",  # as status has it
                              address_source="ssh config", state=NodeState.ONLINE, reason="",
                              fingerprint="SHA256:x", latest=view.nodes["big"].stats)
    status = format_status([session]).splitlines()
    gpu0 = next(i for i, line in enumerate(status) if line.lstrip().startswith("[0]"))
    assert status[gpu0 + 1] == "        budgets 15.0 GiB of 93.6 GiB, for 3 runs"
    assert any(line.endswith("homegpu worker 0 of job sweep run sweep-q-2, gpu_memory 5.0 GiB") for line in status)


def hot_gpu_lines(view: ClusterView, health: GpuHealth, seconds: range,
                  throttle: tuple[str, ...] = ("hw_thermal",)) -> None:
    """`big`'s recorded idle H100 NVLs, GPU 1 under load and throttled (documented values: no recording of a
    throttling card exists), one line a second, each judged by `health` as the node's session judges it."""
    stats = recorded("h100nvl_idle")
    hot = replace(stats.gpus[1], util=97, temp=87, sm_clock=1200, sm_clock_max=1860, throttle=throttle)
    for second in seconds:
        line = replace(stats, timestamp=stats.timestamp + second, gpus=(stats.gpus[0], hot))
        health.take(line)
        view.apply(NodeStatsUpdated("big", line, held_back=health.judgement()))


def test_a_node_with_a_gpu_held_back_is_marked_and_its_detail_says_why_under_that_gpu(view: ClusterView) -> None:
    view.apply(NodeStateChanged("big", NodeState.ONLINE))
    health = GpuHealth()
    hot_gpu_lines(view, health, range(1))
    assert node_cells(view.nodes["big"])[0][0].plain == "● big"  # one reading: a moment, nothing said
    assert "held back" not in node_detail(view.nodes["big"], 80).plain
    hot_gpu_lines(view, health, range(1, 11))
    assert node_cells(view.nodes["big"])[0][0].plain == "● big" + HELD_MARK
    lines = node_detail(view.nodes["big"], 80).plain.splitlines()
    held = [i for i, line in enumerate(lines) if "held back" in line]
    assert len(held) == 1 and lines[held[0] - 1] == "[1] NVIDIA H100 NVL"
    assert lines[held[0]].startswith(" held back: GPU 1 thermal slowdown at 87 °C since ")
    assert lines[held[0]].endswith(": clocks 1,200 of 1,860 MHz; improve the case's airflow")
    view.apply(NodeStateChanged("big", NodeState.OFFLINE, reason="connection lost"))
    assert node_cells(view.nodes["big"])[0][0].plain == "✗ big"  # greyed figures, nothing judged on them


def test_a_reason_a_node_names_shows_its_control_characters_in_the_detail(view: ClusterView) -> None:
    view.apply(NodeStateChanged("big", NodeState.ONLINE))
    hot_gpu_lines(view, GpuHealth(), range(10), throttle=("\x1b]0;pwned\x07",))
    text = node_detail(view.nodes["big"], 80).plain
    assert "held back: GPU 1 clock event \\x1b]0;pwned\\x07" in text and "\x1b" not in text


def test_host_key_unknown_says_how_to_trust(view: ClusterView) -> None:
    view.apply(NodeStateChanged("big", NodeState.HOST_KEY_UNKNOWN, reason="unknown key", fingerprint="SHA256:x"))
    assert "press t" in node_detail(view.nodes["big"]).plain


def test_job_summary_highlights_the_straggler_and_preflight_problems(view: ClusterView) -> None:
    view.apply(run_event(JobState.PREFLIGHT))
    view.apply(PreflightResult("demo", "small", ("small: port 23456 is in use",)))
    assert "✗ small: port 23456 is in use" in job_summary(view.job).plain
    view.apply(run_event(JobState.RUNNING))
    view.apply(metric("big", 0, event="epoch", epoch=1, epochs=4, loss=0.5, examples_per_sec=900.0))
    view.apply(metric("small", 1, event="epoch", epoch=1, epochs=4, loss=0.5, examples_per_sec=90.0))
    view.apply(Straggler("demo", "demo-1", "small", 90.0, 900.0))
    text = job_summary(view.job, 60)
    assert "epoch 1/4" in text.plain and "loss 0.5000" in text.plain
    assert "small 90 (straggler)" in text.plain
    [span] = [s for s in text.spans if text.plain[s.start:s.end].startswith("  small")]
    assert "red" in str(span.style)


def test_job_summary_shows_each_workers_share_of_a_step_in_a_balanced_run(view: ClusterView) -> None:
    view.apply(run_event(JobState.RUNNING))
    view.apply(metric("big", 0, event="epoch", epoch=1, epochs=4, examples_per_sec=1714.0, shares=[422, 90]))
    view.apply(metric("small", 1, event="epoch", epoch=1, epochs=4, examples_per_sec=366.0, shares=[422, 90]))
    view.apply(Straggler("demo", "demo-1", "small", 366.0, 1714.0, balanced="Balanced: it does 90 of the 512 ..."))
    text = job_summary(view.job, 80)
    # the slowest, balanced: nobody waits for it, so neither "straggler" nor red
    assert "examples/s:  big 1714 (share 422/512)  small 366 (share 90/512)" in text.plain
    assert "straggler" not in text.plain and not any("red" in str(span.style) for span in text.spans)
    text = text.plain
    view.apply(metric("big", 0, event="epoch", epoch=2, epochs=4, examples_per_sec=1714.0, shares=[422, 50, 40]))
    assert "examples/s:  big 1714  small 366" in job_summary(view.job, 80).plain  # shares per replica: not shown


def test_job_summary_shows_each_workers_step_in_parts_a_line_each(view: ClusterView) -> None:
    view.apply(run_event(JobState.RUNNING))
    for worker, index, rate, parts in (("big", 0, 327.0, (1.09, 0.16, 0.09)), ("small", 1, 53.0, (0.99, 0.31, 0.04))):
        view.apply(metric(worker, index, event="epoch", epoch=3, epochs=4, examples_per_sec=rate, shares=[441, 71],
                          **dict(zip(("compute_seconds", "overhead_seconds", "wait_seconds"), parts)),
                          step_seconds=1.34))
    lines = job_summary(view.job, 80).plain.splitlines()
    assert "  big 327 (share 441/512, a step 1.1 s compute + 0.16 s besides + 0.09 s waiting)" in lines
    assert "  small 53 (share 71/512, a step 0.99 s compute + 0.31 s besides + 0.04 s waiting)" in lines


def test_bandwidth_summary_ages_and_advises(view: ClusterView) -> None:
    names = list(view.nodes)
    assert "press b" in bandwidth_summary(view.bandwidth, names, None, 0).plain
    view.bandwidth.matrix = BandwidthMatrix((LinkResult("big", "small", 1.0, ""),), at=1000.0)
    text = bandwidth_summary(view.bandwidth, names, 25_000_000, 1180.0).plain
    assert "measured 3 min ago" in text
    assert "25,000,000 parameters" in text and "across 2 workers" in text


def test_bandwidth_advice_is_for_the_links_of_the_job_on_screen(view: ClusterView) -> None:
    links = (LinkResult("big", "small", 10.0, ""), LinkResult("small", "big", 10.0, ""),
             LinkResult("big", "laptop", 0.1, ""), LinkResult("laptop", "big", 0.1, ""))
    view.bandwidth.matrix = BandwidthMatrix(links, at=0.0)
    everyone = bandwidth_summary(view.bandwidth, list(view.nodes), 1000, 0.0).plain
    job = bandwidth_summary(view.bandwidth, list(view.nodes), 1000, 0.0, job_node_names=["big", "small"]).plain
    assert "at 0.1 Gbit/s" in everyone and "across 3 workers" in everyone
    assert "at 10 Gbit/s" in job and "across 2 workers" in job


# -- logs ------------------------------------------------------------------------------------------


def test_log_lines_are_cleaned_prefixed_filtered_and_wrapped() -> None:
    assert clean("\x1b[31mred\x1b[0m\ttab\x07") == "red    tab"
    entries = [LogEntry("a", "a", "hello"), LogEntry("a", "a#1", "World")]
    assert format_entries(entries) == ["a | hello", "a#1 | World"]
    assert format_entries(entries, node_tab="a") == ["hello", "a#1 | World"]
    assert matching(["Hello", "world"], "HEL") == ["Hello"]
    assert wrap_rows(["abcdefg", "xy"], 3) == ["abc", "def", "g", "xy"]


def test_the_embedded_default_renders_without_a_job() -> None:
    view = ClusterView(embedded_default())
    assert "press l" in job_summary(view.job).plain
    assert "one node" in bandwidth_summary(view.bandwidth, list(view.nodes), None, 0).plain


def test_the_latest_matrix_is_kept_per_cluster_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = parse_cluster(THREE_NODES, str(tmp_path / "cluster.toml"))
    assert bandwidth_store.read(spec) == (None, "")
    matrix = BandwidthMatrix((LinkResult("big", "small", 9.4, ""), LinkResult("big", "gone", 1.0, ""),
                              LinkResult("small", "big", None, "refused")), at=1234.5)
    path = bandwidth_store.save(spec, matrix)
    assert path.parent == tmp_path / "homegpu"
    loaded, problem = bandwidth_store.read(spec)
    assert loaded.at == 1234.5 and problem == ""
    assert [(r.src, r.dst, r.gbits, r.error) for r in loaded.results] == [
        ("big", "small", 9.4, ""), ("small", "big", None, "refused")]  # "gone" is no longer a node
    other = parse_cluster(THREE_NODES, str(tmp_path / "elsewhere" / "cluster.toml"))
    assert bandwidth_store.read(other) == (None, "")  # same name, another file


def test_clusters_named_by_the_same_relative_path_in_two_folders_keep_two_matrices(tmp_path, monkeypatch) -> None:
    """`--config cluster.toml` in two folders is two clusters; one file named two ways is one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    paths = []
    for folder in ("lab", "home"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        paths.append(bandwidth_store.store_path(parse_cluster(THREE_NODES, "cluster.toml")))
    assert paths[0] != paths[1]
    assert bandwidth_store.store_path(parse_cluster(THREE_NODES, str(tmp_path / "home" / "cluster.toml"))) == paths[1]
    assert bandwidth_store.store_path(embedded_default()).name.startswith("bandwidth-")


@pytest.mark.parametrize("content, why", [
    ('{"at": 1234.5, "links": [{"src": "big", "dst": "small", "gbits": "9.4", "error": ""}]}',
     "the link big → small has gbits '9.4', error ''"),
    ('{"at": "noon", "links": []}', "'at' is 'noon', not a time"),
    ('{"at": 1234.5, "links": [["big", "small", 9.4]]}', "a link is ['big', 'small', 9.4]"),
    ('{"at": 1234.5, "links": {"big": 9.4}}', "not an object with a list of links"),
    ("{not json", "Expecting property name"),
])
def test_a_damaged_matrix_is_ignored_and_named_once(tmp_path, monkeypatch, content, why) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = parse_cluster(THREE_NODES, str(tmp_path / "cluster.toml"))
    path = bandwidth_store.store_path(spec)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    matrix, problem = bandwidth_store.read(spec)
    assert matrix is None
    assert problem.startswith(f"the saved bandwidth matrix {path} is damaged (") and why in problem
    assert problem.endswith("it is ignored: press b in the TUI or run `homegpu bandwidth` to measure again and "
                            "rewrite it")
    assert bandwidth_store.read(spec) == (None, "")  # said once: the TUI and the run's record both read it


KEYS = [("l", "Launch"), ("s", "Stop"), ("?", "Help"), ("q", "Quit"), ("b", "Bandwidth"), ("r", "Reconnect")]


def test_key_bar_shows_every_key_when_they_fit() -> None:
    line = key_bar(KEYS, 200).plain
    assert [word for word in line.split() if len(word) > 1] == [action for _, action in KEYS]
    assert "more" not in line


@pytest.mark.parametrize("width", [20, 40, 55, 63])
def test_key_bar_ends_with_more_and_never_cuts_a_key(width: int) -> None:
    line = key_bar(KEYS, width).plain
    assert len(line) <= width and line.rstrip().endswith("?  more")
    shown = line.split()
    assert "Help" not in shown  # `? more` stands for it
    for key, action in KEYS:
        assert (action in shown) == (f" {key}  {action} " in line)  # an action is shown whole or not at all


def test_leaving_a_job_running_names_the_commands_that_come_back_to_it() -> None:
    note = left_running_note("demo", "demo-20261122-1")
    assert "demo-20261122-1" in note and "homegpu run demo" in note and "homegpu stop demo" in note


def test_the_launch_dialog_shows_the_tf_configs_then_the_device_plan():
    from homegpu.remote.plan.layout import lay_out
    from homegpu.tui.app.screens import launch_preview

    spec = parse_cluster('[[nodes]]\nname = "box"\nhost = "10.0.0.2"\n[[nodes]]\nname = "laptop"\nhost = "10.0.0.3"\n'
                         '[jobs.mixed]\nworkers_per_node = "per-gpu"\n')
    job = spec.jobs["mixed"]
    layout = lay_out(spec, job, {"box": [(0, "NVIDIA GeForce RTX 3090"), (1, "NVIDIA GeForce RTX 3090")],
                                 "laptop": []})
    text = launch_preview(job, layout).plain
    plan_at = text.index("Device plan")
    assert "worker 1  box#1   10.0.0.2:23457  GPU 1 RTX 3090" in text[plan_at:]
    assert "collective RING (a worker runs on CPU)" in text[plan_at:]
    assert text.index("box (chief, index 0)") < text.rindex("TF_CONFIG") < plan_at  # the workers come first
    assert text.count("TF_CONFIG=") == 3
    waiting = launch_preview(job, lay_out(spec, job, {"box": None, "laptop": []})).plain
    assert "no device plan yet: no stats from box" in waiting[waiting.index("Device plan"):]
    assert waiting.count("TF_CONFIG=") == 2  # a "per-gpu" node whose GPUs are not known yet counts one worker


def test_the_launch_dialog_shows_a_scripts_args_not_the_trainers_schedule():
    from homegpu.remote.plan.layout import lay_out
    from homegpu.tui.app.screens import launch_preview

    spec = parse_cluster('[[nodes]]\nname = "box"\nhost = "10.0.0.2"\n'
                         '[jobs.mnist]\nscript = "my_model/train.py"\nargs = ["--epochs", "6"]\nkeras = "tf-keras"\n'
                         '[jobs.demo]\nepochs = 5\n')
    script = launch_preview(spec.jobs["mnist"], lay_out(spec, spec.jobs["mnist"], {"box": []})).plain
    assert "script: my_model/train.py (import keras runs tf-keras) --epochs 6, image" in script
    assert "epochs," not in script and "batch" not in script  # the trainer's keys do not reach a script
    trainer = launch_preview(spec.jobs["demo"], lay_out(spec, spec.jobs["demo"], {"box": []})).plain
    assert "5 epochs, batch 64, image" in trainer


def test_the_launch_dialog_names_the_pytorch_demo_not_the_tensorflow_trainers_model():
    from homegpu.remote.plan.layout import lay_out
    from homegpu.tui.app.screens import launch_preview

    spec = parse_cluster('[[nodes]]\nname = "box"\nhost = "10.0.0.2"\n[jobs.demo]\nframework = "pytorch"\nepochs = 5\n')
    text = launch_preview(spec.jobs["demo"], lay_out(spec, spec.jobs["demo"], {"box": []})).plain
    assert text.startswith("demo  the PyTorch demo: an MLP on synthetic data, 5 epochs, batch 64 per process, image "
                           "homegpu/pytorch:2.14")
    assert "cnn" not in text and "-m homegpu.trainer.torch_demo" in text
    cnn = parse_cluster('[[nodes]]\nname = "box"\nhost = "10.0.0.2"\n[jobs.demo]\nframework = "pytorch"\n'
                        'model = "cnn"\n')
    text = launch_preview(cnn.jobs["demo"], lay_out(cnn, cnn.jobs["demo"], {"box": []})).plain
    assert text.startswith("demo  the PyTorch demo: a CNN on synthetic data, 2 epochs")


def test_the_alert_banner_holds_what_fires_and_a_clear_becomes_a_toast():
    from homegpu.remote.events import Alert, AlertCommandFailed, AlertState
    from homegpu.tui.view.render import alert_banner
    from homegpu.tui.view.state import ALERTS

    view = ClusterView(parse_cluster(THREE_NODES))
    hot = Alert("gpu_temperature", AlertState.FIRING, "big GPU 0 is at 91 °C (alert at 85 °C)", node="big", gpu=0)
    slow = Alert("straggler", AlertState.FIRING, "small is a straggler", worker="small", job="j", run_id="r1")
    assert view.apply(hot) == {ALERTS} and view.apply(slow) == {ALERTS}
    assert alert_banner(list(view.alerts.values()), 80).plain == "⚠ small is a straggler\n" \
                                                                  "⚠ big GPU 0 is at 91 °C (alert at 85 °C)"
    view.apply(Alert("gpu_temperature", AlertState.CLEARED, "big GPU 0 cooled to 70 °C", node="big", gpu=0))
    assert list(view.alerts.values()) == [slow]
    view.apply(AlertCommandFailed("notify-send", "cannot run notify-send: No such file"))
    assert list(view.notices) == [("cleared: big GPU 0 cooled to 70 °C", "information"),
                                  ("alert command failed: cannot run notify-send: No such file", "error")]
    # a new run takes the screen: the last run's alerts go (a queued run's too), a node's stay
    view.apply(hot)
    view.apply(Alert("queued_run_failed", AlertState.FIRING, "q-1 (j) failed", job="j", run_id="r1", queue_id="q-1"))
    mine = Alert("queued_run_started", AlertState.FIRING, "q-2 (j) started as run r2", job="j", run_id="r2",
                 queue_id="q-2")
    view.apply(mine)
    view.apply(JobStateChanged("j", "r2", JobState.PREFLIGHT, 1, 0))
    assert list(view.alerts.values()) == [hot, mine]


def test_the_alert_banner_fits_its_width_and_counts_the_rest():
    from homegpu.remote.events import Alert, AlertState
    from homegpu.tui.view.render import alert_banner

    alerts = [Alert("node_offline", AlertState.FIRING, f"node{i} has been offline for 2 min", node=f"node{i}")
              for i in range(5)]
    text = alert_banner(alerts, 20).plain.splitlines()
    assert text == ["⚠ node4 has been of…", "⚠ node3 has been of…", "⚠ node2 has been of…", "  and 2 more"]
    done = alert_banner([Alert("job_succeeded", AlertState.FIRING, "train (run r) succeeded")], 80)
    assert done.plain == "✓ train (run r) succeeded"


def test_a_queued_runs_success_is_good_news_its_start_news_and_its_failure_trouble():
    from homegpu.remote.events import Alert, AlertState
    from homegpu.tui.view.render import alert_banner

    def queued(state: str, message: str) -> Alert:
        return Alert(f"queued_run_{state}", AlertState.FIRING, message, job="train", run_id="r", queue_id="q-12")

    banner = alert_banner([queued("failed", "q-12 (train) failed: w1: exit 1"),
                           queued("cancelled", "q-13 (train) cancelled: after q-12, which failed"),
                           queued("started", "q-14 (train) started as run r"),
                           queued("succeeded", "q-14 (train) succeeded (run r)")], 80)
    assert banner.plain.splitlines() == ["✓ q-14 (train) succeeded (run r)", "▸ q-14 (train) started as run r",
                                         "⚠ q-13 (train) cancelled: after q-12, which failed", "  and 1 more"]
    line_styles = {banner.plain[span.start]: span.style for span in banner.spans if banner.plain[span.start] in "✓▸⚠"}
    assert line_styles == {"✓": "bold green", "▸": "bold", "⚠": "bold red"}
