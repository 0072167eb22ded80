"""The process runtime's node-side script, run as nodes run it: `python -I -S -c <script> ...`.

Real processes, real pid files; no SSH needed, since the script only ever sees its own node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

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
