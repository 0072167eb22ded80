"""Preflight's import check remembers an import that worked (node_side/scripts/import_check.py): run as the
controller runs it on a node (`python -c SOURCE STATE CHECK DIST...`), against a distribution installed for the
test in a folder of its own, whose import leaves a mark each time it really runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from homegpu.remote.node_side import script

SOURCE = script("import_check")
CHECK = "import homegpu_probe; print('probe', homegpu_probe.VERSION)"


def install(site: Path, version: str = "1.0", works: bool = True) -> Path:
    """homegpu_probe VERSION in `site` (a .dist-info as pip leaves one); its import appends to site/imports."""
    site.mkdir(exist_ok=True)
    info = site / f"homegpu_probe-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: homegpu-probe\nVersion: {version}\n")
    body = f"VERSION = {version!r}\nopen({str(site / 'imports')!r}, 'a').write('x')\n"
    (site / "homegpu_probe.py").write_text(body + ("" if works else "raise ImportError('libprobe.so: missing')\n"))
    return info


def check(site: Path, state: Path, *dists: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SOURCE, str(state), CHECK, *(dists or ("homegpu-probe",))],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)}, timeout=60)


def imports(site: Path) -> int:
    marks = site / "imports"
    return len(marks.read_text()) if marks.exists() else 0


def test_an_import_that_worked_is_answered_from_memory_until_the_distribution_changes(tmp_path):
    site, state = tmp_path / "site", tmp_path / "work" / "import-checks.json"
    info = install(site)
    first = check(site, state)
    assert (first.returncode, first.stdout, imports(site)) == (0, "probe 1.0\n", 1), first.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o600 and stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    again = check(site, state)
    assert (again.returncode, again.stdout, imports(site)) == (0, "probe 1.0\n", 1)  # not imported again

    info.rename(site / "homegpu_probe-1.1.dist-info")  # upgraded in place: another version, another folder
    (site / "homegpu_probe-1.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: homegpu-probe\nVersion: 1.1\n")
    (site / "homegpu_probe.py").write_text((site / "homegpu_probe.py").read_text().replace("'1.0'", "'1.1'"))
    upgraded = check(site, state)
    assert (upgraded.stdout, imports(site)) == ("probe 1.1\n", 2)
    assert check(site, state).stdout == "probe 1.1\n" and imports(site) == 2


def test_a_failed_import_is_said_every_time_and_never_remembered(tmp_path):
    site, state = tmp_path / "site", tmp_path / "import-checks.json"
    install(site, works=False)
    for tries in (1, 2):
        failed = check(site, state)
        assert failed.returncode == 1 and "libprobe.so: missing" in failed.stderr and failed.stdout == ""
        assert imports(site) == tries
    assert not state.exists()


def test_a_distribution_that_is_not_installed_is_imported_every_time(tmp_path):
    """The check imports more than the named distributions say (here one that is not there): nothing to key on."""
    site, state = tmp_path / "site", tmp_path / "import-checks.json"
    install(site)
    for tries in (1, 2):
        assert check(site, state, "homegpu-probe", "homegpu-absent,homegpu-absent-cpu").stdout == "probe 1.0\n"
        assert imports(site) == tries


def test_a_damaged_or_unwritable_memory_costs_an_import_not_the_answer(tmp_path):
    site = tmp_path / "site"
    install(site)
    damaged = tmp_path / "import-checks.json"
    damaged.write_text("{not json")
    assert check(site, damaged).stdout == "probe 1.0\n" and imports(site) == 1
    assert list(json.loads(damaged.read_text()).values())[0]["said"] == "probe 1.0"  # written anew
    blocked = tmp_path / "a-file" / "import-checks.json"
    (tmp_path / "a-file").write_text("")  # its folder cannot be made
    assert check(site, blocked).stdout == "probe 1.0\n" and check(site, blocked).returncode == 0
