"""What holds a GPU back, on the test LAN: node3's nvidia-smi replays the H100 recorded under load, and
answers the agent's health query with a row built from nvidia-smi's documented fields (no recording of a
throttling card exists): HW thermal slowdown (bit 0x40), its link at PCIe 3.0 x1 of the 5.0 x16 that card and
slot allow. `status` and `status --json`, reached over SSH as a user runs them, name both with their fixes.
Then two machines, one GPU on a riser and one hot on a machine whose CPU is slow for real (a cgroup's quota):
the TUI in tmux marks both and says why, and a run's straggler alert names what holds the slow one back."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Iterator

import pytest

from gpu_replay import FIXTURES, HOT_ON_A_RISER, nvidia_smi_in, write_replay_nvidia_smi
from helpers import homegpu, homegpu_argv, job_table, wait_for
import test_tui_tmux

from simcluster import SimCluster
from simcpu import cpu_share, own_core

H100 = FIXTURES / "h100-80gb-hbm3"
terminal_factory = test_tui_tmux.terminal_factory  # the fixture that opens and closes tmux terminals


def test_status_names_a_hot_gpu_on_a_riser_with_the_fixes(sim_cluster: SimCluster, tmp_path):
    health = tmp_path / "health.csv"
    health.write_text(HOT_ON_A_RISER)
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml")
    with nvidia_smi_in(sim_cluster.node("node3").extra_path, H100 / "gpus_load.csv", H100 / "apps_idle.csv",
                       version_fixture=H100 / "smi_version.txt", health_fixture=health):
        as_json = homegpu("--config", str(config), "status", "--json", cwd=tmp_path)
        text = homegpu("--config", str(config), "status", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    nodes = {node["name"]: node for node in json.loads(as_json.stdout)["nodes"]}
    (gpu,) = nodes["node3"]["stats"]["gpus"]
    assert gpu["throttle"] == ["hw_thermal"] and gpu["clocks"] == {"sm": 1410, "sm_max": 1980, "mem": 2619,
                                                                   "mem_max": 2619}
    assert (gpu["pcie"]["gen"], gpu["pcie"]["width"], gpu["pcie"]["max_gen"], gpu["pcie"]["max_width"]) == (3, 1, 5, 16)
    thermal, link = gpu["held_back"]
    assert thermal == "GPU 0 thermal slowdown at 52 °C: clocks 1,410 of 1,980 MHz; improve the case's airflow"
    assert link.startswith("GPU 0 runs PCIe 3.0 x1 of 5.0 x16: a riser")
    assert f"held back: {thermal}" in text.stdout and f"held back: {link}" in text.stdout
    assert all(not g["held_back"] for name, node in nodes.items() if name != "node3" and node["stats"]
               for g in node["stats"]["gpus"])


# --- a run on two GPUs held back: one hot, one on a riser --------------------------------------------

# node1's H100 on a riser (PCIe 3.0 x1 of 5.0 x16, no reason active); node2's in HW thermal slowdown on its
# full link. Rows of nvidia-smi's documented health fields, for the H100 recorded under load.
ON_A_RISER = HOT_ON_A_RISER.replace("0x0000000000000040", "0x0000000000000000")
HOT = HOT_ON_A_RISER.replace(", 3, 1, 5, 16, 5", ", 5, 16, 5, 16, 5")
# A script's own measure of its pace: a fixed piece of CPU work per epoch, its examples/s told with
# homegpu.report's one line (a sleep stands in for the data loading around it).
PACED_SCRIPT = """\
import time
from homegpu.report import epoch_done

for epoch in range(1, 6):
    time.sleep(2.5)
    start = time.perf_counter()
    total = sum(i * i for i in range(400_000))
    epoch_done(epoch, 5, examples_per_sec=round(4096 / (time.perf_counter() - start), 1))
