"""GPU health (issue 35, step 1): what the agent reads from NVML and nvidia-smi, how the controller
parses it, the judgement in words, and `status --json`'s keys.

No recording of throttling hardware exists (the H100 recordings in tests/fixtures/gpu/h100-80gb-hbm3
predate these fields), so every figure below is built from documented values: NVML's
nvmlClocksEventReason* bits (checked against pynvml's own constants), the functions' documented
meanings (nvmlDeviceGetMaxPcieLinkWidth: "possible with this device and system"), and the CSV that
nvidia-smi's documented --help-query-gpu fields give with --format=csv,noheader,nounits. PCIe traffic is
nvmlDeviceGetPcieThroughput's documented KB/s, which nvidia-smi's --query-gpu does not have.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from homegpu.remote.events import NA, GpuStats, NodeStats, PcieLink
from homegpu.remote.node_side.agent import gpu_health, stats_agent
from homegpu.remote.node_side.agent.gpu_nvml import NvmlReader, read_nvml
from homegpu.remote.node_side.agent.smi_parse import HEALTH_QUERY_OLDER, parse_nvidia_smi_health
from homegpu.remote.nodes import GpuHealth, ReasonTimer, StatsParseError, held_back, parse_agent_line
from homegpu.tui.view.text import format_status, status_json
from gpu_replay import FORMAT, HEALTH_QUERY, is_loop, replay_calls
import test_stats_agent
from test_stats_agent import H100_NVL, LONG_INTERVAL, FakeNvml, FakeNVMLError, lines_within

smi_agents = test_stats_agent.smi_agents  # the fixture that starts and closes streaming agents
BUS_ID = "00000000:2D:00.0"  # NVML's and nvidia-smi's spelling; Linux's is 0000:2d:00.0


@pytest.fixture
def sysfs(tmp_path, monkeypatch) -> Path:
    """A /sys/bus/pci/devices of the test's own, with the card at BUS_ID able to do x16."""
    root = tmp_path / "sys-pci"
    (root / "0000:2d:00.0").mkdir(parents=True)
    (root / "0000:2d:00.0" / "max_link_width").write_text("16\n")
    monkeypatch.setattr(gpu_health, "SYSFS_PCI", str(root))
    return root


# --- the reasons' names ---------------------------------------------------------------------------

PYNVML_NAMES = {  # our name -> pynvml's constant, whose value must be our bit
    "gpu_idle": "GpuIdle", "applications_clocks": "ApplicationsClocksSetting", "sw_power_cap": "SwPowerCap",
    "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost", "sw_thermal": "SwThermalSlowdown",
    "hw_thermal": "HwThermalSlowdown", "hw_power_brake": "HwPowerBrakeSlowdown",
    "display_clocks": "DisplayClockSetting", "board_limit": "BoardLimit", "reliability": "Reliability",
}


@pytest.mark.parametrize("bit, name", gpu_health.THROTTLE_REASONS)
def test_reason_bits_are_pynvmls(bit: int, name: str) -> None:
    assert getattr(pynvml, "nvmlClocksThrottleReason" + PYNVML_NAMES[name]) == bit
    event = getattr(pynvml, "nvmlClocksEventReason" + PYNVML_NAMES[name], None)
    assert event in (None, bit)  # the newer names lack the last two bits


def test_a_bitmask_reads_as_names_in_bit_order_unknown_bits_by_value() -> None:
    assert gpu_health.throttle_names(0x44) == ["sw_power_cap", "hw_thermal"]
    assert gpu_health.throttle_names(0x0) == []
    assert gpu_health.throttle_names(0x1 | 0x800) == ["gpu_idle", "bit_0x800"]
    assert gpu_health.throttle_names(None) is None and gpu_health.throttle_names(True) is None


# --- NVML -----------------------------------------------------------------------------------------

