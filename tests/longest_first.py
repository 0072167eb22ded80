"""The LAN tier's longest modules first. With --dist loadscope, pytest-xdist hands modules to its workers in
collection order as each frees up, so a long module collected late runs on alone at the end: the tier's tail.
Collected first, the long ones start at once and the short ones fill in around them (longest-first scheduling).
"""

from __future__ import annotations

import pytest

# The longest modules as `bash tests/run.sh` prints them after the LAN tier (tests/module_times.py), longest first:
# 2026-11-29, 2 cores, 6 workers, two runs. A module missing here only starts later; none is left out.
LONGEST = ("test_jobs_process", "test_fewer_workers_lan", "test_trainer", "test_fewer_workers_scripts_lan",
           "test_pytorch_lan", "test_jobs_docker", "test_slurm_lan", "test_sleep_wake_lan", "test_queue_lan",
           "test_lan_faults", "test_balance_torch")


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def order(items: list[pytest.Item]) -> None:
    """The LONGEST modules' tests first, in its order; every other test after them, in its collected order."""
    rank = {module: index for index, module in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(module_of(item), len(LONGEST)))
