"""Room on each GPU for the queue's runs that have a `gpu_memory`: what a card has free once every process on it
(the queue's, homegpu's, anyone's: nvidia-smi shows them all) and every budget the queue promised to a run not yet
holding it are counted, and which card of a node a new budget fits best. Pure; MiB throughout, as the stats agent
reports memory.

A run the queue started holds its budget on its card from the decision on: until its processes show, the whole
budget is promised; then the part they do not hold yet (a framework grows into its budget). A worker of a run the
queue did not start (`homegpu run` of a job with a `gpu_memory`) holds its budget the same way, from the budget its
node's agent read off it. Memory of a card is `used` as nvidia-smi says it, or the sum of its processes where it
does not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from homegpu.remote.events import GpuProcess, NodeStats
from homegpu.remote.nodes import MIB, budgeted_workers, gib, is_number, owner_text, visible, worker_budget

UNSEEN_SHARE = 0.01  # memory of a card no process accounts for, named among its holders above this share


@dataclass
class Card:
    """One GPU's memory: its `total` and `used` now, who holds it, and the queue's promises on it."""

    node: str
    index: int
    total: float
    used: float
    holders: dict[str, float] = field(default_factory=dict)  # who -> MiB: "q-14", "alice's python"
    ours: dict[str, float] = field(default_factory=dict)  # queue entry id -> MiB it holds or was promised
    seen: float = 0.0  # MiB the card's processes hold, as far as their memory is known
    promised: float = 0.0  # MiB of budgets the queue gave runs whose processes do not hold them yet

    @property
    def free(self) -> float:
        return self.total - self.used - self.promised

    @property
    def free_without_the_queue(self) -> float:
        """What the card would have free once the queue's runs on it end."""
        return self.total - self.used - self.promised + sum(self.ours.values())

    def promise(self, entry: str, budget: float) -> None:
        """`entry`'s run holds `budget` MiB here: the part its processes do not hold yet is promised."""
        extra = max(0.0, budget - self.ours.get(entry, 0.0))
        self.promised += extra
        self.holders[entry] = self.holders.get(entry, 0.0) + extra
        self.ours[entry] = self.ours.get(entry, 0.0) + extra

    def held_by(self) -> str:
        """"alice's python (12.0 GiB), q-14 (5.0 GiB) and q-15 (5.0 GiB)": the largest first."""
        holders = sorted(((who, mib) for who, mib in self.holders.items() if mib > 0), key=lambda h: -h[1])
        unseen = self.used - self.seen
        if unseen > UNSEEN_SHARE * self.total:
            holders.append(("memory no process accounts for", unseen))
        parts = [f"{who} ({gib(mib)} GiB)" for who, mib in holders]
        return " and ".join(filter(None, (", ".join(parts[:-1]), parts[-1]))) if parts else "nothing it can name"


def cards(stats: Mapping[str, NodeStats | None], runs: Mapping[str, str]) -> dict[tuple[str, int], Card]:
    """(node, GPU index) -> its Card, for every GPU whose memory the stats give.

    Args:
        stats: node name -> its latest stats (None: none yet).
        runs: run id -> queue entry id, for the queue's active runs (their processes count as theirs).
    """
    found: dict[tuple[str, int], Card] = {}
    for node, sample in stats.items():
        for gpu in sample.gpus if sample is not None else ():
            total, index = gpu.mem_total, gpu.index
            if not is_number(total) or total <= 0 or not is_number(index):
                continue
            held = [(_who(process, runs), process.mem) for process in gpu.processes if is_number(process.mem)]
            used = gpu.mem_used if is_number(gpu.mem_used) else sum(mib for _, mib in held)
            card = Card(node, int(index), float(total), float(used), seen=sum(mib for _, mib in held))
            for (who, entry), mib in held:
                card.holders[who] = card.holders.get(who, 0.0) + mib
                if entry:
                    card.ours[entry] = card.ours.get(entry, 0.0) + mib
            _promise_others_budgets(card, gpu.processes, runs)
            found[(node, int(index))] = card
    return found


def _promise_others_budgets(card: Card, on_card: Iterable[GpuProcess], runs: Mapping[str, str]) -> None:
    """Workers of runs the queue did not start hold their gpu_memory on the card: the part not held yet by the
    worker and its children is promised."""
    for (run, _), found in budgeted_workers(on_card).items():
        if run in runs:
            continue
        held = sum(process.mem for process in found if is_number(process.mem))
        extra = max(0.0, worker_budget(found[0].owner) / MIB - held)
        who = holder(found[0])
        card.promised += extra
        card.holders[who] = card.holders.get(who, 0.0) + extra


def roomiest(all_cards: Mapping[tuple[str, int], Card], node: str) -> Card | None:
    """The node's card with the most free memory (the lowest index on a tie); None for a node with none known."""
    mine = [card for (name, _), card in all_cards.items() if name == node]
    return max(mine, key=lambda card: (card.free, -card.index), default=None)


def wants_text(budget: float, card: Card) -> str:
    """"needs 5.0 GiB on a GPU: the most free is 3.2 GiB on desktop GPU 0, held by q-14 (5.0 GiB) and …"."""
    return (f"needs {gib(budget)} GiB on a GPU: the most free is {gib(max(0.0, card.free))} GiB on {card.node} GPU "
            f"{card.index}, held by {card.held_by()}")


def _who(process: object, runs: Mapping[str, str]) -> tuple[str, str]:
    """(how a holder is named, its queue entry id or "")."""
    owner = process.owner
    if owner is not None and owner.kind == "worker" and owner.run_id in runs:
        entry = runs[owner.run_id]
        return entry, entry
    return holder(process), ""


def holder(process: object) -> str:
    """"alice's python", "homegpu worker 0 of job train run R", "container db (user bob)", "pid 468 python3"."""
    name = visible(os.path.basename(str(process.name))) if process.name else "a process"
    owner = process.owner
    if owner is not None and owner.kind == "process" and owner.user:
        return f"{visible(str(owner.user))}'s {name}"
    if owner is not None and owner.kind in ("worker", "container"):
        return visible(owner_text(owner))
    return f"pid {process.pid} {name}"


def processes(stats: NodeStats | None) -> Iterable[object]:
    for gpu in stats.gpus if stats is not None else ():
        yield from gpu.processes
