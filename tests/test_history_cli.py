"""`homegpu history` over a store the real HistoryRecorder wrote: the last 40 minutes of a cluster, its GPU fed
by the agent's NVML lines recorded on a real H100 (tests/history_events.py), a run's worker on it for ten
minutes, and a node offline for five."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from helpers import homegpu
from history_events import h100_lines, owned, worker

from homegpu.remote.config import embedded_default, load_cluster
from homegpu.remote.events import NodeState, NodeStateChanged, NodeStatsUpdated
from homegpu.remote.history import HistoryRecorder, history_path
from homegpu.remote.nodes import parse_agent_line
from homegpu.tui.view.text import money


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """The embedded default's history file (this machine's node, "local"), written as serve writes it."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    now = time.time()
    start = now - 2460  # 40 minutes, the last a minute ago: no serve is recording now
    clock = {"t": start}
    recorder = HistoryRecorder(history_path(embedded_default()), clock=lambda: clock["t"])
    lines = h100_lines()
    for second in range(0, 2400, 5):
        t = start + second
        clock["t"] = t
        if second == 1200:
            recorder.handle(NodeStateChanged("local", NodeState.OFFLINE, "connection lost", at=t))
        if 1200 <= second < 1500:
            continue  # offline: no samples
        if second == 1500:
            recorder.handle(NodeStateChanged("local", NodeState.ONLINE, at=t))
        owner = worker("alice", "mnist", "mnist-1") if 300 <= second < 900 else {"kind": "process", "user": "bob",
                                                                                  "uid": 1001}
        recorder.handle(NodeStatsUpdated("local", owned(lines[second % len(lines)], [owner]), at=t))
    recorder.close()
    return now, tmp_path


