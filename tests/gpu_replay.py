"""A stand-in ``nvidia-smi`` that prints recorded output, so tests run the agent's real subprocess path.

Put the directory :func:`write_replay_nvidia_smi` returns first on ``PATH`` and the agent finds it
as ``nvidia-smi``. It answers only the exact command lines the fixtures were recorded for (see
``tests/fixtures/gpu/README.md``); any other command line exits 2 with a message, so an agent whose
query drifts from the fixtures' field order fails its test instead of parsing shifted columns.

A query followed by ``--loop-ms=N`` is answered as nvidia-smi's loop mode is: the recorded rows
at once, then again every N ms, flushed each time, until the process is killed. A fixture with a
non-zero exit code (no driver, no devices) is printed once and ends the process, loop or not.

A fixture is read afresh at every call. :func:`write_apps_with_pids` makes a variant of a recorded
process list whose pids are real processes of this machine, for tests of who owns a GPU process.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"

GPU_QUERY = (
    "--query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "power.draw,power.limit,clocks.sm,driver_version"
)
APP_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
# The agent's health query (smi_parse.HEALTH_QUERY), answered only where a test gives it a fixture:
# no recording has these fields, so without one the replay refuses it, as an older driver would.
HEALTH_QUERY = (
    "--query-gpu=uuid,pci.bus_id,clocks_event_reasons.active,clocks.mem,clocks.max.sm,clocks.max.memory,"
    "pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max,pcie.link.gen.gpumax"
)
FORMAT = "--format=csv,noheader,nounits"
MEMORY_TOTAL_QUERY = "--query-gpu=memory.total"  # one GPU's (`-i N`), picked from GPU_QUERY's recorded rows
# An answer to HEALTH_QUERY for the H100 recorded under load (h100-80gb-hbm3/gpus_load.csv's uuid), built
# from nvidia-smi's documented fields since no throttling card was recorded: HW thermal slowdown (bit 0x40),
# its link at PCIe 3.0 x1 of the 5.0 x16 that card and slot allow (a riser).
# uuid, pci.bus_id, clocks_event_reasons.active, clocks.mem, clocks.max.sm, clocks.max.memory,
# pcie.link.gen.current, pcie.link.width.current, pcie.link.gen.max, pcie.link.width.max, pcie.link.gen.gpumax
HOT_ON_A_RISER = ("GPU-ca8fe467-fe37-ae67-8b9e-505cc8110be1, 00000000:1B:00.0, 0x0000000000000040, 2619, 1980, "
                  "2619, 3, 1, 5, 16, 5\n")

# exit code: nvidia-smi's own codes for the garbage fixtures, so the agent sees a real failure.
_EXIT_CODES = {"garbage_no_devices.txt": 6, "garbage_no_driver.txt": 9}

# -IS and no json/re unless logging: a run costs about 6 ms of CPU instead of 21, which matters
# where the benchmarks run 16 nodes' agents, each starting several of these, on 2 cores.
_SCRIPT = """#!{python} -IS
import os, sys, time
ANSWERS = {answers!r}
LOOP_MODE = {loop_mode!r}
LOG = {log!r}
IGNORE_CLOSED_STDOUT = {ignore_closed_stdout!r}
REREAD = {reread!r}

if LOG:
    import json
    with open(LOG, "a") as log:
        log.write(json.dumps([os.getpid()] + sys.argv[1:]) + "\\n")
argv, loop_ms = tuple(sys.argv[1:]), None
last = argv[-1] if argv else ""
loop = last[len("--loop-ms="):] if last.startswith("--loop-ms=") else ""
loop_ok = loop.isascii() and loop.isdigit() and not loop.startswith("0")
if LOOP_MODE and loop_ok and argv[0].startswith("--query-"):
    argv, loop_ms = argv[:-1], int(loop)
answer = ANSWERS.get(argv)
if answer is None:
    sys.stderr.write("replay nvidia-smi: nothing recorded for %r\\n" % (sys.argv[1:],))
    sys.exit(2)
path, code = answer
recorded = b""
if path:
    with open(path, "rb") as handle:
        recorded = handle.read()

def show():
    global recorded
    if REREAD and path:
        with open(path, "rb") as handle:
            recorded = handle.read()
    try:
        sys.stdout.buffer.write(recorded)
        sys.stdout.buffer.flush()
    except OSError:
        if not IGNORE_CLOSED_STDOUT:
            raise

show()
if loop_ms is None or code:
    sys.exit(code)
while True:
    time.sleep(loop_ms / 1000.0)
    show()
