"""One stats snapshot as the history's rows, and the rule that turns GPU processes into GPU-hours per owner.

Pure: no SQLite, no clock. Values are kept in whole units (%, MiB, °C, W): a month of them fits in a
byte or three each, and a history needs no more precision than a sparkline shows. "Not available"
(the stats' NA) is NULL, never 0.

The GPU-hours rule: each sample of a node stands for the time since that node's previous sample (at
most `max_gap`, and nothing for the first sample after the node connected), and on each GPU that
time is shared among the owners with processes there in proportion to the GPU memory their processes
hold (equally when some memory is not known, or all of it is 0). A GPU's time is never counted twice:
the owners of one sample together get at most that sample's time.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

# The owner of a GPU process in the store: (kind, user, job, run_id, container); "" where not known.
# A worker's index is left out, so the workers of one run are one owner and its GPU-hours add up.


class OwnerKey(NamedTuple):
    kind: str
    user: str
    job: str
    run_id: str
    container: str


UNKNOWN_OWNER = OwnerKey("unknown", "", "", "", "")


def whole(value: object) -> int | None:
    """A stats value in whole units for the store; NA, None, NaN, infinities and non-numbers are None (NULL).

    Called ten times per sample: exact type tests (bool is not int here) and x - x == 0 (false for NaN
    and the infinities) are the cheapest way to tell."""
    kind = type(value)
    if kind is int:
        return value
    if kind is float and value - value == 0.0:
        return round(value)
    return None


def _text(value: object) -> str:
    return value if isinstance(value, str) and value != "n/a" else ""  # NA is the str "n/a"


def owner_key(owner) -> OwnerKey:
    """The store's key for a stats ProcessOwner (None: the agent did not say, which is "unknown")."""
    if owner is None or owner.kind not in ("worker", "container", "process"):
        return UNKNOWN_OWNER
    user = _text(owner.user)
    if not user and whole(owner.uid) is not None:
        user = f"uid {whole(owner.uid)}"
    if owner.kind == "worker":
        return OwnerKey("worker", user, _text(owner.job), _text(owner.run_id), "")
    if owner.kind == "container":
        return OwnerKey("container", user, "", "", _text(owner.container_name) or _text(owner.container))
    return OwnerKey("process", user, "", "", "")


class OwnerShare(NamedTuple):
    owner: OwnerKey
    share: float  # of the GPU's time in this sample, 0..1; the shares of one sample add up to 1
    mem: int | None  # MiB the owner's processes hold on the GPU (None if any of them is not known)


def owner_shares(processes: Iterable) -> list[OwnerShare]:
    """The owners of one GPU's processes (stats GpuProcess) and each one's share of its time (the rule
    in the module docstring)."""
    mem: dict[OwnerKey, int | None] = {}
    for process in processes:
        key = owner_key(process.owner)
        held, known = whole(process.mem), mem.get(key, 0)
        mem[key] = None if held is None or known is None else known + held
    if not mem:
        return []
    known = [m for m in mem.values() if m is not None]
    total = sum(known)
    if len(known) == len(mem) and total > 0:
        return [OwnerShare(key, held / total, held) for key, held in mem.items()]
    return [OwnerShare(key, 1 / len(mem), held) for key, held in mem.items()]
