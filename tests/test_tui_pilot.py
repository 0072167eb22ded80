"""The TUI driven with Textual's Pilot against the real sshd test cluster, real TensorFlow workers.

Keys are pressed as a user would; assertions read the app's widgets and its view of the cluster.
A run started elsewhere (`homegpu run --detach`) is found and followed by a TUI opened later.
node3 answers `nvidia-smi` from recorded real H100 NVL output (tests/fixtures/gpu/), as this
machine has no GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist

from gpu_replay import nvidia_smi_in
from helpers import homegpu, wait_until, worker_processes, write_config
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.events import JobState, NodeState
from homegpu.tui.app.controller import Controller
from homegpu.tui.app.main import HomegpuApp
from homegpu.tui.app.screens import ConfirmScreen, LaunchScreen, QuitScreen
from simcluster import SimCluster


FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
SIZE = (160, 48)


@pytest.fixture(scope="module")
def replaying_node3(sim_cluster: SimCluster) -> Iterator[SimCluster]:
    """node3 replays two idle H100 NVLs for this module, put back after it (the session's cluster serves others)."""
    with nvidia_smi_in(sim_cluster.node("node3").extra_path, FIXTURES / "gpus_2x_h100nvl_idle.csv",
                       FIXTURES / "apps_none.csv"):
        yield sim_cluster


def make_app(config: Path, tmp_path: Path) -> HomegpuApp:
    spec = load_cluster(config)
    return HomegpuApp(spec, Controller(spec, tmp_path / "experiments"))


def cell(app: HomegpuApp, node: str, column: str) -> str:
    return app.query_one("#nodes", DataTable).get_cell(node, column).plain


def shows(app: HomegpuApp, node: str, column: str, text: str) -> bool:
    """The table's cell starts with `text` (the table redraws once per stats interval)."""
    try:
        return cell(app, node, column).startswith(text)
    except CellDoesNotExist:  # no row yet
        return False


def all_have_stats(app: HomegpuApp) -> bool:
    return all(node.online and node.stats for node in app.view.nodes.values())


async def test_nodes_appear_online_with_cpu_stats_and_replayed_gpus(replaying_node3, cluster_toml, tmp_path):
    app = make_app(cluster_toml, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: all_have_stats(app) and app.view.nodes["node3"].stats.gpus, 60)
        assert await wait_until(lambda: shows(app, "node3", "GPU", "0 H100") and shows(app, "node1", "GPU", "CPU"), 60)
        for name in ("node1", "node2"):
            assert cell(app, name, "NODE") == f"● {name}"
            assert cell(app, name, "CPU").endswith("%")
            assert cell(app, name, "GPU") == "CPU only"
        assert cell(app, "node3", "GPU").splitlines() == ["0 H100 NVL", "1 H100 NVL"]
        assert cell(app, "node3", "POWER").splitlines() == [" 62/310W", " 62/310W"]
        await pilot.press("down", "down")  # select node3: its detail names the stats source
        detail = await wait_until(lambda: (text := str(app.query_one("#detail").render())) and "node3" in text and text,
                                  60, "node3's detail")
        assert "GPUs via nvidia-smi" in detail and "[1] NVIDIA H100 NVL" in detail
        await pilot.press("q")
        await pilot.pause(0.5)
    assert app.return_value == 0


async def test_launch_shows_logs_and_metrics_then_stop_leaves_nothing_running(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, epochs=50, steps_per_epoch=20)
    app = make_app(config, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: all_have_stats(app), 60)
        await pilot.press("l")
        assert await wait_until(lambda: isinstance(app.screen, LaunchScreen), 60)
        assert "TF_CONFIG=" in str(app.screen.query_one("#preview").render())
        await pilot.press("enter")
        assert await wait_until(lambda: app.view.job and app.view.job.state is JobState.RUNNING, 120)
        assert await wait_until(lambda: app.view.job.loss and app.view.logs.version > 0, 180), \
            "no metrics or log lines arrived"
        assert worker_processes(sim_cluster)
        await wait_until(lambda: "examples/s:" in str(app.query_one("#job").render()), 60, "the job's speed drawn")
        await pilot.press("s")
        assert await wait_until(lambda: isinstance(app.screen, ConfirmScreen), 60)
        await pilot.press("y")
        assert await wait_until(lambda: app.view.job.state is JobState.STOPPED, 60)
        assert not worker_processes(sim_cluster)
        await pilot.press("q")
        await pilot.pause(0.5)
    assert not worker_processes(sim_cluster)


async def test_a_killed_node_greys_out_while_the_others_keep_updating(sim_cluster, cluster_toml, tmp_path):
    app = make_app(cluster_toml, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: all_have_stats(app), 60)
        node2 = sim_cluster.node("node2")
        try:
            node2.kill()
            assert await wait_until(lambda: app.view.nodes["node2"].state is NodeState.OFFLINE, 60)
            seen = {name: app.view.nodes[name].stats.timestamp for name in ("node1", "node3")}
            assert await wait_until(lambda: all(app.view.nodes[n].stats.timestamp > t for n, t in seen.items()), 60)
            table = app.query_one("#nodes", DataTable)
            # the redraw follows the event at the next refresh: wait for it. The row is read whole at once: between
            # its retries the node is offline (✗), during one briefly connecting (…), greyed out in both.
            await wait_until(lambda: str(table.get_cell("node2", "CPU").style) == "dim"
                             and cell(app, "node2", "NODE") == "✗ node2", 60, "node2's row greyed out, marked offline")
            assert str(table.get_cell("node1", "CPU").style) != "dim"
        finally:
            node2.restart()
        assert await wait_until(lambda: app.view.nodes["node2"].online, 60), "node2 did not come back"
        await pilot.press("q")


async def test_a_restarted_tui_attaches_to_the_running_job_and_quitting_can_stop_it(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, epochs=50, steps_per_epoch=20)
    started = homegpu("--config", str(config), "run", "demo", "--detach", cwd=tmp_path, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        app = make_app(config, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            assert await wait_until(lambda: app.view.job and app.view.job.state is JobState.RUNNING, 60), \
                "the running job was not found"
            assert app.view.job.detail == "attached to a running job"
            assert await wait_until(lambda: app.view.logs.version > 0 and app.view.job.loss, 120), \
                "no logs or metrics from the attached job"
            await pilot.press("q")
            assert await wait_until(lambda: isinstance(app.screen, QuitScreen), 60)
            await pilot.press("s")  # stop the job, then quit
            assert await wait_until(lambda: app.return_value == 0, 60), "the app did not quit"
        assert app.view.job.state is JobState.STOPPED
    finally:
        homegpu("--config", str(config), "stop", "demo", cwd=tmp_path)
    assert not worker_processes(sim_cluster)


async def test_b_measures_the_bandwidth_with_progress_and_keeps_the_matrix(sim_cluster, cluster_toml, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    app = make_app(cluster_toml, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: all_have_stats(app), 60)
        await pilot.press("b")
        assert await wait_until(lambda: app.view.bandwidth.running and app.view.bandwidth.current, 60)
        await pilot.pause(0.5)
        assert "testing node1 → node" in str(app.query_one("#bandwidth").render())
        assert await wait_until(lambda: not app.view.bandwidth.running, 120), "the test did not finish"
        matrix = app.view.bandwidth.matrix
        assert len(matrix.results) == 6 and all(link.ok and link.gbits > 0 for link in matrix.results)
        await wait_until(lambda: "measured just now" in str(app.query_one("#bandwidth").render()), 60,
                         "the matrix's age drawn")
        await pilot.press("q")
    reopened = make_app(cluster_toml, tmp_path)  # a later TUI opens with the saved matrix
    async with reopened.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        assert reopened.view.bandwidth.matrix.at == matrix.at
        await pilot.press("q")
