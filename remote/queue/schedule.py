"""When queued runs start: a pure decision over the entries and the nodes' latest state and stats.

One pass looks at the waiting entries in priority order (higher first), then submission order, and
says which start now, why each other one waits, and which are cancelled:

- `--after`: an entry waits until every entry it names has succeeded ("after q-12"); if one failed or
  was cancelled, it is cancelled with that reason, and so are the entries waiting after it, in the same pass.
- nodes: every node of its job must be online and have sent stats ("node closet offline").
- the queue's own runs: a node where one of the queue's runs is starting or running is busy for the
  others ("node closet busy: q-14 runs there"), as is a node an entry earlier in this pass takes
  ("... q-14 starts there"). A run is placed on all the GPUs of its nodes (a first version: the
  device plan's GPUs would let two runs share a node).
- other users: a GPU where a process outside the queue's runs holds more than `share` (FOREIGN_SHARE,
  10%) of its memory is busy ("desktop GPU 0 busy: alice's python holds 19.6 GiB"); the runner's
  preflight checks it again, for a process that came between this pass and the launch.
- GPU memory: an entry whose job has a `gpu_memory` (its `budgets`) shares cards instead. On each of its nodes it
  takes the GPU with the most free memory, counting every process there and the budgets of the queue's runs
  already on it (gpu_room.py), if that is at least its budget ("needs 5.0 GiB on a GPU: the most free is 4.2 GiB
  on desktop GPU 0, held by alice's python (14.8 GiB) and q-14 (5.0 GiB)"); `Decision.gpus` says which. A node
  with one of the queue's whole-GPU runs is busy for it, and a node with a sharing run is busy for a whole-GPU
  entry. A node whose GPUs' memory is not known (none, or an agent that cannot read it) holds nothing back.

Turns: an entry blocked only by the queue's own runs holds its other online nodes against entries
after it ("node closet held for q-13"), so a run across two nodes is not passed over forever by
smaller runs on either one. An entry blocked by an offline node or another user's process holds nothing:
the queue cannot tell when those end, and the nodes are better used meanwhile. Entries on disjoint
nodes start in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

from homegpu.remote.config import ClusterSpec, JobSpec
from homegpu.remote.events import NodeState, NodeStats
from homegpu.remote.nodes import FOREIGN_SHARE, MIB, gib
from homegpu.remote.plan import job_node_specs
from homegpu.remote.queue.entries import EntryState, QueueEntry
from homegpu.remote.queue.gpu_room import Card, cards, holder, processes, roomiest, wants_text


@dataclass(frozen=True)
class NodeView:
    """One node as serve sees it now: its session's state and latest stats (None: none yet)."""

    state: NodeState
    stats: NodeStats | None = None


@dataclass(frozen=True)
class Decision:
    """One pass's outcome. `start`: ids to start now, in order; `waits`: id -> why it waits;
    `cancels`: id -> why it is cancelled (an entry it waits `--after` failed or was cancelled); `gpus`: for a
    started entry with a budget, node -> the GPU it runs on there."""

    start: tuple[str, ...] = ()
    waits: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cancels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    gpus: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}))


def entry_nodes(cluster: ClusterSpec, job: JobSpec) -> tuple[str, ...]:
    """The nodes a run of `job` needs (its `nodes`, else every node): what `decide`'s `needs` holds."""
    return tuple(node.name for node in job_node_specs(cluster, job))


@dataclass(frozen=True)
class _Block:
    reason: str
    ours: bool  # the queue's own doing: it clears when a queued run ends


