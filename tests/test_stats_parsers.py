"""The stats parsers on recorded nvidia-smi output, and the controller's agent-line parser.

Fixtures and where they were recorded: tests/fixtures/gpu/README.md.
"""

from __future__ import annotations

import copy
import json
import math
import pickle

import pytest

from homegpu.remote.events import NA, GpuProcess, GpuStats, NodeStats, NotAvailable
from homegpu.remote.node_side.agent.smi_parse import (
    LoopIterations,
    clean,
    number,
    parse_nvidia_smi_apps,
    parse_nvidia_smi_gpus,
    parse_nvidia_smi_version,
)
from homegpu.remote.nodes.stats import StatsParseError, parse_agent_line
from gpu_replay import FIXTURES

MASKED_UUID = "GPU-00000000-0000-0000-0000-000000000000"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def gpu(index, name, uuid, util, mem_used, mem_total, temp, power, power_limit, sm_clock, driver):
    return {
        "index": index, "name": name, "uuid": uuid, "util": util, "mem_used": mem_used,
        "mem_total": mem_total, "temp": temp, "power": power, "power_limit": power_limit,
        "sm_clock": sm_clock, "driver": driver,
    }


# --- nvidia-smi --query-gpu ----------------------------------------------------------------------

H100_8X = [
    ("GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1", 30, 100.89),
    ("GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd", 30, 82.81),
    ("GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f", 31, 85.98),
    ("GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14", 29, 85.48),
    ("GPU-72be6e5d-3c1b-0d37-98ac-d3ef159f2589", 28, 84.94),
    ("GPU-52378fbc-3124-3895-13b6-1dd179563e0f", 30, 85.27),
    ("GPU-83a5aebb-b71c-c570-aa83-185e1233fe97", 29, 86.05),
    ("GPU-33135771-a848-ece1-b61e-489e221d663c", 29, 75.09),
]

GPU_CASES = {
    "gpus_1x_h200_idle.csv": [
        gpu(0, "NVIDIA H200", MASKED_UUID, 0, 0, 143771, 37, 85.12, 700.0, 345, "580.173.02"),
    ],
    "gpus_1x_h100_mig_load.csv": [  # MIG mode: no utilisation
        gpu(0, "NVIDIA H100 80GB HBM3", MASKED_UUID, None, 11125, 81559, 53, 433.78, 700.0, 1980,
            "590.48.01"),
    ],
    "gpus_1x_rtx2080super_windows_load.csv": [
        gpu(0, "NVIDIA GeForce RTX 2080 SUPER", MASKED_UUID, 7, 1296, 8192, 45, 97.43, 250.0, 2055,
            "591.86"),
    ],
    "gpus_2x_h100nvl_idle.csv": [
        gpu(0, "NVIDIA H100 NVL", "GPU-806f8ea2-6428-1096-a076-bb687fb45fb0", 0, 0, 95830, 32, 61.62,
            310.0, 345, "550.54.14"),
        gpu(1, "NVIDIA H100 NVL", "GPU-db6d02a2-1413-eccf-8a17-d99eac29d365", 0, 0, 95830, 31, 62.11,
            310.0, 345, "550.54.14"),
    ],
    "gpus_8x_h100sxm_idle.csv": [
        gpu(i, "NVIDIA H100 80GB HBM3", uuid, 0, 1, 81559, temp, power, 700.0, 345, "565.57.01")
        for i, (uuid, temp, power) in enumerate(H100_8X)
    ],
}


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_query_gpu_fixtures_parse_to_recorded_values(name: str) -> None:
    errors: list[str] = []
    assert parse_nvidia_smi_gpus(fixture(name), errors) == GPU_CASES[name]
    assert errors == []


def test_query_gpu_types_are_int_where_nvidia_smi_prints_integers() -> None:
    [row] = parse_nvidia_smi_gpus(fixture("gpus_1x_h200_idle.csv"))
    assert type(row["index"]) is int and type(row["mem_total"]) is int
    assert type(row["power"]) is float and type(row["power_limit"]) is float


def test_not_supported_cells_become_none_and_recorded_ones_survive() -> None:
    """GTX 770 (Megaminer #235); only its recorded cells are asserted, see the fixture README."""
    [row] = parse_nvidia_smi_gpus(fixture("gpus_1x_gtx770_not_supported.csv"))
    assert row["name"] == "GeForce GTX 770"
    assert row["temp"] == 52
    assert row["util"] is None and row["power"] is None and row["power_limit"] is None