def test_history_tells_gpu_use_gpu_hours_and_offline_spells(recorded):
    now, cwd = recorded
    result = homegpu("--local", "history", "--since", "1h", "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    history = json.loads(result.stdout)
    (gpu,) = history["gpus"]
    assert (gpu["node"], gpu["gpu"], gpu["name"]) == ("local", 0, "NVIDIA H100 80GB HBM3")
    assert {u for u in gpu["util"] if u is not None} == {100.0}  # the recording: a GPU at 100 % all along
    runs = {r["run_id"]: r for r in history["gpu_hours_by_run"]}
    assert runs["mnist-1"]["job"] == "mnist" and runs["mnist-1"]["user"] == "alice"
    assert runs["mnist-1"]["gpu_hours"] == pytest.approx(600 / 3600, rel=0.05)  # 10 minutes on one GPU
    users = {u["user"]: u["gpu_hours"] for u in history["gpu_hours_by_user"]}
    assert users["bob"] == pytest.approx((2400 - 600 - 300) / 3600, rel=0.05)
    (node,) = history["offline"]
    (spell,) = node["intervals"]
    assert spell["stop"] - spell["start"] == pytest.approx(300, abs=6) and spell["reason"] == "connection lost"

    text = homegpu("--local", "history", "--since", "1h", cwd=cwd).stdout
    assert "local GPU 0 NVIDIA H100 80GB HBM3" in text
    util_row, mem_row = (line for line in text.splitlines() if line.startswith(("    util ", "    mem ")))
    assert util_row.endswith("avg 100%") and mem_row.endswith(" GiB")  # each figure beside its own sparkline
    assert "max " in mem_row and "max " not in util_row
    assert "mnist  mnist-1  alice  0.17" in text
    assert "local: offline 5 min in 1 interval(s)" in text
    assert "not recording now (its last sample is from" in text  # no serve wrote in the last 30 s


def test_a_window_before_anything_was_recorded_and_a_node_filter(recorded):
    now, cwd = recorded
    narrow = json.loads(homegpu("--local", "history", "local", "--since", "30s", "--json", cwd=cwd).stdout)
    assert narrow["node"] == "local" and narrow["gpu_hours_by_run"] == []
    assert homegpu("--local", "history", "closet", cwd=cwd).stderr.startswith("homegpu: error: no node 'closet'")


def test_without_a_history_it_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "empty"))  # the homegpu subprocess inherits it
    result = homegpu("--local", "history", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "no history of cluster home yet" in result.stderr and "start `homegpu serve` to record it" in result.stderr


def test_history_tells_each_gpus_energy_its_cost_and_idle_part(tmp_path, monkeypatch):
    """A price in cluster.toml, twenty minutes of the recorded H100 (ten of them alice's run, ten with no
    process): `history` gives its kWh as the sum of the steps' trapezoids, the cost at the price, the idle half."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = tmp_path / "cluster.toml"
    config.write_text('[cluster]\nprice_per_kwh = 0.30\ncurrency = "EUR"\n\n[[nodes]]\nname = "desk"\nhost = "10.0.0.9"\n')
    now = time.time()
    start = now - 1260
    clock = {"t": start}
    recorder = HistoryRecorder(history_path(load_cluster(config)), clock=lambda: clock["t"])
    lines = h100_lines()
    watts = []
    for second in range(1200):
        clock["t"] = start + second
        line = lines[second % len(lines)]
        owners = [worker("alice", "mnist", "mnist-1")] if second < 600 else []
        stats = owned(line, owners) if owners else owned(dict(line, gpus=[dict(g, processes=[]) for g in line["gpus"]]))
        watts.append(line["gpus"][0]["power"])
        recorder.handle(NodeStatsUpdated("desk", stats, at=start + second))
    recorder.close()
    steps = [(a + b) / 2 / 3.6e6 for a, b in zip(watts, watts[1:])]

    result = homegpu("--config", str(config), "history", "--since", "1h", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    history = json.loads(result.stdout)
    (gpu,) = history["energy_by_gpu"]
    assert (gpu["node"], gpu["method"], history["currency"]) == ("desk", "integrated", "EUR")
    assert gpu["energy_kwh"] == pytest.approx(sum(steps)) and gpu["cost"] == pytest.approx(0.30 * sum(steps))
    assert gpu["idle_kwh"] == pytest.approx(sum(steps[599:]))  # from the first sample without a process on
    (run,) = [o for o in history["energy_by_owner"] if o["run_id"] == "mnist-1"]
    assert run["energy_kwh"] == pytest.approx(sum(steps[:599]))
    text = homegpu("--config", str(config), "history", "--since", "1h", cwd=tmp_path).stdout
    assert f"Energy of the GPUs (EUR at the tariff of {config})" in text
    (row,) = [line.split() for line in text.splitlines() if line.split()[:4] == ["desk", "GPU", "0", f"{sum(steps):.3f}"]]
    assert (row[4], row[6]) == (money(gpu["cost"]), money(gpu["idle_cost"])) and "0.00" not in row, text  # no cost
    # rounded away: the idle part is under a cent


def test_money_keeps_a_cost_under_a_cent():
    assert [money(x) for x in (0.0, 0.0042, 0.00917, 0.01, 0.129, 12.5)] == \
        ["0.00", "0.0042", "0.0092", "0.01", "0.13", "12.50"]


def test_a_machine_without_gpus_shows_only_the_rest_it_used(tmp_path, monkeypatch):
    """A laptop with no GPU, its idle_watts/busy_watts set: history gives its estimated energy, and says no GPU
    reported power instead of an empty GPU table."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = tmp_path / "cluster.toml"
    config.write_text('[cluster]\nprice_per_kwh = 0.30\ncurrency = "EUR"\n\n[[nodes]]\nname = "laptop"\n'
                      'host = "10.0.0.9"\nidle_watts = 20\nbusy_watts = 60\n')
    start = time.time() - 700
    recorder = HistoryRecorder(history_path(load_cluster(config)), clock=lambda: start + 650)
    for second in range(601):
        stats = parse_agent_line(json.dumps({"v": 1, "t": start + second, "source": "none", "gpus": [], "cpu": 50}))
        recorder.handle(NodeStatsUpdated("laptop", dataclasses.replace(stats, host_power=40.0), at=start + second))
    recorder.close()
    text = homegpu("--config", str(config), "history", "--since", "1h", cwd=tmp_path).stdout
    assert "no GPU reported its power in this window" in text and "USER  KWH" not in text
    (row,) = [line.split() for line in text.splitlines() if line.strip().startswith("laptop ")]
    assert row == ["laptop", f"{40 * 600 / 3.6e6:.3f}", "0.002", "estimated"]  # 0.0020 EUR: under a cent, not 0.00
