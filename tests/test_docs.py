"""The documentation: the MkDocs site builds with --strict (a broken link or anchor, a page missing from the
nav, fails it), README.md stays a short page for users with its quick start as it is, and the TUI's pictures
in docs/ are the snapshot tests' own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README_LIMIT = 12_000  # characters: what a user reads before the docs take over
INSTALL_AND_TRAIN = ("python3 -m venv .venv && .venv/bin/pip install '.[tensorflow]' && "
                     ".venv/bin/homegpu --local run --no-tui")
WHOLE_SUITE = "bash tests/run.sh"  # CI's .ci/run runs exactly it
SNAPSHOTS = REPO / "tests" / "__snapshots__" / "test_tui_snapshots"
PICTURES = {  # docs/images/NAME: the snapshot it copies
    "tui-main.svg": "test_main_screen.svg",
    "tui-80x24.svg": "test_main_screen_at_80_by_24.svg",
    "tui-launch.svg": "test_launch_dialog.svg",
    "tui-queue.svg": "test_main_screen_with_the_queue.svg",
    "tui-alerts.svg": "test_main_screen_with_alerts.svg",
}


def build_site(target: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the repository's site into `target`; fails the test when mkdocs is missing."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail("mkdocs-material is not installed: pip install -e '.[docs]' (tests/run.sh installs it)")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", "mkdocs.yml",
                           "--site-dir", str(target)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly(tmp_path):
    built = build_site(tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    for page in ("index.html", "reference/index.html", "getting-started/index.html", "images/tui-main.svg"):
        assert (tmp_path / "site" / page).is_file(), page


def test_every_page_is_in_the_nav():
    """strict mode only warns about a page left out of the nav when told to (validation.nav.omitted_files)."""
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f" {page.name}\n" in config, f"docs/{page.name} is not in mkdocs.yml's nav"


def test_the_readme_is_short_and_keeps_its_quick_start():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme) <= README_LIMIT, f"README.md has {len(readme)} characters: move some into docs/"
    assert f"```sh\n{INSTALL_AND_TRAIN}\n```" in readme
    assert f"```sh\n{WHOLE_SUITE}\n```" in readme
    assert readme.index(INSTALL_AND_TRAIN) < readme.index(WHOLE_SUITE)


@pytest.mark.parametrize("picture", sorted(PICTURES))
def test_the_docs_pictures_are_the_snapshots(picture):
    copy, snapshot = REPO / "docs" / "images" / picture, SNAPSHOTS / PICTURES[picture]
    assert copy.read_bytes() == snapshot.read_bytes(), (
        f"docs/images/{picture} differs from its snapshot: cp {snapshot.relative_to(REPO)} {copy.relative_to(REPO)}")
