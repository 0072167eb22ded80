"""The process runtime's node-side script, run as nodes run it: `python -I -S -c <script> ...`.

Real processes, real pid files; no SSH needed, since the script only ever sees its own node.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_for
from homegpu.remote.node_side.scripts import worker_process

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

    w1, nobody, w0 = wait_for(lambda: (found := ended()) and [w["state"] for w in found] == [
        "exited", "missing", "exited"] and found, 60, "both workers to exit", step=0.1)
    assert (w1["label"], w1["status"]) == ("w1", 3)
    assert nobody == {"state": "missing", "label": "nobody"}
    assert (w0["label"], w0["status"], w0["generation"]) == ("w0", 0, 1)


@pytest.fixture
def small_disk(root, tmp_path: Path):
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
    status = wait_for(lambda: (found := worker("status", "--run-dir", run_dir, "--label", "w0")["workers"][0])[
        "state"] != "running" and found, 60, "the worker to end", step=0.1)
    assert (status["state"], status["status"], status["nospace"]) == ("exited", 1, True), status
    assert not [p.name for p in Path(run_dir).iterdir() if p.name.endswith(".tmp")]
    assert worker("list", "--root", str(small_disk))["workers"][0]["state"] == "exited"


def test_damaged_state_files_are_named_and_never_break_a_listing(tmp_path: Path) -> None:
    """Real state files, as a worker left them, then damaged: each is one "damaged" entry naming its
    file and what is wrong; the listing labels workers by their file's name; stop signals nothing."""
    root = tmp_path / "runs"
    run_dir = root / "demo-1"
    labels = ("ok", "cut", "nolabel", "badpid", "badexit")
    for label in labels:
        worker("start", "--run-dir", str(run_dir), "--label", label, "--log", f"{label}.log", "--meta",
               json.dumps({"job": "demo", "run_id": "demo-1", "generation": 1}), "--", sys.executable, "-c", "pass")
    wait_for(lambda: len(list(run_dir.glob("*.exit"))) == len(labels), 60, "every worker's exit file", step=0.1)
    meta = json.loads((run_dir / "cut.json").read_text())
    text = (run_dir / "cut.json").read_text()
    (run_dir / "cut.json").write_text(text[: len(text) // 2])  # truncated
    (run_dir / "nolabel.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "label"}))
    (run_dir / "badpid.json").write_text(json.dumps(dict(meta, pid="1234")))
    (run_dir / "badexit.exit").write_text('{"generation": 1, "status": "done"}')

    listed = {w["label"]: w for w in worker("list", "--root", str(root))["workers"]}
    assert sorted(listed) == sorted(labels)
    assert (listed["ok"]["state"], listed["ok"]["status"]) == ("exited", 0)
    assert (listed["nolabel"]["state"], listed["nolabel"]["status"]) == ("exited", 0)  # its name is its label
    assert listed["cut"]["state"] == "damaged" and listed["cut"]["file"] == str(run_dir / "cut.json")
    assert listed["cut"]["problem"].startswith("truncated or not JSON (")
    assert (listed["badpid"]["problem"], listed["badpid"]["file"]) == ("pid is '1234'", str(run_dir / "badpid.json"))
    assert (listed["badexit"]["problem"], listed["badexit"]["file"]) == (
        "status is 'done'", str(run_dir / "badexit.exit"))
    stopped = worker("stop", "--run-dir", str(run_dir), "--label", "badpid", "--grace", "1")
    assert stopped["state"] == "damaged" and stopped["problem"] == "pid is '1234'"


def test_a_waiter_that_writes_its_status_and_ends_while_it_is_asked_leaves_the_worker_exited(tmp_path: Path,
                                                                                           monkeypatch) -> None:
    """The status call reads the waiter and the exit file one after the other; a waiter that writes the exit file
    and ends between the two (twelve workers ending at once on a busy node) must not leave a worker that exited 0
    called vanished: the interleaving made certain by a waiter found gone just as its file appears."""
    run_dir = tmp_path / "run"
    worker("start", "--run-dir", str(run_dir), "--label", "w", "--log", "w.log",
           "--meta", json.dumps({"generation": 1}), "--", sys.executable, "-c", "pass")
    exit_file = run_dir / "w.exit"
    wait_for(exit_file.exists, 60, "the exit file", step=0.1)
    written = exit_file.read_text()
    exit_file.unlink()  # as the waiter's file was, a moment before it wrote it
    alive, waiter = worker_process._alive, json.loads((run_dir / "w.json").read_text())["waiter"]["pid"]

    def waiter_ends_as_asked(info: dict) -> bool:
        if info.get("pid") == waiter:
            exit_file.write_text(written)  # the waiter's last act: its status, then it ends
        return alive(info)

    monkeypatch.setattr(worker_process, "_alive", waiter_ends_as_asked)
    status = worker_process.worker_status(str(run_dir), "w")
    assert (status["state"], status.get("status")) == ("exited", 0), status
