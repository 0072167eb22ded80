"""When queued runs start (remote/queue/schedule.py), table-tested on real recorded GPU output.

The nodes' stats are real recordings parsed by the controller's own parser (tests/history_events.py): the
stats agent's NVML lines from a real NVIDIA H100 80GB HBM3 under load (one `python3` holding 20076 MiB),
8 idle H100 SXM's nvidia-smi output, two idle H100 NVL, and an H100 with MIG under load whose three
processes hold 2296, 1272 and 7484 MiB of 81559 (each under 10%). The recordings predate process owners,
so each process's owner (another user's process, or a homegpu worker of a given run) is set in the agent's
JSON format before parsing.
"""

from __future__ import annotations

import random

import pytest

from history_events import h100_lines, owned, parsed, process, sxm8_idle, tui_line, worker
from homegpu.remote.config import parse_cluster
from homegpu.remote.events import NodeState
from homegpu.remote.queue import Decision, EntryState, NodeView, QueueEntry, decide, entry_nodes

T0 = 1_795_316_400.0
ONLINE, OFFLINE = NodeState.ONLINE, NodeState.OFFLINE
H100 = h100_lines()[0]


def alices_python() -> NodeView:
    """The H100 under load, its python3 another user's (alice's) process."""
    return NodeView(ONLINE, owned(H100, [process("alice")]))


def h100_idle() -> NodeView:
    return NodeView(ONLINE, parsed({**H100, "gpus": [{**H100["gpus"][0], "processes": [], "mem_used": 0}]}))


def h100_running(run_id: str) -> NodeView:
    """The H100 under load, its python3 a homegpu worker of run `run_id`."""
    return NodeView(ONLINE, owned(H100, [worker("me", "train", run_id)]))


def idle_8() -> NodeView:
    return NodeView(ONLINE, parsed(sxm8_idle()))


def mig_small_processes() -> NodeView:
    return NodeView(ONLINE, parsed(tui_line("h100_mig_load")))


def entry(number: int, *, priority: int = 0, after: tuple[int, ...] = (), state: EntryState = EntryState.WAITING,
          run_id: str = "") -> QueueEntry:
    return QueueEntry(id=f"q-{number}", job="train", overrides=(), after=tuple(f"q-{a}" for a in after),
                      priority=priority, submitted=T0 + number, user="me", state=state, run_id=run_id)


def on(*nodes: str) -> tuple[str, ...]:
    return nodes


def test_a_foreign_process_delays_an_entry_with_the_reason() -> None:
    nodes = {"desktop": alices_python(), "closet": idle_8()}
    decision = decide([entry(1)], nodes, {"q-1": on("desktop", "closet")})
    assert decision == Decision((), {"q-1": "desktop GPU 0 busy: alice's python3 holds 19.6 GiB"}, {})
    nodes["desktop"] = h100_idle()  # alice's python ended
    assert decide([entry(1)], nodes, {"q-1": on("desktop", "closet")}).start == ("q-1",)


@pytest.mark.parametrize("view, reason", [
    (NodeView(ONLINE, owned(H100, [None])), "desktop GPU 0 busy: pid 468 python3 holds 19.6 GiB"),
    (NodeView(ONLINE, owned(H100, [worker("bob", "bert", "bert-7", index=1)])),
     "desktop GPU 0 busy: homegpu worker 1 of job bert run bert-7 holds 19.6 GiB"),
    (NodeView(ONLINE, owned(H100, [{"kind": "container", "user": "carol", "container": "abc123",
                                    "container_name": "jupyter"}])),
     "desktop GPU 0 busy: container jupyter (user carol) holds 19.6 GiB"),
    (NodeView(ONLINE, owned(H100, [{"kind": "process", "user": "eve\x1b]0;x\x07", "uid": 1001}])),
     "desktop GPU 0 busy: eve\\x1b]0;x\\x07's python3 holds 19.6 GiB"),
])
def test_who_holds_a_gpu_is_said_in_words(view: NodeView, reason: str) -> None:
    assert decide([entry(1)], {"desktop": view}, {"q-1": on("desktop")}).waits == {"q-1": reason}


