"""The process runtime's node-side script, run as nodes run it: `python -I -S -c <script> ...`.

Real processes, real pid files; no SSH needed, since the script only ever sees its own node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from homegpu.remote.node_side import worker_process

SCRIPT = Path(worker_process.__file__).read_text()


def worker(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-I", "-S", "-c", SCRIPT, *args], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_one_status_call_answers_for_every_label_in_order(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    meta = json.dumps({"generation": 1})
    for label, code in (("w0", 0), ("w1", 3)):
        started = worker("start", "--run-dir", run_dir, "--label", label, "--log", f"{label}.log",
                         "--meta", meta, "--", sys.executable, "-c", f"import sys; sys.exit({code})")
        assert "pid" in started, started

    def ended() -> list[dict]:
        reply = worker("status", "--run-dir", run_dir, "--label", "w1", "--label", "nobody", "--label", "w0")
        return reply["workers"]

    deadline = time.monotonic() + 20
    while [w["state"] for w in ended()] != ["exited", "missing", "exited"] and time.monotonic() < deadline:
        time.sleep(0.1)
    w1, nobody, w0 = ended()
    assert (w1["label"], w1["status"]) == ("w1", 3)
    assert nobody == {"state": "missing", "label": "nobody"}
    assert (w0["label"], w0["status"], w0["generation"]) == ("w0", 0, 1)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs (root only: CI runs as root, and this fails loudly elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True, capture_output=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_worker_that_fills_the_disk_is_recorded_as_exited_with_no_space(small_disk: Path) -> None:
    """The worker fills the disk its log and state live on: its supervisor still records how it
    ended (in a file name when no byte fits), says the disk was full, and leaves no empty file."""
    run_dir = str(small_disk / "run")
    fill = "open('out.bin', 'wb').write(b'x' * 4_000_000)"
    started = worker("start", "--run-dir", run_dir, "--label", "w0", "--log", "w0.log", "--cwd", str(small_disk),
                     "--meta", json.dumps({"generation": 1}), "--", sys.executable, "-c", fill)
    assert "pid" in started, started
    deadline = time.monotonic() + 20
    while (status := worker("status", "--run-dir", run_dir, "--label", "w0")["workers"][0])["state"] == "running" \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (status["state"], status["status"], status["nospace"]) == ("exited", 1, True), status
    assert not [p.name for p in Path(run_dir).iterdir() if p.name.endswith(".tmp")]
    assert worker("list", "--root", str(small_disk))["workers"][0]["state"] == "exited"
