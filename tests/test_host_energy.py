"""The rest of a machine's energy (CPUs, memory, board): RAPL's counters read by the stats agent
(remote/node_side/agent/host_power.py) from a tree in the kernel's powercap format (tests/rapl.py: these VMs have
none), else the draw a node's idle_watts and busy_watts estimate from its CPU use; a run's figures, its report,
and serve's history with them."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from rapl import RaplTree
from homegpu.remote.config import ConfigError, parse_cluster
from homegpu.remote.config.tariff import Tariff
from homegpu.remote.energy import Energy
from homegpu.remote.events import NodeState, NodeStatsUpdated
from homegpu.remote.history import HOST, HistoryReader, HistoryRecorder
from homegpu.remote.node_side.agent import host_power
from homegpu.remote.nodes import parse_agent_line
from homegpu.remote.record.energy import ESTIMATED, RAPL, RunEnergy, host_energy, run_energy
from homegpu.remote.record.html_report import _energy
from homegpu.remote.record.timeline_schema import NodeTimeline, Series, Timeline
from homegpu.tui.view.render import node_detail
from homegpu.tui.view.state import NodeView

NODE_SIDE = Path(host_power.__file__).parent
NODE = '[[nodes]]\nname = "box"\nhost = "10.0.0.1"\n'


# -- RAPL on the node -------------------------------------------------------------------------------

def test_the_packages_and_dram_are_counted_not_the_core_inside_its_package(tmp_path):
    tree = RaplTree(tmp_path)  # package 30 W (its core 20 W inside it), dram 5 W
    counter = host_power.RaplCounter(str(tmp_path))
    assert sorted(Path(zone).name for zone in (z[0] for z in counter.zones)) == ["intel-rapl:0", "intel-rapl:0:2"]
    assert counter.read([]) == 0.0
    tree.advance(10)  # across the counters' wrap: they started 20 J below it
    assert counter.read([]) == pytest.approx(350.0)
    tree.advance(2)
    assert counter.read([]) == pytest.approx(420.0)


def test_psys_alone_where_a_laptop_has_it(tmp_path):
    zones = {"intel-rapl:0": ("package-0", 12.0), "intel-rapl:1": ("psys", 25.0)}  # psys holds the package
    tree = RaplTree(tmp_path, zones)
    counter = host_power.RaplCounter(str(tmp_path))
    counter.read([])
    tree.advance(4)
    assert counter.read([]) == pytest.approx(100.0)


def test_no_powercap_is_no_figure_and_no_complaint(tmp_path):
    counter = host_power.RaplCounter(str(tmp_path / "absent"))
    errors = []
    assert (counter.read(errors), counter.problem, errors) == (None, "", [])


def test_a_zone_that_stops_reading_is_said_and_the_count_goes_on_after(tmp_path):
    tree = RaplTree(tmp_path)
    counter = host_power.RaplCounter(str(tmp_path))
    energy_file = tmp_path / "intel-rapl:0:2" / "energy_uj"
    energy_file.unlink()
    errors = []
    assert counter.read(errors) is None and "intel-rapl:0:2/energy_uj" in errors[0]
    tree.advance(1)  # written again
    assert counter.read([]) == pytest.approx(35.0, abs=0.01)


def test_a_user_who_may_not_read_rapl_gets_one_line_saying_so(root):
    """Since Linux 5.10 energy_uj is root's alone (0400): the agent of an unprivileged SSH user says so once."""
    with tempfile.TemporaryDirectory() as folder:  # outside pytest's tmp_path, which only root may enter
        Path(folder).chmod(0o755)
        tree, agent = Path(folder) / "powercap", Path(folder) / "agent"  # the agent's modules, where nobody reads
        RaplTree(tree)
        for zone in tree.iterdir():
            (zone / "energy_uj").chmod(0o400)
        agent.mkdir()
        for module in ("host_power.py", "agent_common.py"):
            shutil.copy(NODE_SIDE / module, agent / module)
        code = (f"import sys; sys.path.insert(0, {str(agent)!r}); import host_power; "
                f"counter = host_power.RaplCounter({str(tree)!r}); print(counter.problem); print(counter.read([]))")
        done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-I",
                               "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    problem, reading = done.stdout.splitlines()
    assert problem.startswith(f"rapl: {tree}/intel-rapl:0/energy_uj: ") and "root only since Linux 5.10" in problem
    assert "idle_watts" in problem and reading == "None"


