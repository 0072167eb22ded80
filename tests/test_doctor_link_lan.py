"""Doctor's "pcie link" row on the test LAN (issue 35), over SSH as a user runs `homegpu doctor`.

node3's nvidia-smi replays the H100 recorded under load and answers the health query with its link at
PCIe 3.0 x1 of the 5.0 x16 that card and slot allow (a row of nvidia-smi's documented fields: no
recording of a card on a riser exists). node3's sessions find a fake libcuda.so.1 in the folder sshd
puts in their LD_LIBRARY_PATH (SimNode.extra_lib): tests/fake_libcuda.py, a fake for hardware these
machines lack, built with gcc from the CUDA driver API's documented signatures, whose copies take as
long as 0.8 GB/s would. Doctor puts node3's GPU under its own load, reads the link meanwhile and names
it with the fix; without the fake it says it could not load the GPUs and judges no idle link. node1
and node2 have no GPU.
"""

from __future__ import annotations

import ctypes
import json

from fake_libcuda import libcuda_in
from gpu_replay import FIXTURES, nvidia_smi_in
from helpers import homegpu

from simcluster import SimCluster

H100 = FIXTURES / "h100-80gb-hbm3"
UUID = "GPU-ca8fe467-fe37-ae67-8b9e-505cc8110be1"  # the recorded card's (gpus_load.csv)
# uuid, pci.bus_id, clocks_event_reasons.active, clocks.mem, clocks.max.sm, clocks.max.memory,
# pcie.link.gen.current, pcie.link.width.current, pcie.link.gen.max, pcie.link.width.max, pcie.link.gen.gpumax
ON_A_RISER = f"{UUID}, 00000000:1B:00.0, 0x0000000000000000, 2619, 1980, 2619, 3, 1, 5, 16, 5\n"
NOT_JUDGED = "; an idle link is not judged"


def link_rows(result) -> dict[str, dict]:
    """node -> its "pcie link" row, from `doctor --json`."""
    assert result.stdout.strip(), result.stderr
    return {row["node"]: row for row in json.loads(result.stdout)["checks"] if row["name"] == "pcie link"}


def libcuda_here() -> bool:
    """Whether this machine (whose files the nodes share) has a driver's libcuda.so.1 of its own."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_doctor_names_a_link_on_a_riser_under_its_own_load_and_says_when_it_cannot_load(sim_cluster: SimCluster,
                                                                                     tmp_path):
    health = tmp_path / "health.csv"
    health.write_text(ON_A_RISER)
    config = str(sim_cluster.write_cluster_toml(tmp_path / "cluster.toml"))
    node3 = sim_cluster.node("node3")
    with nvidia_smi_in(node3.extra_path, H100 / "gpus_load.csv", H100 / "apps_idle.csv",
                       version_fixture=H100 / "smi_version.txt", health_fixture=health):
        with libcuda_in(node3.extra_lib, gbps=0.8):
            as_json = homegpu("--config", config, "doctor", "--json", cwd=tmp_path)
            text = homegpu("--config", config, "doctor", cwd=tmp_path)
        without = homegpu("--config", config, "doctor", "--json", cwd=tmp_path)
    print(text.stdout)

    rows = link_rows(as_json)
    assert as_json.returncode == 1, as_json.stderr  # the link is a problem to fix
    riser = rows["node3"]
    assert riser["ok"] is False, riser
    assert riser["detail"].startswith("GPU 0 runs PCIe 3.0 x1 of 5.0 x16 under load (host→GPU 0."), riser
    assert riser["detail"].endswith(" GB/s): a riser or a card not fully seated"), riser
    assert riser["fix"] == "Seat it in the slot itself."
    for name in ("node1", "node2"):
        assert (rows[name]["ok"], rows[name]["detail"]) == (None, "not needed (no GPU)"), rows[name]
    [line] = [line for line in text.stdout.splitlines() if " pcie link: GPU 0 " in line]
    assert line.startswith("  ✗ pcie link: GPU 0 runs PCIe 3.0 x1 of 5.0 x16 under load (host→GPU 0."), line
    assert line.endswith(" GB/s): a riser or a card not fully seated — fix: Seat it in the slot itself."), line

    idle = link_rows(without)["node3"]
    assert idle["ok"] is None and idle["fix"] == "", idle
    assert idle["detail"].startswith("could not put the GPUs under load (") and idle["detail"].endswith(NOT_JUDGED)
    if not libcuda_here():
        assert idle["detail"] == ("could not put the GPUs under load (libcuda.so.1 not loadable: cannot open shared "
                                  "object file: No such file or directory)" + NOT_JUDGED), idle