def throttled(base: dict, **health) -> dict:
    """A fake GPU with health readings: a card of PCIe 4.0 in a 4.0 x16 slot running 4.0 x16, sending 1.25 GB/s
    and receiving 24.5 MB/s (NVML's KB/s)."""
    return {**base, **dict(reasons=0x4, mem_clock=2619, sm_max=1785, mem_max=2619, gen=4, width=16, max_gen=4,
                           max_width=16, gpu_max_gen=4, pci=SimpleNamespace(busId=BUS_ID.encode()),
                           pcie_tx=1_250_000, pcie_rx=24_500), **health}


def test_nvml_health_of_a_power_capped_gpu(sysfs) -> None:
    errors: list[str] = []
    [gpu] = read_nvml(FakeNvml([throttled(H100_NVL[0])], "550.54.14", 12040), errors)
    assert (gpu["throttle"], gpu["mem_clock"], gpu["sm_clock_max"], gpu["mem_clock_max"]) == (
        ["sw_power_cap"], 2619, 1785, 2619)
    assert gpu["pcie"] == {"gen": 4, "width": 16, "max_gen": 4, "max_width": 16, "gpu_max_gen": 4,
                           "gpu_max_width": 16, "tx_mbs": 1250.0, "rx_mbs": 24.5}
    assert gpu["bus_id"] == BUS_ID  # what the agent matches the kernel log's XIDs to
    assert errors == []


def test_nvml_health_readings_a_card_lacks_are_null_alone(sysfs) -> None:
    """NVMLError_NotSupported (here a GeForce without the GPU's own generation, max clocks or PCIe traffic)."""
    card = throttled(H100_NVL[0], gpu_max_gen=FakeNVMLError("Not Supported"), sm_max=FakeNVMLError("x"),
                     pcie_tx=FakeNVMLError("Not Supported"))
    errors: list[str] = []
    [gpu] = read_nvml(FakeNvml([card], "550.54.14", 12040), errors)
    assert gpu["pcie"]["gpu_max_gen"] is None and gpu["sm_clock_max"] is None
    assert gpu["pcie"]["tx_mbs"] is None and gpu["pcie"]["rx_mbs"] == 24.5
    assert gpu["pcie"]["gen"] == 4 and gpu["throttle"] == ["sw_power_cap"] and errors == []


class OlderPynvml(FakeNvml):
    """A pynvml before the reasons' rename: only nvmlDeviceGetCurrentClocksThrottleReasons."""

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return handle["reasons"]

    def __getattr__(self, name):
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        return super().__getattr__(name)


def test_an_older_pynvml_reads_the_reasons_by_their_former_name(sysfs) -> None:
    [gpu] = read_nvml(OlderPynvml([throttled(H100_NVL[0], reasons=0x41)], "535.0", 12020))
    assert gpu["throttle"] == ["gpu_idle", "hw_thermal"]


def test_nvml_health_is_asked_every_nth_read_and_carried_between(sysfs) -> None:
    nvml = FakeNvml([throttled(H100_NVL[0])], "550.54.14", 12040)
    reader = NvmlReader(nvml, health_every=5)
    lines = [reader.read([])[0] for _ in range(12)]
    assert nvml.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 3  # reads 1, 6 and 11
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 6  # 20 ms each: both ways on the same reads only
    assert nvml.calls["nvmlDeviceGetMaxPcieLinkWidth"] == 1  # what the card and slot can do: once
    assert all(gpus[0]["pcie"]["gen"] == 4 for gpus in lines)
    nvml.devices[0]["gen"] = 1  # the card went idle and dropped its link
    assert [reader.read([])[0][0]["pcie"]["gen"] for _ in range(5)] == [4, 4, 4, 1, 1]  # read 16 asks