def test_the_agent_line_carries_the_counter():
    line = json.dumps({"v": 1, "t": 1.0, "source": "none", "gpus": [], "cpu": 12.5, "host_energy": 1234.5})
    assert parse_agent_line(line).host_energy == 1234.5
    assert str(parse_agent_line(line.replace('"host_energy": 1234.5', '"host_energy": null')).host_energy) == "n/a"


# -- the estimate -----------------------------------------------------------------------------------

def test_idle_and_busy_watts_estimate_linearly_from_cpu_use():
    node = parse_cluster(NODE + "idle_watts = 40\nbusy_watts = 140\n").nodes[0]
    assert [node.host_watts(cpu) for cpu in (0, 25, 100, 130)] == [40, 65, 140, 140]
    assert parse_cluster(NODE + "idle_watts = 35\n").nodes[0].host_watts(80) == 35  # no busy figure: flat
    assert parse_cluster(NODE).nodes[0].host_watts(50) is None  # nothing set: GPU only


@pytest.mark.parametrize(("keys", "words"), [
    ("busy_watts = 100\n", "busy_watts without idle_watts; set idle_watts too"),
    ("idle_watts = 90\nbusy_watts = 60\n", "busy_watts 60 is below idle_watts 90"),
    ("idle_watts = -5\n", "idle_watts: must be from 0 to 10000 W, got -5"),
    ('idle_watts = "40 W"\n', "idle_watts: expected a number"),
])
def test_bad_watts_are_one_line_naming_the_key(keys, words):
    with pytest.raises(ConfigError) as caught:
        parse_cluster(NODE + keys)
    assert words in str(caught.value) and "\n" not in str(caught.value)


# -- a run's figures --------------------------------------------------------------------------------

def node_timeline(name: str, times, host_energy=None, host_power=None) -> NodeTimeline:
    none = [None] * len(times)
    return NodeTimeline(name, Series(tuple(times), tuple(none)), Series(tuple(times), tuple(none)), None, (),
                        Series(tuple(times), tuple(host_energy or none)), Series(tuple(times), tuple(host_power or none)))


def test_a_run_counts_rapl_where_read_the_estimate_elsewhere_and_names_each():
    times = [float(t) for t in range(0, 61)]
    rapl = node_timeline("desk", times, host_energy=[5000 + 45 * t for t in times])  # 45 W by its counters
    estimated = node_timeline("closet", times, host_power=[80.0] * len(times))
    neither = node_timeline("laptop", times)
    energy = run_energy(Timeline({}, 0.0, 60.0, (rapl, estimated, neither), (), ()), Tariff(0.30, "EUR"))
    assert set(energy.hosts) == {"desk", "closet"}
    assert (energy.hosts["desk"].joules, energy.hosts["desk"].method) == (pytest.approx(45 * 60), RAPL)
    assert (energy.hosts["closet"].joules, energy.hosts["closet"].method) == (pytest.approx(80 * 60), ESTIMATED)
    assert energy.total.cost == pytest.approx((45 + 80) * 60 / 3.6e6 * 0.30)
    line = energy.line()
    assert line.startswith(f"energy {125 * 60 / 3.6e6:.4g} kWh (desk ") and "rest of desk" in line
    assert f"rest of closet {80 * 60 / 3.6e6:.4g} kWh {ESTIMATED}" in line and line.endswith(" EUR")


