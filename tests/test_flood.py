"""A worker that floods its output: a 50 MB line with no newline, then 200,000 short lines, then exit.

Every line must reach experiments/RUN-ID/logs/ before the run is reported (the huge line cut to
its first 64 Ki characters with a marker saying so), and `run --no-tui` may thin its own output but
must say how much it did not show. Real sshd node, real process worker.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import homegpu_argv, worker_processes
from simcluster import free_job_port

pytestmark = pytest.mark.cluster

FLOOD = """\
import sys
sys.stdout.write("x" * 50_000_000)
sys.stdout.write("".join(f"\\nline {n}" for n in range(200_000)) + "\\n")
"""

# Runs argv and prints the peak RSS of what it ran (its own stays a few MiB): the controller alone.
PEAK_RSS = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print('peak RSS KiB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(code)")
# Measured 76 MiB for the whole run here; a controller that held the 50 MB line whole would pass this.
MEMORY_BOUND_MIB = 128


def test_a_flood_reaches_the_saved_log_whole_before_the_run_ends(sim_cluster, tmp_path):
    code = tmp_path / "flood"
    code.mkdir()
    (code / "flood.py").write_text(FLOOD)
    config = sim_cluster.write_cluster_toml(
        tmp_path / "cluster.toml",
        jobs={"flood": {"python": sys.executable, "script": "flood/flood.py", "nodes": ["node1"],
                        "port": free_job_port(), "restart": "never"}})
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, *homegpu_argv("--config", str(config), "run", "flood",
                                                                            "--no-tui")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    peak_mib = int(result.stderr.splitlines()[-1].removeprefix("peak RSS KiB ")) / 1024
    print(f"controller peak RSS {peak_mib:.0f} MiB")
    assert peak_mib < MEMORY_BOUND_MIB, f"the controller grew to {peak_mib:.0f} MiB"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    (run_dir,) = (tmp_path / "experiments").iterdir()
    saved = (run_dir / "logs" / "node1.log").read_text().splitlines()
    short = [line for line in saved if line.startswith("line ")]
    assert short == [f"line {n}" for n in range(200_000)], f"{len(short)} of 200000 lines saved"
    huge = next(line for line in saved if line.startswith("xxxx"))
    assert huge.endswith("characters cut: line longer than 65536]") and len(huge) < 70_000
    shown = sum(1 for line in result.stdout.splitlines() if " | line " in line)
    if shown < 200_000:  # the terminal could not keep up: it must say so, and where the lines are
        assert "were not shown here" in result.stdout and f"experiments/{run_dir.name}/logs" in result.stdout
    assert not worker_processes(sim_cluster)