def decide(entries: Iterable[QueueEntry], nodes: Mapping[str, NodeView], needs: Mapping[str, tuple[str, ...]],
           share: float = FOREIGN_SHARE, budgets: Mapping[str, int] = MappingProxyType({}),
           placed: Mapping[str, Mapping[str, int]] = MappingProxyType({})) -> Decision:
    """Which waiting entries start now, why the others wait, and which are cancelled.

    Args:
        entries: the queue's entries (at least the waiting and active ones, and those they wait after).
        nodes: node name -> its view; a node missing from it is taken as offline.
        needs: entry id -> the nodes its run uses (`entry_nodes` of its job with its overrides).
        share: the share of a GPU's memory another user's process may hold without making it busy.
        budgets: entry id -> the bytes each process of its run holds on its GPU (its job's gpu_memory); an entry
            missing from it, or 0, takes whole GPUs.
        placed: entry id -> node -> GPU, for the queue's active runs with a budget (where a decision put them).
    """
    entries = list(entries)
    by_id = {entry.id: entry for entry in entries}
    cancels = _cancelled_after(entries, by_id)
    active = [entry for entry in entries if entry.state.active]
    own_runs = {entry.run_id for entry in active if entry.run_id}
    budget_mib = {id_: size / MIB for id_, size in budgets.items() if size}
    sharing_runs = [entry for entry in active if entry.id in budget_mib]
    taken = _nodes_of_active([e for e in active if e.id not in budget_mib], nodes, needs)  # node -> "q-14 runs there"
    sharing = _nodes_of_active(sharing_runs, nodes, needs)  # nodes where the queue's runs share the GPUs
    room = _room(nodes, active, sharing_runs, budget_mib, placed)
    held: dict[str, str] = {}  # node -> "q-13": held for an earlier entry's turn
    start, waits, gpus = [], {}, {}
    for entry in sorted((e for e in entries if e.state is EntryState.WAITING), key=lambda e: e.order):
        if entry.id in cancels:
            continue
        pending = [item for item in entry.after if by_id[item].state is not EntryState.SUCCEEDED]
        if pending:
            waits[entry.id] = "after " + ", ".join(pending)
            continue
        wanted = needs.get(entry.id)
        if wanted is None:
            waits[entry.id] = f"job {entry.job} is not in the cluster file"
            continue
        budget = budget_mib.get(entry.id)
        if budget:
            block, picks = _first_block_sharing(wanted, nodes, taken, held, budget, room)
        else:
            block, picks = _first_block(wanted, nodes, {**sharing, **taken}, held, own_runs, share), {}
        if block is None:
            start.append(entry.id)
            (sharing if budget else taken).update({node: f"{entry.id} starts there" for node in wanted})
            if budget:
                gpus[entry.id] = MappingProxyType(picks)
                for node, index in picks.items():
                    room[(node, index)].promise(entry.id, budget)
            continue
        waits[entry.id] = block.reason
        if block.ours:
            for node in wanted:
                held.setdefault(node, entry.id)
    return Decision(tuple(start), MappingProxyType(waits), MappingProxyType(cancels), MappingProxyType(gpus))


def _room(nodes: Mapping[str, NodeView], active: list[QueueEntry], sharing_runs: list[QueueEntry],
          budget_mib: Mapping[str, float], placed: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], Card]:
    """Every known card, with the budgets of the queue's sharing runs promised where a decision put them."""
    room = cards({name: view.stats for name, view in nodes.items()},
                 {entry.run_id: entry.id for entry in active if entry.run_id})
    for entry in sharing_runs:
        for node, index in placed.get(entry.id, {}).items():
            if (node, index) in room:
                room[(node, index)].promise(entry.id, budget_mib[entry.id])
    return room


def _cancelled_after(entries: list[QueueEntry], by_id: dict[str, QueueEntry]) -> dict[str, str]:
    """Waiting entries whose `--after` failed or was cancelled, this pass's cancellations included
    (an entry only waits after earlier ones, so one walk in id order follows each chain to its end)."""
    cancels: dict[str, str] = {}
    for entry in sorted((e for e in entries if e.state is EntryState.WAITING), key=lambda e: e.number):
        for item in entry.after:
            before = by_id.get(item)
            if before is None:
                cancels[entry.id] = f"after {item}, which is not in the queue"
            elif item in cancels or before.state is EntryState.CANCELLED:
                cancels[entry.id] = f"after {item}, which was cancelled"
            elif before.state is EntryState.FAILED:
                cancels[entry.id] = f"after {item}, which failed"
            else:
                continue
            break
    return cancels


