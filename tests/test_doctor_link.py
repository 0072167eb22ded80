"""Doctor's "pcie link" row (issue 35): each GPU's PCIe link read under a short load of doctor's own.

An idle card drops its link generation to save power, so the row judges a link only while
node_side/scripts/gpu_load.py copies host→GPU on it. These machines have no GPU: the load runs against a fake
libcuda.so.1 (tests/fake_libcuda.py), built with gcc from the CUDA driver API's documented signatures,
whose copies take as long as a given throughput would; the link is read by the real stats agent from a
replayed nvidia-smi that answers the health query with a row of nvidia-smi's documented fields (no
recording of a card on a riser exists). Fast tier: no LAN, no root; tests/test_doctor_link_lan.py has
the same over SSH.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fake_libcuda import CUDA_ERROR_NO_DEVICE, LEAK_NOTE, build_fake_libcuda
from gpu_replay import FIXTURES, write_replay_nvidia_smi
from homegpu.remote.doctor.check import Check
from homegpu.remote.doctor.judge import CHECK_NAMES
from homegpu.remote.doctor.link import LoadFacts, link_check
from homegpu.remote.doctor.link_probe import probe_under_load
from homegpu.remote.events import GpuStats, NodeStats, PcieLink
from homegpu.remote.node_side.scripts import gpu_load
from homegpu.remote.nodes import CommandResult, agent_command, agent_payload, held_back
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.remote.nodes.transport import LocalTransport
from homegpu.tui.view.text import format_check

LOAD = Path(gpu_load.__file__)
H100 = FIXTURES / "h100-80gb-hbm3"
UUID = "GPU-ca8fe467-fe37-ae67-8b9e-505cc8110be1"  # the recorded card's (gpus_load.csv)
# uuid, pci.bus_id, clocks_event_reasons.active, clocks.mem, clocks.max.sm, clocks.max.memory,
# pcie.link.gen.current, pcie.link.width.current, pcie.link.gen.max, pcie.link.width.max, pcie.link.gen.gpumax
ON_A_RISER = f"{UUID}, 00000000:1B:00.0, 0x0000000000000000, 2619, 1980, 2619, 3, 1, 5, 16, 5\n"
RISER_DETAIL = ("GPU 0 runs PCIe 3.0 x1 of 5.0 x16 under load (host→GPU 0.8 GB/s): a riser or a card not "
                "fully seated")


def gpu(index: int = 0, util: float = 0, **link) -> GpuStats:
    """A GPU as the agent read it; idle by its utilisation (the copies do not count there)."""
    return GpuStats(index, "NVIDIA H100 80GB HBM3", f"GPU-{index}", util, 1, 81559, 40, 90.0, 700.0, 1980,
                    pcie=PcieLink(**link))


def node(*gpus: GpuStats) -> NodeStats:
    return NodeStats(1.0, "nvml", gpus, "580.159.04", "13.0", 1.0, (0.0, 0.0, 0.0), 1, 2, 50_000)


FULL = dict(gen=4, width=16, max_gen=4, max_width=16, gpu_max_gen=4, gpu_max_width=16)
RISER = dict(gen=3, width=1, max_gen=5, max_width=16, gpu_max_gen=5, gpu_max_width=16)
SECOND_SLOT = dict(gen=3, width=16, max_gen=3, max_width=16, gpu_max_gen=4, gpu_max_width=16)


def loaded(*said: dict) -> LoadFacts:
    return LoadFacts(said, CommandResult(0, "", ""))


# -- the judgement ------------------------------------------------------------------------------------


def test_a_link_below_card_and_slot_under_load_is_named_with_the_fix_even_at_zero_utilisation():
    idle_by_util = gpu(0, util=0, **RISER)
    assert held_back(idle_by_util) == []  # status judges no idle card...
    row = link_check("box", 1, loaded({"index": 0, "gbps": 0.8}), node(idle_by_util))
    # ...but doctor's own load is load, whatever the utilisation says (copies are not kernels)
    assert row == Check("box", "pcie link", False, RISER_DETAIL, "Seat it in the slot itself.")
    assert format_check(row) == f"  ✗ pcie link: {RISER_DETAIL} — fix: Seat it in the slot itself."


def test_a_link_at_what_card_and_slot_can_do_passes_with_its_throughput():
    row = link_check("box", 2, loaded({"index": 0, "gbps": 24.08}, {"index": 1, "gbps": 25.3}),
                     node(gpu(0, **FULL), gpu(1, **FULL)))
    assert row == Check("box", "pcie link", True, "GPU 0 PCIe 4.0 x16 under load (host→GPU 24.1 GB/s); "
                                                  "GPU 1 PCIe 4.0 x16 under load (host→GPU 25.3 GB/s)")


def test_a_slot_below_the_card_uses_status_words_and_the_other_gpu_is_still_shown():
    row = link_check("box", 2, loaded({"index": 0, "gbps": 12.0}, {"index": 1, "gbps": 24.0}),
                     node(gpu(0, **SECOND_SLOT), gpu(1, **FULL)))
    assert row.ok is False
    assert row.detail == ("GPU 0's slot allows PCIe 3.0 x16 of the card's 4.0 x16 under load (host→GPU 12.0 GB/s): "
                          "the board's second slot or an older board; "
                          "GPU 1 PCIe 4.0 x16 under load (host→GPU 24.0 GB/s)")
    assert row.fix == "Move it to the first x16 slot."
    # the same judgement as status's, word for word, once a card is at work
    busy = gpu(0, util=97, **SECOND_SLOT)
    assert held_back(busy) == ["GPU 0's slot allows PCIe 3.0 x16 of the card's 4.0 x16: the board's second slot or "
                               "an older board; move it to the first x16 slot"]


@pytest.mark.parametrize("load, reading, detail", [
    (LoadFacts(({"error": "libcuda.so.1 not loadable: cannot open shared object file: No such file or directory"},)),
     None, "could not put the GPUs under load (libcuda.so.1 not loadable: cannot open shared object file: No such "
           "file or directory); an idle link is not judged"),
    (LoadFacts(({"error": "cuInit: CUDA_ERROR_NO_DEVICE (100)"},)), None,
     "could not put the GPUs under load (cuInit: CUDA_ERROR_NO_DEVICE (100)); an idle link is not judged"),
    (LoadFacts(failure="SyntaxError: invalid syntax"), None,
     "could not put the GPUs under load (SyntaxError: invalid syntax); an idle link is not judged"),
    (LoadFacts(failure="its copies did not start within 30 s"), None,
     "could not put the GPUs under load (its copies did not start within 30 s); an idle link is not judged"),
    (loaded({"index": 0, "gbps": 0.8}), "no answer within 45 s",
     "could not read the links under load (the stats agent: no answer within 45 s); an idle link is not judged"),
    (loaded({"index": 0, "error": "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)"}, {"index": 1, "gbps": 24.0}),
     node(gpu(0, **RISER), gpu(1, **FULL)),
     "GPU 0 could not be put under load (cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)); its idle link is not judged; "
     "GPU 1 PCIe 4.0 x16 under load (host→GPU 24.0 GB/s)"),
    (loaded({"index": 0, "gbps": 24.0}), node(gpu(0)),
     "GPU 0 under load (host→GPU 24.0 GB/s); its driver does not report the PCIe link"),
])
def test_what_cannot_be_judged_is_said_and_is_no_failure(load, reading, detail):
    row = link_check("box", 2, load, reading)
    assert (row.ok, row.detail, row.fix) == (None, detail, "")


def test_cpu_only_nodes_and_a_broken_python_are_not_loaded():
    assert link_check("box", 0, None, None) == Check("box", "pcie link", None, "not needed (no GPU)")
    assert link_check("box", 0, None, None, python_ok=False).detail == "skipped: needs a working python3"


def test_the_row_comes_right_after_the_gpus():
    assert CHECK_NAMES[CHECK_NAMES.index("gpus") + 1] == "pcie link"


# -- the load on the node, against the fake driver ------------------------------------------------------------


def run_load(*args: str, stdin=subprocess.DEVNULL, env: dict | None = None) -> subprocess.CompletedProcess:
    """gpu_load.py as the node runs it (python -c its source), with stdin at EOF: it holds its minimum only."""
    return subprocess.run([sys.executable, "-c", LOAD.read_text(), *args], capture_output=True, text=True,
                          timeout=60, stdin=stdin, env=env)


def said(result: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_load_copies_on_every_gpu_and_measures_each_throughput(tmp_path):
    library = build_fake_libcuda(tmp_path / "lib", gbps=0.8, devices=2)
    result = run_load("0.5", str(library))
    assert result.returncode == 0 and LEAK_NOTE not in result.stderr, result.stderr
    loading, first, second = said(result)
    assert loading == {"loading": [0, 1]}
    assert [first["index"], second["index"]] == [0, 1]
    # a copy never takes less than the fake's throughput allows; a busy machine may make it take more
    assert all(0.3 < line["gbps"] <= 0.81 for line in (first, second)), (first, second)


def test_a_gpu_that_cannot_be_loaded_is_named_and_released_while_the_others_load(tmp_path):
    library = build_fake_libcuda(tmp_path / "lib", devices=2, full_device=1)
    result = run_load("0", str(library))
    assert said(result) == [{"loading": [0]}, {"index": 0, "gbps": said(result)[1].get("gbps")},
                            {"index": 1, "error": "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)"}]
    assert said(result)[1]["gbps"] > 0 and LEAK_NOTE not in result.stderr, result.stderr


def test_the_load_holds_until_its_stdin_ends(tmp_path):
    library = build_fake_libcuda(tmp_path / "lib", gbps=50.0)
    process = subprocess.Popen([sys.executable, "-c", LOAD.read_text(), "0", str(library)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(process.stdout.readline()) == {"loading": [0]}
        # its minimum (0 s) is long past; it keeps copying while the controller has not closed stdin
        assert select.select([process.stdout], [], [], 1.0)[0] == [] and process.poll() is None
        process.stdin.close()
        out, err = process.stdout.read(), process.stderr.read()  # EOF once it has ended
        process.wait(timeout=30)
    finally:
        process.kill()
    assert [json.loads(line)["index"] for line in out.splitlines()] == [0] and process.returncode == 0
    assert "gbps" in json.loads(out) and LEAK_NOTE not in err


def test_a_driver_without_gpus_and_no_driver_at_all_are_one_error_line(tmp_path):
    no_device = build_fake_libcuda(tmp_path / "lib", init_result=CUDA_ERROR_NO_DEVICE)
    assert said(run_load("0", str(no_device))) == [{"error": "cuInit: CUDA_ERROR_NO_DEVICE (100)"}]
    missing = tmp_path / "none" / "libcuda.so.1"
    [line] = said(run_load("0", str(missing)))
    assert line == {"error": "libcuda.so.1 not loadable: cannot open shared object file: No such file or directory"}


def test_the_load_numbers_gpus_as_nvml_does(tmp_path):
    """CUDA's default order is fastest first; the load asks for PCI bus order, NVML's and nvidia-smi's."""
    library = build_fake_libcuda(tmp_path / "lib")
    probe = ("import os, runpy, sys; sys.argv = ['-c', '0', sys.argv[1]]; "
             f"runpy.run_path({str(LOAD)!r}, run_name='__main__'); "
             "sys.stderr.write(os.environ['CUDA_DEVICE_ORDER'] + ' ' + str('CUDA_VISIBLE_DEVICES' in os.environ))")
    result = subprocess.run([sys.executable, "-c", probe, str(library)], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES="1", CUDA_DEVICE_ORDER="FASTEST_FIRST"),
                            stdin=subprocess.DEVNULL)
    assert result.stderr.endswith("PCI_BUS_ID False"), result.stderr