def test_a_streaming_agents_first_nvml_read_leaves_health_to_the_second(sysfs) -> None:
    """The first line is what a node's first screen waits for: none of health's ten calls a GPU on it."""
    nvml = FakeNvml([throttled(H100_NVL[0])], "550.54.14", 12040)
    reader = NvmlReader(nvml, health_every=5, light_first=True)
    [first], *_ = reader.read([])
    assert nvml.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 0 and first["util"] is not None
    assert first["throttle"] is None and first["pcie"]["gen"] is None and first["bus_id"] is None
    [second], *_ = reader.read([])
    assert nvml.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 1 and second["pcie"]["gen"] == 4
    for _ in range(5):
        reader.read([])
    assert nvml.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 2  # then every 5th read, as without it: read 7


# --- nvidia-smi -----------------------------------------------------------------------------------

# Rows as nvidia-smi prints HEALTH_QUERY's documented fields with --format=csv,noheader,nounits: a
# card throttled by heat and power (0x44) on a riser at 3.0 x1, and a GeForce that reports neither
# reasons nor its own generation.
HEALTH_CSV = (
    "GPU-806f8ea2-6428-1096-a076-bb687fb45fb0, 00000000:2D:00.0, 0x0000000000000044, 2619, 1785, 2619, 3, 1, 4, 16, 4\n"
    "GPU-db6d02a2-1413-eccf-8a17-d99eac29d365, 00000000:41:00.0, [Not Supported], 7000, [N/A], 7000, 4, 16, 4, 16, "
    "[N/A]\n"
)


def test_smi_health_rows_read_as_nvmls(sysfs) -> None:
    errors: list[str] = []
    found = parse_nvidia_smi_health(HEALTH_CSV, errors=errors, card_max_width=gpu_health.card_max_width)
    riser, geforce = found[H100_NVL[0]["uuid"]], found[H100_NVL[1]["uuid"]]
    assert riser == {"throttle": ["sw_power_cap", "hw_thermal"], "mem_clock": 2619, "sm_clock_max": 1785,
                     "mem_clock_max": 2619, "pcie": {"gen": 3, "width": 1, "max_gen": 4, "max_width": 16,
                                                     "gpu_max_gen": 4, "gpu_max_width": 16, "tx_mbs": None,
                                                     "rx_mbs": None},  # no --query-gpu field for the traffic
                     "bus_id": "00000000:2D:00.0"}
    assert (geforce["throttle"], geforce["sm_clock_max"], geforce["pcie"]["gpu_max_gen"]) == (None, None, None)
    assert geforce["pcie"]["gpu_max_width"] is None  # 0000:41:00.0 is not in this sysfs
    assert errors == []


def test_smi_health_of_an_older_driver_without_gpumax() -> None:
    row = "GPU-1, 00000000:01:00.0, 0x0000000000000001, 405, 1911, 5001, 1, 16, 3, 16\n"
    [health] = parse_nvidia_smi_health(row, HEALTH_QUERY_OLDER).values()
    assert health["throttle"] == ["gpu_idle"] and health["pcie"]["max_gen"] == 3
    assert health["pcie"]["gpu_max_gen"] is None


def test_the_stream_goes_on_where_nvidia_smi_refuses_the_health_query(tmp_path: Path, smi_agents) -> None:
    """The recorded fixtures answer no health query (the replay exits 2): null figures, no error,
    and the refused query is not asked again every health period."""
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, "--health-interval", "0.1")
    lines = agent.lines(8)
    assert all(len(stats.gpus) == 2 and stats.errors == () for stats in lines), [s.errors for s in lines]
    assert all(gpu.throttle is None and gpu.pcie == PcieLink() for stats in lines for gpu in stats.gpus)
    assert len(agent.runs((HEALTH_QUERY, FORMAT))) == 1  # then the older spelling, then a pause


