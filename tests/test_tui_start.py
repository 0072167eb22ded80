"""The TUI starting on what it finds on this machine: a damaged bandwidth cache is said in one line and
ignored, and a TUI that crashes all the same never ends with exit status 0.

No node is needed: the cluster's nodes are addresses where nothing listens (they show offline).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import wait_until
from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.net import bandwidth_store
from homegpu.tui.app.controller import Controller
from homegpu.tui.app.main import HomegpuApp

TWO_NODES = '[[nodes]]\nname = "a"\nhost = "127.0.0.1"\nport = 1\n[[nodes]]\nname = "b"\nhost = "127.0.0.1"\nport = 2\n'
# What a cache looked like that crashed the TUI at start: a number saved as text.
WRONG_TYPE = {"at": 1795315000.0, "links": [{"src": "a", "dst": "b", "gbits": "9.4", "error": ""}]}


def write_cache(tmp_path: Path, monkeypatch) -> tuple:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = parse_cluster(TWO_NODES, str(tmp_path / "cluster.toml"))
    path = bandwidth_store.store_path(spec)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(WRONG_TYPE))
    return spec, path


async def test_a_damaged_bandwidth_cache_is_named_in_the_panel_and_the_tui_runs_on(tmp_path, monkeypatch):
    spec, path = write_cache(tmp_path, monkeypatch)
    app = HomegpuApp(spec, Controller(spec, tmp_path / "experiments"))
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_until(lambda: "damaged" in str(app.query_one("#bandwidth").render()), 10)
        await pilot.pause(1.5)  # a few redraws of every panel: nothing draws the bad value
        panel = str(app.query_one("#bandwidth").render()).replace("\n", " ")
        expected = f"the saved bandwidth matrix {path} is damaged (the link a → b has gbits '9.4'"
        assert expected in " ".join(panel.split())
        assert app.view.bandwidth.matrix is None and app.is_running
        await pilot.press("q")


CRASHING = """
import sys
from pathlib import Path
from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.tui.app import main as app
from homegpu.tui.app.controller import Controller

def crash(self):
    raise TypeError("a bug on the way to the screen")

Controller.saved_bandwidth = crash
sys.exit(app.run_app(parse_cluster(sys.argv[1], "cluster.toml"), Path(sys.argv[2])))
"""


def test_a_tui_that_crashes_never_exits_0(tmp_path):
    """Textual prints the traceback and returns no status of its own; run_app must not call that success."""
    env = {"TEXTUAL_DRIVER": "textual.drivers.headless_driver:HeadlessDriver", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", CRASHING, TWO_NODES, str(tmp_path / "experiments")],
                            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "a bug on the way to the screen" in output
    assert "homegpu: the terminal UI ended with the error above" in result.stderr
