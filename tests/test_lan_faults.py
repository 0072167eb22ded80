"""A home network misbehaving under a running job: the nodes are namespaced machines on a shaped LAN.

A Wi-Fi drop cuts a node's link (every packet to or from it is lost, interfaces and connections stay
up) while its worker trains; the controller loses SSH to it and the workers lose each other.

What TensorFlow 2.21 does with a 25 s silence: its coordination service would call the node dead
after 10 s (the trainer raises that to 120 s: trainer/coordination.py), and its gRPC channels give
up on a connection silent for 20 s (TCP_USER_TIMEOUT from gRPC's keepalive), so the collective in
flight fails with "Connection reset by peer" once the link is back. homegpu then restarts the job
once and it resumes at the last finished epoch: nothing is trained twice, nothing lost.
"""

from __future__ import annotations

import re
import subprocess
import threading

import pytest

from helpers import homegpu_argv, worker_processes, write_config

pytestmark = pytest.mark.cluster

CUT_SECONDS = 25


def test_a_25_second_link_cut_mid_job_resumes_where_it_was_with_nothing_lost(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, epochs=8, steps_per_epoch=40)
    node2 = sim_cluster.node("node2")
    process = subprocess.Popen(homegpu_argv("--config", str(config), "run", "demo", "--no-tui"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    restore = threading.Timer(CUT_SECONDS, node2.restore_link)
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if "node2 * epoch 2/8" in line and not restore.is_alive():
                node2.cut_link()
                restore.start()
        process.wait(timeout=600)
    finally:
        restore.join()
        node2.restore_link()
        process.kill()
    text = "".join(output)
    assert restore.finished.is_set(), f"the job ended before the link was cut:\n{text}"
    assert process.returncode == 0, text
    assert "generation 3" not in text, f"more than one restart:\n{text}"
    if "generation 2" in text:
        assert re.search(r"node2 \| homegpu.trainer: resumed at epoch [2-8]", text), text
    assert re.search(r"node2.*offline", text), f"the drop was not noticed:\n{text}"
    (run_dir,) = (tmp_path / "experiments").iterdir()
    saved = (run_dir / "logs" / "node2.log").read_text().splitlines()
    epochs = [line for line in saved if re.search(r"\bepoch \d+/8\b", line) and "HOMEGPU_METRIC" not in line]
    numbers = [int(re.search(r"epoch (\d+)/8", line).group(1)) for line in epochs]
    assert numbers == list(range(1, 9)), f"a gap or a duplicate in node2's log: {numbers}"
    assert not worker_processes(sim_cluster)