def test_the_stream_carries_the_health_nvidia_smi_answers(tmp_path: Path, smi_agents) -> None:
    health = tmp_path / "health.csv"
    health.write_text(HEALTH_CSV)
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, "--health-interval", "0.5",
                       health_fixture=health)
    lines = agent.lines(12)
    assert all(stats.errors == () for stats in lines)
    for stats in lines:  # the first one too: a one-shot reader (status) takes it
        riser, geforce = stats.gpus
        assert riser.throttle == ("sw_power_cap", "hw_thermal") and geforce.throttle is None
        assert (riser.pcie.gen, riser.pcie.width, riser.mem_clock, riser.sm_clock_max) == (3, 1, 2619, 1785)
    loops = [run for _, run in replay_calls(agent.log) if run[:2] == (HEALTH_QUERY, FORMAT) and is_loop(run)]
    assert loops == [(HEALTH_QUERY, FORMAT, "--loop-ms=500")]  # one loop child at the health period
    assert_the_loop_carried(agent, lines, 0.5)  # after the first line's one-shot, which finds the spelling


def test_a_light_first_line_says_health_is_to_come_and_the_next_line_brings_it(tmp_path: Path,
                                                                               smi_agents) -> None:
    """With --light-first (a screen that keeps updating: the TUI, serve) the first line waits for no health query and
    says health is to come; the next line, an interval later, has what nvidia-smi answers."""
    health = tmp_path / "health.csv"
    health.write_text(HEALTH_CSV)
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, "--interval", "0.3", "--light-first",
                       health_fixture=health)
    first, full = [parse_agent_line(json.dumps(line)) for line in lines_within(agent.proc, 2, 60)]
    assert first.health_pending and all(gpu.throttle is None and gpu.pcie == PcieLink() for gpu in first.gpus)
    riser, geforce = full.gpus
    assert not full.health_pending and riser.throttle == ("sw_power_cap", "hw_thermal") and riser.pcie.gen == 3


def test_the_health_loop_child_follows_the_card(tmp_path: Path, smi_agents) -> None:
    """The loop child of the health query (not more one-shots) brings the next reading: the riser's card
    cools down and its reasons clear within a few health periods."""
    health = tmp_path / "health.csv"
    health.write_text(HEALTH_CSV)
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, "--health-interval", "0.3",
                       health_fixture=health, reread=True)
    agent.lines_until(lambda seen: seen and seen[-1].gpus[0].throttle == ("sw_power_cap", "hw_thermal"))
    health.write_text(HEALTH_CSV.replace("0x0000000000000044", "0x0000000000000000"))
    lines = agent.lines_until(lambda seen: seen and seen[-1].gpus[0].throttle == ())
    assert_the_loop_carried(agent, lines, 0.3)


def assert_the_loop_carried(agent, lines: list, health_interval: float) -> None:
    """Most health periods were read from the loop child: a one-shot query stands in only while the loop has
    nothing fresh (its start, or a slow iteration on a busy machine), so one-shots are counted against the
    periods the lines span, not held to one (the first line's), which a loaded machine does not keep."""
    periods = (lines[-1].timestamp - lines[0].timestamp) / health_interval
    one_shots = len(agent.runs((HEALTH_QUERY, FORMAT)))
    assert 1 <= one_shots <= 1 + periods / 2, f"{one_shots} one-shot health queries in {periods:.0f} health periods"


# --- the controller's parser ----------------------------------------------------------------------

def line(**gpu_keys) -> str:
    gpu = {"index": 0, "name": "NVIDIA H100 NVL", "uuid": "GPU-1", "util": 97, **gpu_keys}
    return json.dumps({"v": stats_agent.PROTOCOL_VERSION, "t": 1.0, "source": "nvml", "gpus": [gpu]})