def test_a_gap_in_the_host_samples_is_not_filled():
    times = [0.0, 1.0, 2.0, 40.0, 41.0]
    found = host_energy(node_timeline("desk", times, host_power=[100.0] * 5))
    assert (found.joules, found.gap_seconds) == (pytest.approx(300.0), 38.0)


def test_the_report_shows_each_part_and_gpu_only():
    gpus_only = RunEnergy({"gpu1": _energy_of(3.6e6)}, Tariff())
    both = RunEnergy({"gpu1": _energy_of(3.6e6)}, Tariff(0.5, "EUR"), hosts={"gpu1": _energy_of(1.8e6, RAPL)})
    assert "GPU only" in _energy(gpus_only) and "set price_per_kwh" in _energy(gpus_only).lower()
    html = _energy(both)
    assert "<td>1.5</td>" in html.replace(' class="num"', "") and "0.75 EUR" in html and RAPL in html


def _energy_of(joules: float, method: str = "integrated from power samples"):
    return Energy(joules, 60.0, 0.0, joules / 3.6e6 * 0.5, method)


# -- serve's history --------------------------------------------------------------------------------

def stats(t: float, cpu: float, host_energy=None, host_power=None) -> NodeStatsUpdated:
    line = {"v": 1, "t": t, "source": "none", "gpus": [], "cpu": cpu, "host_energy": host_energy}
    parsed = parse_agent_line(json.dumps(line))
    if host_power is not None:
        parsed = replace(parsed, host_power=host_power)
    return NodeStatsUpdated("desk" if host_energy is not None else "closet", parsed, at=t)


def test_the_history_keeps_each_machines_rest_with_how_and_its_counter(tmp_path):
    path, t0 = tmp_path / "history.sqlite", 1_790_000_000.0
    recorder = HistoryRecorder(path, clock=lambda: t0 + 120)
    for k in range(61):
        recorder.handle(stats(t0 + k, 10, host_energy=100.0 + 30 * k))  # RAPL: 30 W
        recorder.handle(stats(t0 + k, 50, host_power=90.0))  # estimated: 90 W
    recorder.write()
    totals = {(node, gpu): joules for node, gpu, _, _, joules in recorder.energy_totals()}
    assert totals == {("desk", HOST): pytest.approx(1800.0), ("closet", HOST): pytest.approx(5400.0)}
    recorder.close()
    with HistoryReader(path, clock=lambda: t0 + 120) as reader:
        hosts = {e.node: e for e in reader.host_energy(t0, t0 + 120, Tariff(0.40, "EUR"))}
    assert (hosts["desk"].energy_kwh * 3.6e6, hosts["desk"].method) == (pytest.approx(1800.0), "rapl")
    assert (hosts["closet"].energy_kwh * 3.6e6, hosts["closet"].method) == (pytest.approx(5400.0), "estimated")
    assert hosts["closet"].cost == pytest.approx(5400 / 3.6e6 * 0.40)
    again = HistoryRecorder(path, clock=lambda: t0 + 130)  # serve started again: the counters go on from there
    assert {(node, gpu) for node, gpu, *_ in again.energy_totals()} == {("desk", HOST), ("closet", HOST)}
    again.close()



# -- the TUI ------------------------------------------------------------------------------------------

def test_the_node_detail_shows_the_estimated_draw_of_a_machine_without_gpus():
    line = json.dumps({"v": 1, "t": 1.0, "source": "none", "gpus": [], "cpu": 50})
    laptop = NodeView("laptop", "laptop.local", NodeState.ONLINE, stats=replace(parse_agent_line(line), host_power=40.0))
    power = [row for row in node_detail(laptop, 80).plain.splitlines() if row.startswith("power ")]
    assert power == ["power 40 W now (the machine, estimated)"]
    laptop.stats = parse_agent_line(line)  # no estimate: nothing said about power
    assert not [row for row in node_detail(laptop, 80).plain.splitlines() if row.startswith("power ")]
