"""CPU seconds per test, for finding what makes the suite slow on 2 cores (the LAN tier is CPU-bound there).

`HOMEGPU_TEST_CPU_LOG=FILE bash tests/run.sh -m "not fast" -n 6 --dist loadscope` puts each pytest worker in a
cpuacct cgroup of its own (cgroup v1; root), so everything it starts counts: the simulated nodes' sshd and what
they run (homegpu's agents, the workers, TensorFlow). A worker runs one test at a time, so the cgroup's CPU over
a test is that test's. Docker containers are counted in Docker's own cgroups, not here. Then
`python tests/cpu_times.py FILE` prints the modules and tests that cost the most CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuTimes:
    """A pytest plugin: one line per test, `cpu_seconds wall_seconds nodeid`, appended to the log."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.group = CPUACCT / f"homegpu-test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
        self.group.mkdir()
        (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def used(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item):  # type: ignore[no-untyped-def]
        cpu, wall = self.used(), time.monotonic()
        yield
        with self.log.open("a") as out:
            out.write(f"{self.used() - cpu:.2f} {time.monotonic() - wall:.2f} {item.nodeid}\n")


    def pytest_unconfigure(self) -> None:
        with contextlib.suppress(OSError):  # members still running (a node left behind) keep the group
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()


def register(config: pytest.Config) -> None:
    """Adds the plugin when HOMEGPU_TEST_CPU_LOG names a file."""
    if log := os.environ.get("HOMEGPU_TEST_CPU_LOG"):
        config.pluginmanager.register(CpuTimes(Path(log)), "homegpu-cpu-times")


def main(log: str, shown: int = 25) -> None:
    modules: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for line in Path(log).read_text().splitlines():
        cpu, _wall, nodeid = line.split(" ", 2)
        modules[nodeid.split("::")[0]] += float(cpu)
        tests[nodeid] += float(cpu)
    print(f"CPU: {sum(modules.values()) / 60:.1f} min in all ({len(tests)} tests); the modules that cost most:")
    for module, seconds in modules.most_common(shown):
        print(f"  {seconds:7.1f} s  {module}")
    print("the tests that cost most:")
    for test, seconds in tests.most_common(shown):
        print(f"  {seconds:7.1f} s  {test}")


if __name__ == "__main__":
    main(sys.argv[1])