def test_health_keys_parse_and_an_older_agents_line_has_none() -> None:
    [gpu] = parse_agent_line(line(throttle=["hw_thermal"], mem_clock=2619, sm_clock_max=1785, mem_clock_max=2619,
                                  pcie={"gen": 4, "width": 16, "max_gen": 4, "max_width": 16,
                                        "gpu_max_gen": 4, "gpu_max_width": None})).gpus
    assert (gpu.throttle, gpu.mem_clock, gpu.sm_clock_max, gpu.mem_clock_max) == (("hw_thermal",), 2619, 1785, 2619)
    assert gpu.pcie == PcieLink(4, 16, 4, 16, 4, NA)
    [old] = parse_agent_line(line()).gpus
    assert (old.throttle, old.mem_clock, old.pcie) == (None, NA, PcieLink())


@pytest.mark.parametrize("keys, field", [
    ({"throttle": "hw_thermal"}, "gpus[0].throttle"),
    ({"throttle": [4]}, "gpus[0].throttle"),
    ({"mem_clock": "2619"}, "gpus[0].mem_clock"),
    ({"sm_clock_max": True}, "gpus[0].sm_clock_max"),
    ({"pcie": [4, 16]}, "gpus[0].pcie"),
    ({"pcie": {"gen": "4"}}, "gpus[0].pcie.gen"),
])
def test_health_keys_of_the_wrong_type_are_refused_by_name(keys: dict, field: str) -> None:
    with pytest.raises(StatsParseError, match=re.escape(f"stats line: {field}: expected")):
        parse_agent_line(line(**keys))


# --- the judgement --------------------------------------------------------------------------------

def gpu(util=97, throttle=(), temp=70, sm=1785, sm_max=1785, power_limit=350.0, **link) -> GpuStats:
    """A GPU under load by default, on a healthy 4.0 x16 link of a 4.0 x16 card."""
    pcie = PcieLink(**{"gen": 4, "width": 16, "max_gen": 4, "max_width": 16, "gpu_max_gen": 4,
                       "gpu_max_width": 16, **link})
    return GpuStats(index=1, name="NVIDIA GeForce RTX 3090", uuid="GPU-1", util=util, mem_used=20000,
                    mem_total=24576, temp=temp, power=340.0, power_limit=power_limit, sm_clock=sm,
                    throttle=throttle, sm_clock_max=sm_max, pcie=pcie)


def test_a_healthy_gpu_under_load_is_not_held_back() -> None:
    assert held_back(gpu()) == []
    assert held_back(gpu(throttle=None)) == []  # reasons unknown, clocks at their maximum


def test_an_idle_gpu_dropping_its_link_is_not_flagged_but_under_load_it_is() -> None:
    assert held_back(gpu(util=0, throttle=("gpu_idle",), sm=210, gen=1)) == []
    assert held_back(gpu(util=97, gen=1)) == [
        "GPU 1 runs PCIe 1.0 x16 of 4.0 x16: a riser or a card not fully seated; seat it in the slot itself"]


def test_a_riser_at_x1_is_named() -> None:
    assert held_back(gpu(gen=3, width=1)) == [
        "GPU 1 runs PCIe 3.0 x1 of 4.0 x16: a riser or a card not fully seated; seat it in the slot itself"]


def test_a_x16_card_in_a_x4_slot_is_the_slot_and_a_x4_card_is_fine() -> None:
    """NVML's max width is what card and slot can do together; the card's own comes from sysfs."""
    assert held_back(gpu(width=4, max_width=4, gpu_max_width=16)) == [
        "GPU 1's slot allows PCIe 4.0 x4 of the card's 4.0 x16: the board's second slot or an older board; "
        "move it to the first x16 slot"]
    assert held_back(gpu(width=4, max_width=4, gpu_max_width=4)) == []
    assert held_back(gpu(width=4, max_width=4, gpu_max_width=NA)) == []  # not known: not guessed


def test_a_gen4_card_in_a_gen3_slot_is_the_slot() -> None:
    assert held_back(gpu(gen=3, max_gen=3, gpu_max_gen=4))[0].startswith(
        "GPU 1's slot allows PCIe 3.0 x16 of the card's 4.0 x16")