@pytest.mark.parametrize("name", ["garbage_no_devices.txt", "garbage_no_driver.txt"])
def test_nvidia_smi_messages_are_reported_not_parsed(name: str) -> None:
    errors: list[str] = []
    assert parse_nvidia_smi_gpus(fixture(name), errors) == []
    assert len(errors) == 1
    assert fixture(name).strip().splitlines()[0][:40] in errors[0]


@pytest.mark.parametrize("text", ["", "\n", "\n\n  \n"])
def test_empty_output_is_no_gpus_and_no_error(text: str) -> None:
    errors: list[str] = []
    assert parse_nvidia_smi_gpus(text, errors) == []
    assert parse_nvidia_smi_apps(text, errors) == {}
    assert errors == []


def test_a_bad_line_does_not_hide_the_good_ones() -> None:
    text = fixture("gpus_2x_h100nvl_idle.csv") + fixture("garbage_no_devices.txt")
    errors: list[str] = []
    assert [g["index"] for g in parse_nvidia_smi_gpus(text, errors)] == [0, 1]
    assert len(errors) == 1


# --- nvidia-smi --query-gpu --loop-ms: where one iteration ends ----------------------------------

def lines(name: str) -> list[str]:
    return fixture(name).splitlines(keepends=True)


def feed(iterations: LoopIterations, rows: list[str], errors: list[str] | None = None) -> list:
    """Feed lines one by one; return, per line, the index list of the iteration it completed."""
    errors = [] if errors is None else errors
    done = [iterations.feed(line, errors) for line in rows]
    return [None if gpus is None else [g["index"] for g in gpus] for gpus in done]


H100_NVL_ROWS = lines("gpus_2x_h100nvl_idle.csv")  # GPU 0, GPU 1
GPU0, GPU1 = H100_NVL_ROWS


def test_loop_iterations_carry_the_recorded_values() -> None:
    iterations = LoopIterations(expected=8)
    completed = [iterations.feed(line, []) for line in lines("gpus_8x_h100sxm_idle.csv") * 2]
    assert completed[:7] == [None] * 7 and completed[8:15] == [None] * 7
    assert completed[7] == completed[15] == GPU_CASES["gpus_8x_h100sxm_idle.csv"]


def test_known_count_completes_an_iteration_on_its_last_row() -> None:
    """No waiting for the next iteration: the 2nd row of 2 completes it."""
    assert feed(LoopIterations(expected=2), H100_NVL_ROWS * 3) == [None, [0, 1]] * 3


def test_unknown_count_is_learnt_when_the_first_gpu_repeats() -> None:
    assert feed(LoopIterations(), H100_NVL_ROWS * 3) == [None, None, [0, 1], [0, 1], None, [0, 1]]


def test_quiet_after_the_first_rows_ends_the_first_iteration() -> None:
    """The agent closes the iteration when the child's output goes quiet (gpu_smi.SmiLoop);
    the count is then known, so later iterations complete on their last row."""
    iterations = LoopIterations()
    assert not iterations.counting()
    assert feed(iterations, H100_NVL_ROWS) == [None, None] and iterations.counting()
    assert [gpu["index"] for gpu in iterations.close()] == [0, 1] and not iterations.counting()
    assert feed(iterations, H100_NVL_ROWS * 2) == [None, [0, 1]] * 2


def test_gpu_falling_off_the_bus_costs_one_iteration() -> None:
    """GPU 1 is gone: the lone GPU 0 row completes nothing until GPU 0 repeats, then every row."""
    assert feed(LoopIterations(expected=2), [GPU0, GPU1, GPU0, GPU0, GPU0]) == [
        None, [0, 1], None, [0], [0]]


def test_first_gpu_falling_off_the_bus_is_found_by_the_repeat_of_another() -> None:
    assert feed(LoopIterations(expected=2), [GPU0, GPU1, GPU1, GPU1, GPU1]) == [
        None, [0, 1], None, [1], [1]]


def test_gpu_coming_back_is_added_after_one_iteration() -> None:
    """GPU 1 is back: its first iteration completes when GPU 0 repeats, later ones on GPU 1."""
    assert feed(LoopIterations(expected=1), [GPU0, GPU0, GPU1, GPU0, GPU1, GPU0, GPU1]) == [
        [0], [0], None, [0, 1], [0, 1], None, [0, 1]]


def test_garbage_between_rows_is_reported_and_does_not_count() -> None:
    errors: list[str] = []
    noise = lines("garbage_no_devices.txt")
    rows = [GPU0, *noise, GPU1, "\n", GPU0, "0, truncated\n", GPU1]
    completed = feed(LoopIterations(expected=2), rows, errors)
    assert [c for c in completed if c] == [[0, 1], [0, 1]]
    assert len(errors) == len([n for n in noise if n.strip()]) + 1
    assert "truncated" in errors[-1]


