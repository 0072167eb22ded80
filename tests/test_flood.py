"""A worker that floods its output: a 50 MB line with no newline, then 200,000 short lines, then exit.

Every line must reach experiments/RUN-ID/logs/ before the run is reported (the huge line cut to
its first 64 Ki characters with a marker saying so), and `run --no-tui` may thin its own output but
must say how much it did not show. The controller holds no such line: its peak memory is set against
the same run without it. Real sshd node, real process worker.
"""

from __future__ import annotations

import subprocess
import sys


from helpers import homegpu_argv, worker_processes
from simcluster import free_job_port


LINES = """\
import sys
sys.stdout.write("".join(f"\\nline {n}" for n in range(200_000)) + "\\n")
"""
FLOOD = """\
import sys
sys.stdout.write("x" * 50_000_000)
sys.stdout.write("".join(f"\\nline {n}" for n in range(200_000)) + "\\n")
"""

# Runs argv and prints the peak RSS of what it ran (its own stays a few MiB): the controller alone.
PEAK_RSS = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print('peak RSS KiB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(code)")
# The flood's controller against the same run without the 50 MB line (measured: 76 MiB both, here).
# Holding that line once, as text or bytes, costs at least 47 MiB more: half of it fails the test.
HUGE_LINE_MIB = 50_000_000 / 2**20
HELD_LINE_FAILS_MIB = HUGE_LINE_MIB / 2


def run_measured(sim_cluster, tmp_path, name: str, source: str) -> tuple[subprocess.CompletedProcess, float]:
    """`homegpu run NAME --no-tui` of a job running `source` on node1, in tmp_path/NAME: its result and the
    controller's peak RSS in MiB."""
    here = tmp_path / name
    (here / name).mkdir(parents=True)
    (here / name / f"{name}.py").write_text(source)
    config = sim_cluster.write_cluster_toml(
        here / "cluster.toml",
        jobs={name: {"python": sys.executable, "script": f"{name}/{name}.py", "nodes": ["node1"],
                     "port": free_job_port(), "restart": "never"}})
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, *homegpu_argv("--config", str(config), "run", name,
                                                                            "--no-tui")],
                            cwd=here, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    return result, int(result.stderr.splitlines()[-1].removeprefix("peak RSS KiB ")) / 1024


def test_a_flood_reaches_the_saved_log_whole_before_the_run_ends(sim_cluster, tmp_path):
    _, lines_mib = run_measured(sim_cluster, tmp_path, "lines", LINES)
    result, flood_mib = run_measured(sim_cluster, tmp_path, "flood", FLOOD)
    print(f"controller peak RSS: {flood_mib:.0f} MiB with the 50 MB line, {lines_mib:.0f} MiB without it")
    assert flood_mib - lines_mib < HELD_LINE_FAILS_MIB, \
        f"the 50 MB line cost the controller {flood_mib - lines_mib:.0f} MiB ({flood_mib:.0f} against {lines_mib:.0f})"
    (run_dir,) = (tmp_path / "flood" / "experiments").iterdir()
    saved = (run_dir / "logs" / "node1.log").read_text().splitlines()
    short = [line for line in saved if line.startswith("line ")]
    assert short == [f"line {n}" for n in range(200_000)], f"{len(short)} of 200000 lines saved"
    huge = next(line for line in saved if line.startswith("xxxx"))
    assert huge.endswith("characters cut: line longer than 65536]") and len(huge) < 70_000
    shown = sum(1 for line in result.stdout.splitlines() if " | line " in line)
    if shown < 200_000:  # the terminal could not keep up: it must say so, and where the lines are
        assert "were not shown here" in result.stdout and f"experiments/{run_dir.name}/logs" in result.stdout
    assert not worker_processes(sim_cluster)