def test_thermal_and_power_cap_are_told_apart_with_their_fixes() -> None:
    assert held_back(gpu(throttle=("hw_thermal",), temp=87, sm=1200, sm_max=1860)) == [
        "GPU 1 thermal slowdown at 87 °C: clocks 1,200 of 1,860 MHz; improve the case's airflow"]
    assert held_back(gpu(throttle=("sw_power_cap",), sm=1400, sm_max=1980, power_limit=250.0)) == [
        "GPU 1 power cap: clocks 1,400 of 1,980 MHz at its 250 W limit; raise the limit (nvidia-smi -pl) "
        "or accept it"]


def test_hw_and_sw_thermal_slowdown_together_are_one_sentence() -> None:
    """A hot card often reports both thermal reasons: a person is told one cause, once (status printed it twice)."""
    both = gpu(throttle=("sw_thermal", "hw_thermal", "sw_power_cap"), temp=87, sm=1200, sm_max=1860, power_limit=250.0)
    causes = held_back(both)
    assert [cause.split(":")[0] for cause in causes] == ["GPU 1 thermal slowdown at 87 °C", "GPU 1 power cap"]
    timer, key = ReasonTimer(), ("node1", "GPU-1")
    timer.update(key, gpu(throttle=("hw_thermal",), temp=87), 100.0)
    held = timer.update(key, both, 120.0)  # hw_thermal held 20 s, the other two since now: not yet held
    assert held_back(both, held, since={"hw_thermal": "12:04", "sw_thermal": "12:05"}) == [
        "GPU 1 thermal slowdown at 87 °C since 12:04: clocks 1,200 of 1,860 MHz; improve the case's airflow"]


def test_idle_as_a_reason_is_never_a_cause_and_a_slow_clock_without_reason_is() -> None:
    assert held_back(gpu(throttle=("gpu_idle",))) == []
    [cause] = held_back(gpu(throttle=(), sm=900, sm_max=1980))
    assert cause.startswith("GPU 1 runs at clocks 900 of 1,980 MHz under load with no clock event reason")


def test_a_reason_active_for_a_moment_is_not_flagged_one_held_is() -> None:
    timer, hot, cool = ReasonTimer(), gpu(throttle=("hw_thermal",), temp=87), gpu()
    key = ("node1", "GPU-1")
    assert held_back(hot, timer.update(key, hot, 100.0)) == []
    assert held_back(hot, timer.update(key, hot, 104.0)) == []  # one health reading, carried 4 s
    assert held_back(cool, timer.update(key, cool, 105.0)) == []
    assert held_back(hot, timer.update(key, hot, 106.0)) == []  # a break starts it again
    assert held_back(hot, timer.update(key, hot, 115.0))[0].startswith("GPU 1 thermal slowdown at 87 °C")


# --- status --json ---------------------------------------------------------------------------------

def node_with(gpus: tuple[GpuStats, ...]) -> SimpleNamespace:
    stats = parse_agent_line(line())
    return SimpleNamespace(name="node1", spec=SimpleNamespace(host="node1"), address="10.0.0.2",
                           address_source="ssh config", state=SimpleNamespace(value="online"), reason="",
                           fingerprint="SHA256:x", latest=replace(stats, gpus=gpus))