def test_a_process_under_the_threshold_leaves_the_gpu_free() -> None:
    """The MIG H100's largest process holds 7484 of 81559 MiB (9.2%): free at 10%, busy at 5%."""
    nodes = {"attic": mig_small_processes()}
    assert decide([entry(1)], nodes, {"q-1": on("attic")}).start == ("q-1",)
    assert decide([entry(1)], nodes, {"q-1": on("attic")}, share=0.05).waits == {
        "q-1": "attic GPU 0 busy: pid 21198 gpu_burn holds 7.3 GiB"}


def test_entries_on_disjoint_nodes_start_together() -> None:
    nodes = {"desktop": h100_idle(), "closet": idle_8(), "attic": mig_small_processes()}
    decision = decide([entry(1), entry(2), entry(3)], nodes,
                      {"q-1": on("desktop"), "q-2": on("closet"), "q-3": on("attic", "closet")})
    assert decision.start == ("q-1", "q-2")
    assert decision.waits == {"q-3": "node closet busy: q-2 starts there"}


def test_priority_then_submission_order() -> None:
    nodes = {"closet": idle_8()}
    needs = {f"q-{n}": on("closet") for n in (1, 2, 3)}
    decision = decide([entry(1), entry(2, priority=5), entry(3, priority=5)], nodes, needs)
    assert decision.start == ("q-2",)
    assert decision.waits == {"q-1": "node closet busy: q-2 starts there", "q-3": "node closet busy: q-2 starts there"}


def test_the_queues_own_run_makes_its_node_busy_not_foreign() -> None:
    running = entry(1, state=EntryState.RUNNING, run_id="train-r1")
    nodes = {"desktop": h100_running("train-r1"), "closet": idle_8()}
    decision = decide([running, entry(2), entry(3)], nodes,
                      {"q-1": on("desktop"), "q-2": on("desktop"), "q-3": on("closet")})
    assert decision.start == ("q-3",)
    assert decision.waits == {"q-2": "node desktop busy: q-1 runs there"}
    # the same worker, its run no longer the queue's (it ended, its process lingers): another's process
    ended = entry(1, state=EntryState.SUCCEEDED, run_id="train-r1")
    assert decide([ended, entry(2)], nodes, {"q-1": on("desktop"), "q-2": on("desktop")}).waits == {
        "q-2": "desktop GPU 0 busy: homegpu worker 0 of job train run train-r1 holds 19.6 GiB"}


def test_a_run_seen_on_a_node_outside_its_jobs_nodes_still_takes_it() -> None:
    """Its job's nodes changed in cluster.toml since it started: where its workers are counts too."""
    starting = entry(1, state=EntryState.STARTING, run_id="train-r1")
    nodes = {"desktop": h100_running("train-r1")}
    assert decide([starting, entry(2)], nodes, {"q-2": on("desktop")}).waits == {
        "q-2": "node desktop busy: q-1 runs there"}


def test_after_chains_wait_then_start() -> None:
    nodes = {"closet": idle_8(), "desktop": h100_idle()}
    needs = {"q-1": on("closet"), "q-2": on("desktop"), "q-3": on("desktop")}
    decision = decide([entry(1), entry(2, after=(1,)), entry(3, after=(1, 2))], nodes, needs)
    assert decision == Decision(("q-1",), {"q-2": "after q-1", "q-3": "after q-1, q-2"}, {})
    done = entry(1, state=EntryState.SUCCEEDED, run_id="r1")
    decision = decide([done, entry(2, after=(1,)), entry(3, after=(1, 2))], nodes, needs)
    assert decision == Decision(("q-2",), {"q-3": "after q-2"}, {})


@pytest.mark.parametrize("state, words", [(EntryState.FAILED, "failed"), (EntryState.CANCELLED, "was cancelled")])
def test_a_failure_cancels_its_dependents_with_the_reason(state: EntryState, words: str) -> None:
    nodes = {"closet": idle_8()}
    entries = [entry(1, state=state, run_id="r1"), entry(2, after=(1,)), entry(3, after=(2,)), entry(4)]
    decision = decide(entries, nodes, {f"q-{n}": on("closet") for n in range(1, 5)})
    assert decision == Decision(("q-4",), {}, {"q-2": f"after q-1, which {words}",
                                               "q-3": "after q-2, which was cancelled"})


