"""/metrics' energy counters never go back across a killed serve (issue 46, finding 3): Prometheus reads a counter
that falls as a reset, and `increase()` then counts the whole total again.

serve runs on this machine's node (host = "local": its real stats agent, no LAN needed), whose nvidia-smi is
tests/gpu_replay.py answering with the H100 recorded under load (702.84 W). A scraper reads /metrics every 0.2 s,
as Prometheus would, while serve is killed (SIGKILL, a crash) and started again on the same history, twice; each
kill comes when a scrape shows more joules than the history file holds, if one ever does (the moment a restart
would go back from), else after a few seconds of counting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from gpu_replay import FIXTURES, write_replay_nvidia_smi
from helpers import homegpu_argv, local_cluster_toml, wait_for
from prometheus_client.parser import text_string_to_metric_families

from homegpu.remote.config import load_cluster
from homegpu.remote.history import history_path
from homegpu.remote.history.schema import read_energy_totals

SCRAPE_SECONDS = 0.2
KILLS = 2
AHEAD_WAIT_SECONDS = 4.0  # how long a life of serve waits for a scrape ahead of the file before it is killed anyway
GPU_COUNTER = "homegpu_gpu_energy_joules_total"

Series = tuple[str, tuple[tuple[str, str], ...]]  # a counter's name and its labels


def energy_counters(text: str) -> dict[Series, float]:
    """Every `*_energy_joules_total` sample of a scrape, by name and labels."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name.endswith("_energy_joules_total")}


class Scraper(threading.Thread):
    """Scrapes `url` every SCRAPE_SECONDS until stopped, keeping each answer's energy counters (none while serve
    is down)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.halt = url, threading.Event()
        self.scrapes: list[dict[Series, float]] = []

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    self.scrapes.append(energy_counters(response.read().decode()))
            self.halt.wait(SCRAPE_SECONDS)

    def gpu_joules(self) -> float:
        """The GPU's counter in the latest scrape (0 before any)."""
        latest = self.scrapes[-1] if self.scrapes else {}
        return max((value for (name, _), value in latest.items() if name == GPU_COUNTER), default=0.0)


def joules_on_disk(history: Path) -> float:
    """The GPU's total as the history file holds it (what a restarted serve starts from)."""
    if not history.is_file():
        return 0.0
    with contextlib.closing(sqlite3.connect(f"file:{history}?mode=ro", uri=True, timeout=10)) as db:
        return max((joules for (_, gpu), joules in read_energy_totals(db).items() if gpu == 0), default=0.0)


def start_serve(config: Path, port: int, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(homegpu_argv("--config", str(config), "serve", "--metrics-port", str(port)),
                                cwd=config.parent, stdout=out, stderr=subprocess.STDOUT)


def fallen(scrapes: list[dict[Series, float]]) -> list[str]:
    """Each time a counter was less than in an earlier scrape, in a line."""
    said, last = [], {}
    for number, scrape in enumerate(scrapes):
        for (name, labels), value in scrape.items():
            if value < last.get((name, labels), 0.0):
                said.append(f"scrape {number}: {name}{dict(labels)} fell from {last[name, labels]:.1f} to {value:.1f}")
            last[name, labels] = value
    return said


def free_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_energy_counters_never_go_back_when_serve_is_killed_and_started_again(tmp_path: Path, monkeypatch):
    bin_dir = write_replay_nvidia_smi(tmp_path / "bin", FIXTURES / "h100-80gb-hbm3" / "gpus_load.csv", None)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # serve's history, and where this test reads it
    config = local_cluster_toml(tmp_path, name="counters", cluster="stats_interval = 0.5")
    port = free_local_port()
    history = history_path(load_cluster(config))
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics")
    scraper.start()
    kills_ahead = 0
    try:
        for life in range(KILLS):
            counted = scraper.gpu_joules()
            serve = start_serve(config, port, tmp_path / f"serve{life}.log")
            try:
                wait_for(lambda: scraper.gpu_joules() > counted, 60, f"serve's {life + 1}. life to count on")
                deadline = time.monotonic() + AHEAD_WAIT_SECONDS
                while time.monotonic() < deadline and scraper.gpu_joules() <= joules_on_disk(history) + 1e-6:
                    time.sleep(0.02)
                kills_ahead += time.monotonic() < deadline
                serve.send_signal(signal.SIGKILL)
            finally:
                serve.kill()
                serve.wait()
        serve = start_serve(config, port, tmp_path / "serve-last.log")
        try:
            counted = scraper.gpu_joules()
            wait_for(lambda: scraper.gpu_joules() > counted, 60, "serve started once more to count on")
        finally:
            serve.terminate()
            serve.wait(timeout=60)
    finally:
        scraper.halt.set()
        scraper.join()
    print(f"{len(scraper.scrapes)} scrapes; {kills_ahead} of {KILLS} kills while a scrape was ahead of the file")
    assert not (fell := fallen(scraper.scrapes)), "\n".join(fell)
    assert len(scraper.scrapes) > 10 and any(name == GPU_COUNTER for name, _ in scraper.scrapes[-1])