def test_status_json_gives_throttle_clocks_pcie_and_held_back() -> None:
    riser = replace(gpu(throttle=("sw_power_cap",), sm=1400, sm_max=1980, gen=3, width=1), mem_clock=9501,
                    mem_clock_max=9751)
    unknown = replace(gpu(throttle=None, sm=345, util=0), sm_clock_max=NA, pcie=PcieLink())
    obj = status_json("home", [node_with((riser, unknown))], 1.0)
    first, second = json.loads(json.dumps(obj))["nodes"][0]["stats"]["gpus"]
    assert first["throttle"] == ["sw_power_cap"]
    assert first["clocks"] == {"sm": 1400, "sm_max": 1980, "mem": 9501, "mem_max": 9751}
    assert first["pcie"] == {"gen": 3, "width": 1, "max_gen": 4, "max_width": 16, "gpu_max_gen": 4,
                             "gpu_max_width": 16, "tx_mbs": None, "rx_mbs": None}
    assert [cause.split(":")[0] for cause in first["held_back"]] == [
        "GPU 1 power cap", "GPU 1 runs PCIe 3.0 x1 of 4.0 x16"]
    assert second["throttle"] is None and second["held_back"] == []
    assert second["clocks"] == {"sm": 345, "sm_max": None, "mem": None, "mem_max": None}
    assert set(second["pcie"].values()) == {None}
    assert "mem_clock" not in first and "sm_clock_max" not in first  # in "clocks" only


def test_status_text_says_what_holds_a_gpu_back_under_its_line() -> None:
    text = format_status([node_with((gpu(gen=3, width=1),))])
    assert "\n        held back: GPU 1 runs PCIe 3.0 x1 of 4.0 x16" in text
    assert "held back" not in format_status([node_with((gpu(),))])



def test_status_watched_judges_a_reason_once_held_as_the_tui_does(utc) -> None:
    """status once has one reading and names every active reason in it; status --watch has the node's session,
    which judged each line as it came (GpuHealth): a reason counts once held a few seconds, and says since when."""
    node = node_with((gpu(throttle=("hw_thermal",), temp=87, sm=1200, sm_max=1860),))
    node.health = GpuHealth()
    first = node.latest
    node.health.take(first)
    assert "held back: GPU 1 thermal slowdown at 87 °C: clocks 1,200 of 1,860 MHz" in format_status([node])
    assert "held back" not in format_status([node], watched=True)  # one moment is not yet held
    node.latest = replace(first, timestamp=first.timestamp + 10)
    node.health.take(node.latest)
    since = time.strftime("%H:%M", time.gmtime(first.timestamp))
    assert f"held back: GPU 1 thermal slowdown at 87 °C since {since}" in format_status([node], watched=True)
    (watched,) = status_json("home", [node], 1.0, watched=True)["nodes"][0]["stats"]["gpus"]
    assert watched["held_back"][0].startswith(f"GPU 1 thermal slowdown at 87 °C since {since}")


# --- a node's GPUs judged line by line (the session's GpuHealth) ------------------------------------

@pytest.fixture
def utc(monkeypatch) -> None:
    """Local time is UTC, so "since HH:MM" reads the same on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def stats_at(at: float, *gpus: GpuStats) -> NodeStats:
    return replace(parse_agent_line(line()), timestamp=at, gpus=gpus)


def test_a_nodes_health_says_since_when_a_held_reason_holds_each_gpu_back(utc) -> None:
    """09:00:00 UTC is 1_795_338_000; GPU 1 hot from then on, GPU 0 beside it healthy."""
    health, start = GpuHealth(), 1_795_338_000.0
    cool, hot = replace(gpu(), index=0, uuid="GPU-0"), gpu(throttle=("hw_thermal",), temp=87, sm=1200, sm_max=1860)
    assert health.causes() == []  # no line yet
    health.take(stats_at(start, cool, hot))
    assert health.causes() == []  # one reading: a moment
    health.take(stats_at(start + 65, cool, hot))
    assert health.causes() == [
        "GPU 1 thermal slowdown at 87 °C since 09:00: clocks 1,200 of 1,860 MHz; improve the case's airflow"]
    assert health.causes([0]) == [] and health.causes([1]) == health.causes()  # a worker's own GPUs only
    health.take(stats_at(start + 70, cool, gpu()))
    health.take(stats_at(start + 200, cool, hot))
    health.take(stats_at(start + 210, cool, hot))
    assert health.causes()[0].startswith("GPU 1 thermal slowdown at 87 °C since 09:03:")  # a break starts it again