# --- nvidia-smi --query-compute-apps -------------------------------------------------------------

def test_compute_apps_group_by_gpu_uuid() -> None:
    assert parse_nvidia_smi_apps(fixture("apps_1x_h100_mig_load.csv")) == {
        MASKED_UUID: [
            {"pid": 21180, "name": "/root/tools/memhog", "mem": 2296},
            {"pid": 21181, "name": "/root/tools/memhog", "mem": 1272},
            {"pid": 21198, "name": "./gpu_burn", "mem": 7484},
        ]
    }


def test_windows_apps_without_memory_keep_names_with_spaces() -> None:
    apps = parse_nvidia_smi_apps(fixture("apps_1x_rtx2080super_windows_load.csv"))[MASKED_UUID]
    assert len(apps) == 12
    assert all(app["mem"] is None for app in apps)
    assert {"pid": 20372, "name": r"C:\Program Files\NZXT CAM\NZXT CAM.exe", "mem": None} in apps


def test_no_processes_recorded_is_empty() -> None:
    assert parse_nvidia_smi_apps(fixture("apps_none.csv")) == {}


def test_version_output_gives_cuda_version() -> None:
    assert parse_nvidia_smi_version(fixture("version_h100_mig.txt")) == "13.1"
    assert parse_nvidia_smi_version(fixture("garbage_no_driver.txt")) is None


# --- cells ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "cell",
    [
        "[N/A]", " [N/A] ", "[Not Supported]", "N/A", "", "   ",
        "[Requested functionality has been deprecated]",  # recorded in the H100 MIG capture
    ],
)
def test_not_available_cells(cell: str) -> None:
    assert clean(cell) is None
    assert number(cell) is None


@pytest.mark.parametrize(
    ("cell", "expected"),
    [("700.00", 700.0), (" 81559", 81559), ("0", 0), ("-8", -8), ("P0", None), ("nan", None),
     ("inf", None), ("1e400", None)],
)
def test_number_cells(cell: str, expected: float | None) -> None:
    assert number(cell) == expected


# --- NA --------------------------------------------------------------------------------------------

def test_na_is_a_falsy_singleton_that_prints_as_na() -> None:
    assert NotAvailable() is NA
    assert not NA
    assert str(NA) == "n/a" and repr(NA) == "NA"
    assert copy.copy(NA) is NA and copy.deepcopy(NA) is NA and pickle.loads(pickle.dumps(NA)) is NA


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("", "n/a"), ("5.1f", "  n/a"), (">6.0f", "   n/a"), ("<6d", "n/a   "), ("*^7.1%", "**n/a**"),
     ("05.1f", "  n/a"), ("=5d", "  n/a"), ("5", "n/a  "), ("s", "n/a")],
)
def test_na_formats_with_number_specs(spec: str, expected: str) -> None:
    assert format(NA, spec) == expected


def test_na_flows_through_arithmetic() -> None:
    assert NA + 1 is NA and 1 + NA is NA and NA * 2 is NA and 100 / NA is NA and -NA is NA
    assert math.isnan(float(NA))


# --- the agent line --------------------------------------------------------------------------------

def agent_line(**overrides) -> str:
    """A line as the agent writes it, with the H100 MIG capture as its GPU."""
    [row] = parse_nvidia_smi_gpus(fixture("gpus_1x_h100_mig_load.csv"))
    driver = row.pop("driver")
    row["processes"] = parse_nvidia_smi_apps(fixture("apps_1x_h100_mig_load.csv"))[row["uuid"]]
    record = {
        "v": 1, "t": 1752483644.579, "source": "nvidia-smi", "gpus": [row], "driver": driver,
        "cuda": "13.1", "cpu": 12.5, "load": [0.12, 0.1, 0.04], "mem_used": 407,
        "mem_total": 24105, "disk_free": 81294,
    }
    record.update(overrides)
    return json.dumps(record)


def test_agent_line_becomes_frozen_snapshots_with_na_for_null() -> None:
    stats = parse_agent_line(agent_line())
    assert isinstance(stats, NodeStats)
    assert (stats.timestamp, stats.source, stats.driver, stats.cuda) == (
        1752483644.579, "nvidia-smi", "590.48.01", "13.1")
    assert stats.load == (0.12, 0.1, 0.04) and stats.errors == () and stats.has_gpus
    [gpu0] = stats.gpus
    assert gpu0 == GpuStats(
        index=0, name="NVIDIA H100 80GB HBM3", uuid=MASKED_UUID, util=NA, mem_used=11125,
        mem_total=81559, temp=53, power=433.78, power_limit=700.0, sm_clock=1980,
        processes=(
            GpuProcess(21180, "/root/tools/memhog", 2296),
            GpuProcess(21181, "/root/tools/memhog", 1272),
            GpuProcess(21198, "./gpu_burn", 7484),
        ),
    )
    assert gpu0.mem_percent == pytest.approx(100 * 11125 / 81559)
    assert f"{gpu0.util:>4.0f}%" == " n/a%"
    with pytest.raises(AttributeError):
        gpu0.util = 5  # type: ignore[misc]


