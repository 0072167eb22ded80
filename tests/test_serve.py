"""`homegpu serve` on this machine (the embedded default's `local` node), and its job board."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.request
from pathlib import Path

from helpers import homegpu, homegpu_argv, wait_for

from homegpu.remote.logs import Metric, WorkerMetric
from homegpu.remote.nodes import JobState, JobStateChanged
from homegpu.remote.serve import JobBoard


def test_the_board_keeps_each_running_runs_latest_figures_and_drops_it_when_it_ends():
    board = JobBoard()
    board.handle(JobStateChanged("demo", "r1", JobState.RUNNING, 2, 1))
    board.handle(WorkerMetric("demo", "r1", "n0", 0, Metric({"event": "epoch", "epoch": 1, "loss": 0.9})))
    board.handle(WorkerMetric("demo", "r1", "n0", 0, Metric({"event": "step", "epoch": 2, "step": 5})))
    run = board.runs["r1"]
    assert (run.job, run.restarts) == ("demo", 1)
    assert (run.workers["n0"].epoch, run.workers["n0"].loss, run.workers["n0"].step) == (2, 0.9, 5)
    board.handle(JobStateChanged("demo", "r1", JobState.FAILED, 2, 1))
    assert board.runs == {}


def test_serve_prints_its_url_answers_prometheus_and_stops_cleanly_on_sigterm(tmp_path):
    process = subprocess.Popen(homegpu_argv("--local", "serve", "--metrics-port", "0"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first, second = process.stdout.readline(), process.stdout.readline()
        assert first.startswith("homegpu serve: home, 1 node(s)"), first
        url = second.split("metrics: ", 1)[1].strip()

        def scraped() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = response.read().decode()
            return text if 'homegpu_node_cpu_percent{cluster="home",node="local"}' in text else ""

        text = wait_for(scraped, 30, "the local node's stats at /metrics")
        assert 'homegpu_node_up{cluster="home",node="local"} 1.0' in text
        assert "# TYPE homegpu_gpu_utilization_percent gauge" in text  # no GPU here: the family, with no sample
        served = set(re.findall(r"^# TYPE (homegpu_\w+) gauge$", text, re.M))
        dashboard = (Path(__file__).parents[1] / "assets" / "grafana-dashboard.json").read_text()
        wanted = set(re.findall(r"homegpu_[a-z_]+", "".join(p["targets"][0]["expr"] for p in
                                                             json.loads(dashboard)["panels"])))
        assert wanted and wanted <= served, f"the dashboard asks for metrics serve does not have: {wanted - served}"
    finally:
        process.terminate()
        status = process.wait(timeout=30)
    assert status == 0 and "Traceback" not in process.stdout.read()


def test_a_busy_port_or_a_bad_address_is_one_line_naming_the_fix(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        busy = homegpu("--local", "serve", "--metrics-port", str(port), cwd=tmp_path, timeout=60)
    assert busy.returncode == 2 and busy.stderr.count("\n") == 1, busy.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in busy.stderr and "--metrics-port" in busy.stderr
    bad = homegpu("--local", "serve", "--listen", "my-laptop", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("homegpu: error: --listen 'my-laptop' is not an IP address")