def _nodes_of_active(active: list[QueueEntry], nodes: Mapping[str, NodeView],
                     needs: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """node -> "q-14 runs there" for the queue's starting and running entries: their job's nodes, and any
    node where a worker of their run is seen (their job may have left the cluster file since)."""
    taken: dict[str, str] = {}
    by_run = {entry.run_id: entry.id for entry in active if entry.run_id}
    for entry in active:
        for node in needs.get(entry.id, ()):
            taken.setdefault(node, f"{entry.id} runs there")
    for node, view in nodes.items():
        for process in processes(view.stats):
            owner = process.owner
            if owner is not None and owner.kind == "worker" and owner.run_id in by_run:
                taken.setdefault(node, f"{by_run[owner.run_id]} runs there")
    return taken


def _first_block(wanted: tuple[str, ...], nodes: Mapping[str, NodeView], taken: Mapping[str, str],
                 held: Mapping[str, str], own_runs: set[str], share: float) -> _Block | None:
    """What keeps a run on `wanted` (whole GPUs) from starting now, the most lasting first; None: nothing."""
    block = _unreached(wanted, nodes)
    if block:
        return block
    awake = [node for node in wanted if nodes[node].stats is not None]
    foreign = next((line for node in awake for line in _busy_gpus(node, nodes[node].stats, own_runs, share)), None)
    if foreign:
        return _Block(foreign, ours=False)
    return _queue_block(wanted, taken, held)


def _first_block_sharing(wanted: tuple[str, ...], nodes: Mapping[str, NodeView], taken: Mapping[str, str],
                         held: Mapping[str, str], budget: float,
                         room: Mapping[tuple[str, int], Card]) -> tuple[_Block | None, dict[str, int]]:
    """What keeps a run with a `budget` (MiB) on `wanted` from starting now, and else node -> the GPU it takes
    there (an asleep node, or one whose GPUs' memory is not known, is given none: its GPUs hold no one else's)."""
    block = _unreached(wanted, nodes) or _queue_block(wanted, taken, held)
    if block:
        return block, {}
    picks = {}
    for node in wanted:
        card = roomiest(room, node) if nodes[node].stats is not None else None
        if card is None:
            continue
        if card.free < budget:
            return _Block(wants_text(budget, card), ours=card.free_without_the_queue >= budget), {}
        picks[node] = card.index
    return None, picks


def _unreached(wanted: tuple[str, ...], nodes: Mapping[str, NodeView]) -> _Block | None:
    """A node of `wanted` that is not online (an asleep one is: the run wakes it first, JobRun.prepare) or has
    sent no stats yet."""
    for node in wanted:
        view = nodes.get(node)
        if view is not None and view.state is NodeState.ASLEEP:
            continue  # its GPUs are free
        if view is None or view.state is not NodeState.ONLINE:
            state = view.state.value if view is not None else NodeState.OFFLINE.value
            return _Block(f"node {node} {state}", ours=False)
        if view.stats is None:
            return _Block(f"node {node} has sent no stats yet", ours=False)
    return None


def _queue_block(wanted: tuple[str, ...], taken: Mapping[str, str], held: Mapping[str, str]) -> _Block | None:
    """A node of `wanted` busy with one of the queue's runs, or held for an earlier entry's turn."""
    for node in wanted:
        if node in taken:
            return _Block(f"node {node} busy: {taken[node]}", ours=True)
        if node in held:
            return _Block(f"node {node} held for {held[node]}", ours=True)
    return None


def _busy_gpus(node: str, stats: NodeStats, own_runs: set[str], share: float) -> Iterable[str]:
    """"desktop GPU 0 busy: alice's python holds 19.6 GiB" for each process outside the queue's runs that
    holds more than `share` of its GPU's memory (a process whose memory is not known is not counted)."""
    for gpu in stats.gpus:
        total = gpu.mem_total
        if not isinstance(total, (int, float)) or total <= 0:
            continue
        for process in gpu.processes:
            owner, mem = process.owner, process.mem
            if owner is not None and owner.kind == "worker" and owner.run_id in own_runs:
                continue
            if isinstance(mem, (int, float)) and mem > share * total:
                yield f"{node} GPU {gpu.index} busy: {holder(process)} holds {gib(mem)} GiB"
