"""What a restarted serve does with the entries it left starting or running (store.py says why they are
never waiting again): attach to their run where its workers are still on the nodes, else finish them as
failed with the reason. Pure, so that the rule is one place the runner and its tests share.
"""

from __future__ import annotations

from dataclasses import dataclass

from homegpu.remote.queue.entries import EntryState, QueueEntry

ATTACH, FAIL = "attach", "fail"


@dataclass(frozen=True)
class Resume:
    """`action`: ATTACH (follow run `entry.run_id` as `homegpu run` reattaches, then mark it running) or
    FAIL (finish it as failed with `reason`)."""

    action: str
    reason: str = ""


def resume_action(entry: QueueEntry, workers_found: bool) -> Resume:
    """The step for one entry serve finds starting or running when it starts.

    Args:
        workers_found: a worker of `entry.run_id` is on one of its nodes (seen in the nodes' stats as
            that run's homegpu worker, or listed by the job's runtimes).
    """
    if not entry.state.active:
        raise ValueError(f"{entry.id} is {entry.state.value}: only starting and running entries resume")
    if workers_found:
        return Resume(ATTACH)
    if entry.state is EntryState.STARTING:
        return Resume(FAIL, f"serve stopped while starting run {entry.run_id} and no worker of it is left; "
                            "submit it again")
    return Resume(FAIL, f"run {entry.run_id} ended while serve was stopped; see experiments/{entry.run_id}/")
