"""One line of a doctor report: what was checked on which node, how it went, and the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One line of the report. ok: True passed, False needs fixing, None not applicable / info."""

    node: str
    name: str
    ok: bool | None
    detail: str
    fix: str = ""
