"""doctor's checks that need more than one node: can each node's job port be reached by the others.

The same proof as a launch's preflight (remote/net/reach.py): a one-shot listener on each node, a
bounded connect from every other one. Only nodes whose own checks let a listener start take part.
"""

from __future__ import annotations

from typing import Sequence

from homegpu.remote.doctor.check import Check
from homegpu.remote.net import Endpoint, reach_problems
from homegpu.remote.nodes import NodeSession

NAME = "reachable"


async def reach_checks(sessions: Sequence[NodeSession], port: int) -> dict[str, Check]:
    """One "reachable" row per node in `sessions` (online, job port free), by node name."""
    if len({s.address for s in sessions}) < 2:
        return {s.name: Check(s.name, NAME, None, "one machine to test from: nothing to cross") for s in sessions}
    problems = await reach_problems([Endpoint(s, s.address, (port,)) for s in sessions])
    rows = {}
    for session in sessions:
        found = [p.text for p in problems if p.node == session.name]
        if found:
            detail, _, fix = found[0].partition("; ")
            rows[session.name] = Check(session.name, NAME, False, detail, fix[:1].upper() + fix[1:])
        else:
            peers = ", ".join(s.name for s in sessions if s is not session)
            rows[session.name] = Check(session.name, NAME, True, f"{session.address}:{port} answers {peers}")
    return rows