"""


def _memory_total_answers(dir: Path, gpus_fixture: Path) -> dict[tuple[str, ...], tuple[str, int]]:
    """`--query-gpu=memory.total FORMAT -i N` (trainer/gpu_budget.py's), answered for each GPU of the recording
    with its row's memory.total (GPU_QUERY's sixth field), as nvidia-smi prints one field of one GPU."""
    if _EXIT_CODES.get(gpus_fixture.name):
        return {}
    answers = {}
    for row in gpus_fixture.read_text().splitlines():
        fields = [field.strip() for field in row.split(",")]
        if len(fields) < 6 or not fields[0].isdigit():
            continue
        answer = dir / f"memory_total_{fields[0]}.csv"
        answer.write_text(fields[5] + "\n")
        answers[(MEMORY_TOTAL_QUERY, FORMAT, "-i", fields[0])] = (str(answer), 0)
    return answers


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
    health_fixture: Path | None = None,
    loop_mode: bool = True,
    log: Path | None = None,
    ignore_closed_stdout: bool = False,
    reread: bool = False,
) -> Path:
    """Write an executable ``nvidia-smi`` into ``dir`` and return ``dir`` (to prepend to PATH).

    Args:
        dir: an empty directory of the test's own (e.g. a ``tmp_path`` subdirectory).
        gpus_fixture: printed for the agent's ``--query-gpu`` command line.
        apps_fixture: printed for ``--query-compute-apps``; None prints nothing (no processes).
        version_fixture: printed for ``--version``; None makes ``--version`` fail, as on drivers
            too old to have it.
        health_fixture: printed for the agent's health query (``HEALTH_QUERY``); None refuses it.
        loop_mode: answer ``--loop-ms=N`` after a query; False refuses it (exit 2), as an
            nvidia-smi without loop mode would.
        log: a file each run appends one line to: its pid and arguments as a JSON list (see
            :func:`replay_calls`), so tests can count and find the nvidia-smi processes.
        ignore_closed_stdout: keep looping when stdout is gone instead of dying of EPIPE, so only
            a kill can end the process (for testing that the agent's kill is what ends it).
        reread: read the fixture again for every answer (each loop too), so a test that replaces the
            file (os.replace) changes what the GPU reports from the next sample on.
    """
    answers = {
        (GPU_QUERY, FORMAT): _answer(gpus_fixture),
        (APP_QUERY, FORMAT): _answer(apps_fixture),
    }
    if version_fixture is not None:
        answers[("--version",)] = _answer(version_fixture)
    if health_fixture is not None:
        answers[(HEALTH_QUERY, FORMAT)] = _answer(health_fixture)
    dir.mkdir(parents=True, exist_ok=True)
    answers.update(_memory_total_answers(dir, gpus_fixture))
    script = dir / "nvidia-smi"
    script.write_text(_SCRIPT.format(
        python=sys.executable, answers=answers, loop_mode=loop_mode,
        log=str(log) if log else None, ignore_closed_stdout=ignore_closed_stdout, reread=reread,
    ))
    script.chmod(0o755)
    return dir


@contextmanager
def nvidia_smi_in(bin_dir: Path, gpus_fixture: Path | None, apps_fixture: Path | None = None,
                  **options) -> Iterator[Path]:
    """For the block, `bin_dir/nvidia-smi` replays `gpus_fixture` (see write_replay_nvidia_smi for
    `options`), or is absent when that is None; whatever was there before is put back after."""
    target = bin_dir / "nvidia-smi"
    saved = target.read_bytes() if target.exists() else None
    target.unlink(missing_ok=True)
    if gpus_fixture is not None:
        write_replay_nvidia_smi(bin_dir, gpus_fixture, apps_fixture, **options)
    try:
        yield bin_dir
    finally:
        target.unlink(missing_ok=True)
        if saved is not None:
            target.write_bytes(saved)
            target.chmod(0o755)


def replay_calls(log: Path) -> list[tuple[int, tuple[str, ...]]]:
    """The (pid, arguments) of every replay run that wrote to ``log``, in start order."""
    if not log.exists():
        return []
    calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [(call[0], tuple(call[1:])) for call in calls]


def is_loop(args: tuple[str, ...]) -> bool:
    """Whether a replay run was asked for loop mode."""
    return bool(args) and args[-1].startswith("--loop-ms=")


def write_apps_with_pids(fixture: Path, pids: list[int], out: Path) -> Path:
    """Write to ``out`` a recorded ``--query-compute-apps`` fixture with its pids replaced by real ones.

    The recording's pids were the recording machine's and mean nothing here; a test that checks
    who owns a GPU process starts real processes and maps the recorded entries onto them: row i
    gets ``pids[i]``, and with more pids than rows the rows are used again in order (one recorded
    training process stands for several). Every other cell stays as recorded. Returns ``out``,
    which the replaying nvidia-smi reads afresh at every call, so a test may rewrite it later.
    """
    rows = [line.split(", ") for line in fixture.read_text().splitlines() if line.strip()]
    lines = [", ".join([row[0], str(pid), *row[2:]]) for row, pid in zip(itertools.cycle(rows), pids)]
    out.write_text("".join(line + "\n" for line in lines))
    return out