# -- the probe: load, agent reading under it, judgement ---------------------------------------------------


async def probe_here(tmp_path: Path, monkeypatch, library_dir: Path) -> Check:
    """Doctor's probe on this machine as a node: the load finds libcuda in `library_dir` (LD_LIBRARY_PATH,
    as a node's sessions may have it) and the agent reads a replayed H100 whose link is on a riser."""
    health = tmp_path / "health.csv"
    health.write_text(ON_A_RISER)
    replay = write_replay_nvidia_smi(tmp_path / "bin", H100 / "gpus_load.csv", H100 / "apps_idle.csv",
                                     version_fixture=H100 / "smi_version.txt", health_fixture=health)
    monkeypatch.setenv("PATH", f"{replay}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(library_dir))
    transport = LocalTransport()
    argv = agent_command(python=sys.executable, interval=0.1, work_dir=str(tmp_path), source="auto") + ["--once"]
    try:
        load = await probe_under_load(SimpleNamespace(spawn=transport.start), sys.executable,
                                      lambda: transport.run(argv, input=agent_payload(), timeout=45))
    finally:
        transport.close()
    reading = parse_agent_line(load.reading.stdout.splitlines()[-1]) if load.reading else None
    return link_check("node3", 1, load, reading)


async def test_the_probe_reads_the_link_while_its_load_runs_and_names_the_riser(tmp_path, monkeypatch):
    build_fake_libcuda(tmp_path / "lib", gbps=0.8)
    row = await probe_here(tmp_path, monkeypatch, tmp_path / "lib")
    assert row.ok is False and row.fix == "Seat it in the slot itself.", row
    assert row.detail.startswith("GPU 0 runs PCIe 3.0 x1 of 5.0 x16 under load (host→GPU 0.")
    assert row.detail.endswith(" GB/s): a riser or a card not fully seated")


async def test_the_probe_says_why_it_could_not_load_the_gpus(tmp_path, monkeypatch):
    build_fake_libcuda(tmp_path / "lib", init_result=CUDA_ERROR_NO_DEVICE)
    row = await probe_here(tmp_path, monkeypatch, tmp_path / "lib")
    assert row == Check("node3", "pcie link", None, "could not put the GPUs under load "
                                                    "(cuInit: CUDA_ERROR_NO_DEVICE (100)); an idle link is not judged")