def test_recorded_h100_lines_parse_and_reserved_memory_is_read_where_given() -> None:
    """The agent's lines recorded on a real H100 (no mem_reserved yet: NA), then one with it."""
    for name in ("agent_nvml.jsonl", "agent_smi.jsonl"):
        for line in fixture(f"h100-80gb-hbm3/{name}").splitlines():
            [gpu] = parse_agent_line(line).gpus
            assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.mem_total == 81559 and gpu.mem_reserved is NA
    [row] = parse_nvidia_smi_gpus(fixture("h100-80gb-hbm3/gpus_idle.csv"))
    row.pop("driver")
    [gpu] = parse_agent_line(agent_line(gpus=[dict(row, mem_reserved=480)])).gpus
    assert (gpu.mem_used, gpu.mem_reserved, gpu.mem_total) == (0, 480, 81559)


def test_cpu_only_line_has_no_gpus_and_na_versions() -> None:
    stats = parse_agent_line(agent_line(source="none", gpus=[], driver=None, cuda=None, cpu=None))
    assert not stats.has_gpus
    assert stats.driver is NA and stats.cuda is NA and stats.cpu is NA
    assert stats.mem_percent == pytest.approx(100 * 407 / 24105)


def test_missing_optional_fields_are_na() -> None:
    stats = parse_agent_line('{"v":1,"t":1.5,"source":"none"}')
    assert stats.gpus == () and stats.load == (NA, NA, NA) and stats.mem_percent is NA
    assert stats.disk_free is NA


def test_derived_percent_of_zero_total_is_na() -> None:
    assert parse_agent_line(agent_line(mem_total=0)).mem_percent is NA


MALFORMED = [
    ("not json", "not JSON"),
    ("[1, 2]", "line: expected an object"),
    (agent_line(v=2), "v: expected protocol version 1"),
    (agent_line(t=None), "t: expected a unix time"),
    (agent_line(source="rocm"), "source: expected"),
    (agent_line(cpu="12%"), "cpu: expected a number or null"),
    (agent_line(cpu=True), "cpu: expected a number or null"),
    (agent_line(load=[1, 2]), "load: expected a list of 3"),
    (agent_line(load=[1, "x", 3]), "load[1]: expected a number"),
    (agent_line(gpus={"0": {}}), "gpus: expected a list"),
    (agent_line(gpus=[7]), "gpus[0]: expected an object"),
    (agent_line(gpus=[{"index": 0, "mem_used": "lots"}]), "gpus[0].mem_used: expected a number"),
    (agent_line(gpus=[{"index": 0, "mem_reserved": "480 MiB"}]), "gpus[0].mem_reserved: expected a number"),
    (agent_line(gpus=[{"name": 5}]), "gpus[0].name: expected a string"),
    (agent_line(gpus=[{"processes": [{"pid": "x"}]}]), "gpus[0].processes[0].pid: expected"),
    (agent_line(errors="boom"), "errors: expected a list"),
    (agent_line(errors=[1]), "errors: expected a list of strings"),
]


@pytest.mark.parametrize(("line", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_lines_raise_naming_the_field(line: str, message: str) -> None:
    with pytest.raises(StatsParseError, match=r"^stats line: ") as caught:
        parse_agent_line(line)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_sizes_read_as_people_read_them():
    from homegpu.remote.nodes.units import format_bytes, gib

    assert [gib(81_559), gib(1536, 5), gib(NA, 5), gib(None)] == ["79.6", "  1.5", "  n/a", "n/a"]
    assert [format_bytes(n) for n in (512, 2_200_000, 2.43e9)] == ["512 B", "2.2 MB", "2.4 GB"]


def test_a_light_first_line_says_its_gpu_health_is_still_to_come() -> None:
    """A streaming agent's first line leaves GPU health and XIDs to the next and says so; other lines, an older
    agent's included, do not (the key is optional)."""
    assert parse_agent_line(agent_line(health_pending=True)).health_pending is True
    assert parse_agent_line(agent_line()).health_pending is False
