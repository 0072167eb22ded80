"""The scripts shipped to the nodes run on the oldest Python README promises for nodes.

No old interpreter needs to be installed for this: vermin reads each script and finds the oldest
Python that has every module, function, argument and syntax it uses. README (`[[nodes]]`) promises
Python 3.8 for homegpu's own scripts.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from homegpu.remote.node_side import SCRIPT_FOLDERS, script

NODE_SIDE = Path(__file__).resolve().parent.parent / "remote" / "node_side"
OLDEST = (3, 8)
VERMIN = str(Path(sys.executable).parent / "vermin")  # installed with the dev extras
# Every node script by its plain name, in agent/ (the stats agent and its modules) or scripts/ (the one-shot ones).
FILES = [path for folder in SCRIPT_FOLDERS for path in (NODE_SIDE / folder).glob("*.py") if path.stem != "__init__"]
PATHS = {path.stem: path for path in FILES}
SCRIPTS = sorted(PATHS)


def minimum_python(path: Path, target: tuple[int, int]) -> subprocess.CompletedProcess:
    """vermin's verdict on `path` against `target`: exit 0 when it runs there."""
    version = ".".join(map(str, target))
    return subprocess.run([VERMIN, f"--target={version}-", "--violations", "--no-tips",
                           "--eval-annotations", "--no-parse-comments", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("name", SCRIPTS)
def test_node_script_runs_on_the_oldest_python_promised(name):
    verdict = minimum_python(PATHS[name], OLDEST)
    assert verdict.returncode == 0, f"{name}.py needs a newer Python than {OLDEST}:\n{verdict.stdout}{verdict.stderr}"


def test_the_check_fails_on_a_newer_call(tmp_path):
    """A script calling a 3.9 function fails the 3.8 check (vermin is not merely present)."""
    newer = tmp_path / "newer.py"
    newer.write_text("import os\nos.waitstatus_to_exitcode(0)\n")
    verdict = minimum_python(newer, (3, 8))
    assert verdict.returncode != 0 and re.search(r"waitstatus_to_exitcode.*3\.9", verdict.stdout)


def test_every_script_is_found_and_shipped_whole():
    assert {"stats_agent", "process_owners", "worker_process", "tree_sync", "job_lock", "image_relay"} <= set(SCRIPTS)
    for name in SCRIPTS:
        assert script(name) == PATHS[name].read_text()
        compile(script(name), name, "exec")


def test_a_name_is_in_one_folder_and_an_unknown_one_is_refused():
    """script() looks a plain name up in agent/ and scripts/: the same name in both would ship one unseen."""
    assert len(FILES) == len(PATHS), sorted(path.relative_to(NODE_SIDE) for path in FILES)
    assert {path.parent.name for path in FILES} == set(SCRIPT_FOLDERS)
    with pytest.raises(FileNotFoundError, match="no_such_script"):
        script("no_such_script")
