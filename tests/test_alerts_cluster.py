"""An alert fires once on a hot GPU and once when it cools: `homegpu run --no-tui` on a real sshd node.
It reaches the command, and a notify URL through the real Apprise library (a JSON endpoint served here).

node3 has no GPU: its nvidia-smi replays the output recorded on a real H100 80GB HBM3
(tests/fixtures/gpu/gpus_1x_h100_mig_load.csv, 53 °C). The hot period is that recording with only its
temperature raised to 92 °C (made here, from the recording); the test swaps the recording back in to
cool the GPU. The [alerts] command is a real program run by the controller: it appends its arguments
and HOMEGPU_* environment to a file, as notify-send or curl would receive them.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from gpu_replay import FIXTURES, nvidia_smi_in
from helpers import homegpu_argv, wait_for, worker_processes
from test_alert_notify import TOKEN, Receiver
from simcluster import SimCluster, free_job_port


RECORDING = FIXTURES / "gpus_1x_h100_mig_load.csv"
RECORDED_TEMP, HOT_TEMP = 53, 92

HOLD = """\
import os, sys, time
print("holding until", sys.argv[1], flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.2)
print("released", flush=True)
"""

RECORDER = """\
import json, os, sys
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"argv": sys.argv[2:],
                          "env": {k: v for k, v in os.environ.items() if k.startswith("HOMEGPU_")}}) + "\\n")
"""


def hot_variant(recording: Path) -> bytes:
    """The recorded line with its temperature.gpu column (the 7th) raised to HOT_TEMP."""
    fields = recording.read_text().rstrip("\n").split(", ")
    assert fields[6] == str(RECORDED_TEMP), fields
    fields[6] = str(HOT_TEMP)
    return (", ".join(fields) + "\n").encode()


@pytest.fixture
def replayed_gpu(sim_cluster: SimCluster, tmp_path: Path) -> Iterator[Path]:
    """node3's nvidia-smi answers from a file the test can replace; returns that file (the recording at first)."""
    live = tmp_path / "gpu_now.csv"
    live.write_bytes(RECORDING.read_bytes())
    with nvidia_smi_in(sim_cluster.node("node3").extra_path, live, FIXTURES / "apps_none.csv", reread=True):
        yield live


def replace_file(path: Path, data: bytes) -> None:
    """Swap the file in one rename, so the replay never reads half of it."""
    part = path.with_suffix(".part")
    part.write_bytes(data)
    os.replace(part, path)


def gpu_temps(experiments: Path) -> list[float]:
    """node3's GPU temperatures the run's timeline has recorded so far."""
    files = list(experiments.glob("*/timeline.sqlite"))
    if not files:
        return []
    with sqlite3.connect(files[0]) as db:
        return [row[0] for row in db.execute("SELECT temp FROM gpu_samples WHERE node = 'node3' ORDER BY t")]


def calls(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_an_alert_fires_once_on_a_replayed_hot_gpu_and_once_when_it_clears(sim_cluster, replayed_gpu, tmp_path):
    receiver = Receiver()  # a phone's service, as far as homegpu can tell
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / "hold.py").write_text(HOLD)
    (tmp_path / "record.py").write_text(RECORDER)
    flag, out = tmp_path / "release", tmp_path / "alerts.jsonl"
    config = sim_cluster.cluster_dict(jobs={"hold": {
        "python": sys.executable, "script": "hold/hold.py", "args": [str(flag)], "nodes": ["node3"],
        "port": free_job_port()}})
    config["alerts"] = {
        "gpu_temperature": 85, "job_succeeded": True,
        "command": [sys.executable, str(tmp_path / "record.py"), str(out), "{alert}", "{state}", "{node}", "{gpu}",
                    "{value}", "{message}"],
        "notify": [receiver.url()]}
    (tmp_path / "cluster.toml").write_text(tomli_w.dumps(config))
    log = (tmp_path / "run.out").open("w")
    run = subprocess.Popen(homegpu_argv("--config", str(tmp_path / "cluster.toml"), "run", "hold", "--no-tui"),
                           cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, text=True)
    experiments = tmp_path / "experiments"
    try:
        wait_for(lambda: "== hold running" in (tmp_path / "run.out").read_text(), 120, "the run to start")
        replace_file(replayed_gpu, hot_variant(RECORDING))
        wait_for(lambda: calls(out), 60, "the hot GPU's alert")
        # the GPU stays hot for several more samples: still one alert
        wait_for(lambda: gpu_temps(experiments).count(HOT_TEMP) >= 5, 60, "five hot samples in the timeline")
        replace_file(replayed_gpu, RECORDING.read_bytes())
        wait_for(lambda: len(calls(out)) >= 2, 60, "the alert to clear")
        wait_for(lambda: gpu_temps(experiments)[-5:] == [RECORDED_TEMP] * 5, 60, "five cool samples")
        flag.touch()
        assert run.wait(timeout=120) == 0, (tmp_path / "run.out").read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        log.close()
        receiver.close()
    printed = (tmp_path / "run.out").read_text()

    made = calls(out)
    assert [call["argv"][:5] for call in made] == [
        ["gpu_temperature", "firing", "node3", "0", str(HOT_TEMP)],
        ["gpu_temperature", "cleared", "node3", "0", str(RECORDED_TEMP)],
        ["job_succeeded", "firing", "", "", ""]], made
    assert made[0]["argv"][5] == f"node3 GPU 0 is at {HOT_TEMP} °C (alert at 85 °C)"
    (run_dir,) = experiments.iterdir()
    assert {call["env"]["HOMEGPU_RUN_ID"] for call in made} == {run_dir.name}
    assert made[0]["env"]["HOMEGPU_ALERT"] == "gpu_temperature" and made[0]["env"]["HOMEGPU_ALERT_NODE"] == "node3"
    assert made[1]["env"]["HOMEGPU_ALERT_STATE"] == "cleared"

    assert printed.count(f"== alert: node3 GPU 0 is at {HOT_TEMP} °C (alert at 85 °C)") == 1, printed
    assert printed.count(f"== alert cleared: node3 GPU 0 cooled to {RECORDED_TEMP} °C (at or below 80 °C)") == 1
    assert printed.count("== alert: hold (run ") == 1 and "alert command failed" not in printed
    posts = [(post["title"], post["type"]) for post in receiver.received]
    title = f"homegpu {sim_cluster.name}:"
    assert posts == [(f"{title} GPU too hot", "warning"), (f"{title} GPU too hot (cleared)", "success"),
                     (f"{title} job succeeded", "success")], posts
    assert "notification failed" not in printed and TOKEN not in printed

    with sqlite3.connect(run_dir / "timeline.sqlite") as db:
        events = db.execute("SELECT summary FROM events WHERE kind = 'alert' ORDER BY t").fetchall()
    assert [summary.split(":")[0] for (summary,) in events] == ["firing", "cleared", "firing"]
    assert "succeeded" in events[-1][0]
    assert not worker_processes(sim_cluster)