"""
CPU_SHARE = 15  # % of one core left to node2's processes: a slow machine, and the straggler


@pytest.fixture
def held_back_pair(lan, tmp_path) -> Iterator[tuple[SimCluster, Path]]:
    """Two machines with a replayed H100 each, node1's on a riser and node2's hot; their cluster.toml has
    the job `paced` (PACED_SCRIPT on both)."""
    (tmp_path / "paced.py").write_text(PACED_SCRIPT)
    with SimCluster(2, first_host=70, name="heldback", extra_path_nodes=["node1", "node2"]) as sim:
        for node, row in (("node1", ON_A_RISER), ("node2", HOT)):
            health = tmp_path / f"health-{node}.csv"
            health.write_text(row)
            write_replay_nvidia_smi(sim.node(node).extra_path, H100 / "gpus_load.csv", H100 / "apps_idle.csv",
                                    version_fixture=H100 / "smi_version.txt", health_fixture=health)
        jobs = {"paced": job_table(script="paced.py", nodes=["node1", "node2"])}
        yield sim, sim.write_cluster_toml(tmp_path / "cluster.toml", jobs=jobs)


def right_pane(screen: str) -> str:
    """The text of the screen's right-hand panes (the node detail), its wrapped lines joined again."""
    cells = [match.group(1).strip() for line in screen.splitlines() if (match := re.search(r"│([^│]*)│\s*$", line))]
    return " ".join(cell for cell in cells if cell)


def test_the_tui_marks_both_and_its_detail_says_why(held_back_pair, tmp_path, terminal_factory):
    sim, config = held_back_pair
    command = shlex.join(homegpu_argv("--config", str(config)))
    term = terminal_factory(command, tmp_path)
    riser = "held back: GPU 0 runs PCIe 3.0 x1 of 5.0 x16: a riser or a card not fully seated; seat it in the slot"
    detail = wait_for(lambda: riser in (text := right_pane(term.screen())) and text, 60, "node1's riser, in its detail")
    assert "thermal" not in detail  # node1 is the first row: its detail is shown
    wait_for(lambda: "node1 ▼" in (screen := term.screen()) and "node2 ▼" in screen, 30, "both rows' marks")
    term.keys("Down")  # node2's detail
    heat = re.compile(r"held back: GPU 0 thermal slowdown at 52 °C since \d\d:\d\d: clocks 1,410 of 1,980 MHz; "
                      r"improve the case's airflow")
    try:
        detail = wait_for(lambda: heat.search(text := right_pane(term.screen())) and text, 10, "node2's heat")
    except AssertionError:
        pytest.fail(f"node2's heat is not in its detail: {right_pane(term.screen())}")
    assert "riser" not in detail
    term.close()  # one tmux server at a time
    small = terminal_factory(command, tmp_path, size=(80, 24))
    small.wait_for("node2 ▼", 60)  # the detail is hidden at this size; the mark is not


def test_the_straggler_alert_names_what_holds_its_gpu_back(held_back_pair, tmp_path):
    sim, config = held_back_pair
    with own_core(sim.node("node1")), cpu_share(sim.node("node2"), CPU_SHARE):
        result = homegpu("--config", str(config), "run", "paced", "--no-tui", cwd=tmp_path, timeout=240)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = [line for line in result.stdout.splitlines() if line.startswith("== straggler: node2 runs")]
    assert alerts, result.stdout
    # An alert raised before node2's first health reading (its CPUs are slow) names no reason; once read,
    # every alert names it.
    named = [". Held back: GPU 0 thermal slowdown at 52 °C since " in line for line in alerts]
    assert named[-1] and named == sorted(named), alerts
    assert "improve the case's airflow" in alerts[-1] and "riser" not in alerts[-1]  # node1's link is not node2's
    assert not any(line.startswith("== straggler: node1") for line in result.stdout.splitlines())
    (run_dir,) = (tmp_path / "experiments").iterdir()
    assert "thermal slowdown" in (run_dir / "report.html").read_text()
