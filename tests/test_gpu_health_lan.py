"""What holds a GPU back, on the test LAN: node3's nvidia-smi replays the H100 recorded under load, and
answers the agent's health query with a row built from nvidia-smi's documented fields (no recording of a
throttling card exists): HW thermal slowdown (bit 0x40), its link at PCIe 3.0 x1 of the 5.0 x16 that card and
slot allow. `status` and `status --json`, reached over SSH as a user runs them, name both with their fixes."""

from __future__ import annotations

import json

from gpu_replay import FIXTURES, nvidia_smi_in
from helpers import homegpu

from simcluster import SimCluster

H100 = FIXTURES / "h100-80gb-hbm3"
UUID = "GPU-ca8fe467-fe37-ae67-8b9e-505cc8110be1"  # the recorded card's (gpus_load.csv)
# uuid, pci.bus_id, clocks_event_reasons.active, clocks.mem, clocks.max.sm, clocks.max.memory,
# pcie.link.gen.current, pcie.link.width.current, pcie.link.gen.max, pcie.link.width.max, pcie.link.gen.gpumax
HOT_ON_A_RISER = f"{UUID}, 00000000:1B:00.0, 0x0000000000000040, 2619, 1980, 2619, 3, 1, 5, 16, 5\n"


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
