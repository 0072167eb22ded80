"""A stand-in ``nvidia-smi`` that prints recorded output, so tests run the agent's real subprocess path.

Put the directory :func:`write_replay_nvidia_smi` returns first on ``PATH`` and the agent finds it
as ``nvidia-smi``. It answers only the exact command lines the fixtures were recorded for (see
``tests/fixtures/gpu/README.md``); any other command line exits 2 with a message, so an agent whose
query drifts from the fixtures' field order fails its test instead of parsing shifted columns.
"""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"

GPU_QUERY = (
    "--query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "power.draw,power.limit,clocks.sm,driver_version"
)
APP_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
FORMAT = "--format=csv,noheader,nounits"

# exit code: nvidia-smi's own codes for the garbage fixtures, so the agent sees a real failure.
_EXIT_CODES = {"garbage_no_devices.txt": 6, "garbage_no_driver.txt": 9}

_SCRIPT = """#!{python}
import sys
ANSWERS = {answers!r}
answer = ANSWERS.get(tuple(sys.argv[1:]))
if answer is None:
    sys.stderr.write("replay nvidia-smi: nothing recorded for %r\\n" % (sys.argv[1:],))
    sys.exit(2)
path, code = answer
if path:
    with open(path, "rb") as recorded:
        sys.stdout.buffer.write(recorded.read())
sys.exit(code)
"""


def _answer(fixture: Path | None) -> tuple[str, int]:
    if fixture is None:
        return ("", 0)
    return (str(fixture), _EXIT_CODES.get(fixture.name, 0))


def write_replay_nvidia_smi(
    dir: Path,
    gpus_fixture: Path,
    apps_fixture: Path | None,
    *,
    version_fixture: Path | None = None,
) -> Path:
    """Write an executable ``nvidia-smi`` into ``dir`` and return ``dir`` (to prepend to PATH).

    Args:
        dir: an empty directory of the test's own (e.g. a ``tmp_path`` subdirectory).
        gpus_fixture: printed for the agent's ``--query-gpu`` command line.
        apps_fixture: printed for ``--query-compute-apps``; None prints nothing (no processes).
        version_fixture: printed for ``--version``; None makes ``--version`` fail, as on drivers
            too old to have it.
    """
    answers = {
        (GPU_QUERY, FORMAT): _answer(gpus_fixture),
        (APP_QUERY, FORMAT): _answer(apps_fixture),
    }
    if version_fixture is not None:
        answers[("--version",)] = _answer(version_fixture)
    dir.mkdir(parents=True, exist_ok=True)
    script = dir / "nvidia-smi"
    script.write_text(_SCRIPT.format(python=sys.executable, answers=answers))
    script.chmod(0o755)
    return dir