@pytest.mark.parametrize("nodes, reason", [
    ({"desktop": h100_idle(), "closet": NodeView(OFFLINE)}, "node closet offline"),
    ({"desktop": h100_idle()}, "node closet offline"),
    ({"desktop": h100_idle(), "closet": NodeView(NodeState.CONNECTING)}, "node closet connecting"),
    ({"desktop": h100_idle(), "closet": NodeView(NodeState.HOST_KEY_CHANGED)}, "node closet host key changed"),
    ({"desktop": h100_idle(), "closet": NodeView(ONLINE)}, "node closet has sent no stats yet"),
])
def test_an_offline_node_delays_an_entry(nodes: dict, reason: str) -> None:
    assert decide([entry(1)], nodes, {"q-1": on("desktop", "closet")}) == Decision((), {"q-1": reason}, {})


def test_an_entry_blocked_by_the_queue_holds_its_nodes_for_its_turn() -> None:
    """q-2 (both nodes) waits for q-1 on desktop and holds closet, so q-3 (closet only, later) does not take it;
    blocked by an offline node or another user's process instead, q-2 holds nothing."""
    running = entry(1, state=EntryState.RUNNING, run_id="train-r1")
    needs = {"q-1": on("desktop"), "q-2": on("desktop", "closet"), "q-3": on("closet")}
    nodes = {"desktop": h100_running("train-r1"), "closet": idle_8()}
    assert decide([running, entry(2), entry(3)], nodes, needs) == Decision(
        (), {"q-2": "node desktop busy: q-1 runs there", "q-3": "node closet held for q-2"}, {})
    nodes["desktop"] = alices_python()
    assert decide([entry(2), entry(3)], nodes, needs) == Decision(
        ("q-3",), {"q-2": "desktop GPU 0 busy: alice's python3 holds 19.6 GiB"}, {})
    nodes["desktop"] = NodeView(OFFLINE)
    assert decide([entry(2), entry(3)], nodes, needs).start == ("q-3",)


def test_a_job_gone_from_the_cluster_file_waits_with_the_reason() -> None:
    assert decide([entry(1)], {"closet": idle_8()}, {}).waits == {"q-1": "job train is not in the cluster file"}


def test_the_decision_does_not_depend_on_the_order_it_is_given() -> None:
    entries = [entry(1), entry(2, priority=2), entry(3, after=(1,)), entry(4), entry(5, priority=2),
               entry(6, state=EntryState.RUNNING, run_id="train-r6")]
    nodes = {"desktop": h100_idle(), "closet": idle_8(), "attic": h100_running("train-r6")}
    needs = {"q-1": on("desktop"), "q-2": on("closet"), "q-3": on("desktop"), "q-4": on("attic"),
             "q-5": on("desktop", "closet"), "q-6": on("attic")}
    expected = decide(entries, nodes, needs)
    # q-5 (priority 2, both nodes) waits for q-2 and holds desktop for its turn, so q-1 waits too
    assert expected == Decision(("q-2",), {
        "q-5": "node closet busy: q-2 starts there", "q-1": "node desktop held for q-5", "q-3": "after q-1",
        "q-4": "node attic busy: q-6 runs there"}, {})
    for seed in range(5):
        shuffled = entries[:]
        random.Random(seed).shuffle(shuffled)
        assert decide(shuffled, nodes, needs) == expected


def test_entry_nodes_are_the_jobs_nodes_else_every_node() -> None:
    cluster = parse_cluster('[[nodes]]\nname = "a"\nhost = "h1"\n[[nodes]]\nname = "b"\nhost = "h2"\n'
                            '[jobs.one]\nnodes = ["b"]\n[jobs.all]\n', "cluster.toml")
    assert entry_nodes(cluster, cluster.jobs["one"]) == ("b",)
    assert entry_nodes(cluster, cluster.jobs["all"]) == ("a", "b")
