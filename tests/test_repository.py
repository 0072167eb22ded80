"""What the repository holds: source, docs and small fixtures, never build artefacts.

A wheel, an sdist or an archive committed by accident (a 22 KB shtab wheel sat at the root for weeks)
is dead weight in every clone and hides what was really installed; pip builds them, git does not keep them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARTEFACTS = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip", ".egg", ".pyc", ".so")


def tracked_files() -> list[str]:
    listing = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True, check=True)
    return [name for name in listing.stdout.split("\0") if name]


def build_artefacts(names: list[str]) -> list[str]:
    return [name for name in names if name.lower().endswith(ARTEFACTS)]


def test_no_build_artefact_is_committed():
    found = build_artefacts(tracked_files())
    assert not found, f"build artefacts are tracked by git (remove them with git rm): {', '.join(found)}"


def test_the_artefact_check_knows_a_wheel_and_an_archive_from_source():
    names = ["shtab-1.13.0-py3-none-any.whl", "dist/homegpu-0.1.0.tar.gz", "remote/jobs/run.py", "docs/index.md",
             "tests/fixtures/tui/torch_demo_metrics.jsonl", "notes.zip"]
    assert build_artefacts(names) == ["shtab-1.13.0-py3-none-any.whl", "dist/homegpu-0.1.0.tar.gz", "notes.zip"]
