"""The queue placing runs by GPU memory (schedule.decide with `budgets`, gpu_room.py), table-tested on real
recorded GPU output (tests/history_events.py): an H100 80GB HBM3 (81559 MiB) idle, and under load with one
`python3` holding 20076 MiB (another user's, or a worker of one of the queue's runs), and two idle H100 NVL
(95830 MiB each). Budgets are chosen to fill these cards as 5 GiB runs fill a 24 GiB one."""

from __future__ import annotations

from test_queue_schedule import H100, ONLINE, alices_python, entry, h100_idle, h100_running, on

from history_events import owned, parsed, tui_line, worker
from homegpu.remote.events import NodeState
from homegpu.remote.queue import EntryState, NodeView, decide

GIB = 1024 ** 3
RUNNING = EntryState.RUNNING


def two_h100_nvl() -> NodeView:
    return NodeView(ONLINE, parsed(tui_line("h100nvl_idle")))


def test_four_runs_share_a_card_and_a_fifth_waits_saying_who_holds_it() -> None:
    entries = [entry(n) for n in range(1, 6)]
    decision = decide(entries, {"desktop": h100_idle()}, {e.id: on("desktop") for e in entries},
                      budgets={e.id: 19 * GIB for e in entries})
    assert decision.start == ("q-1", "q-2", "q-3", "q-4")
    assert decision.gpus == {f"q-{n}": {"desktop": 0} for n in range(1, 5)}
    assert decision.waits == {"q-5": "needs 19.0 GiB on a GPU: the most free is 3.6 GiB on desktop GPU 0, held by "
                                      "q-1 (19.0 GiB), q-2 (19.0 GiB), q-3 (19.0 GiB) and q-4 (19.0 GiB)"}


def test_the_waiting_run_starts_when_one_of_the_four_ends() -> None:
    running = [entry(n, state=RUNNING, run_id=f"r{n}") for n in (2, 3, 4)]  # q-1 ended; none shows on the GPU yet
    entries = [*running, entry(5)]
    decision = decide(entries, {"desktop": h100_idle()}, {e.id: on("desktop") for e in entries},
                      budgets={e.id: 19 * GIB for e in entries}, placed={e.id: {"desktop": 0} for e in running})
    assert decision.start == ("q-5",) and decision.gpus == {"q-5": {"desktop": 0}}


def test_another_users_process_keeps_a_run_that_does_not_fit_waiting_without_holding_the_node() -> None:
    entries = [entry(1), entry(2)]
    decision = decide(entries, {"desktop": alices_python()}, {e.id: on("desktop") for e in entries},
                      budgets={"q-1": 60 * GIB, "q-2": 5 * GIB})
    assert decision.waits == {"q-1": "needs 60.0 GiB on a GPU: the most free is 59.6 GiB on desktop GPU 0, held by "
                                     "alice's python3 (19.6 GiB)"}
    assert decision.start == ("q-2",)  # the queue cannot tell when alice is done: the card is used meanwhile


def test_a_run_blocked_by_the_queues_own_budgets_holds_its_node_for_its_turn() -> None:
    running = entry(1, state=RUNNING, run_id="r1")
    entries = [running, entry(2), entry(3)]
    decision = decide(entries, {"desktop": h100_idle()}, {e.id: on("desktop") for e in entries},
                      budgets={"q-1": 60 * GIB, "q-2": 30 * GIB, "q-3": 5 * GIB}, placed={"q-1": {"desktop": 0}})
    assert decision.waits == {"q-2": "needs 30.0 GiB on a GPU: the most free is 19.6 GiB on desktop GPU 0, held by "
                                     "q-1 (60.0 GiB)", "q-3": "node desktop held for q-2"}


def test_a_sharing_runs_processes_count_at_what_they_hold_once_they_hold_more_than_its_budget() -> None:
    running = entry(1, state=RUNNING, run_id="r1")  # its worker holds 20076 MiB of a 5 GiB promise
    entries = [running, entry(2)]
    decision = decide(entries, {"desktop": h100_running("r1")}, {e.id: on("desktop") for e in entries},
                      budgets={"q-1": 5 * GIB, "q-2": 60 * GIB}, placed={"q-1": {"desktop": 0}})
    assert decision.waits == {"q-2": "needs 60.0 GiB on a GPU: the most free is 59.6 GiB on desktop GPU 0, held by "
                                     "q-1 (19.6 GiB)"}


def test_a_run_the_queue_did_not_start_holds_its_whole_budget_on_the_card_its_worker_is_on() -> None:
    """`homegpu run` of a job with gpu_memory = "40GiB": its worker holds 19.6 GiB so far, and its agent read the
    budget off it (tests/test_process_owners.py): the rest of the 40 GiB is not the queue's to give."""
    budgeted = {**worker("bob", "finetune", "finetune-1"), "gpu_memory": 40 * GIB}
    decision = decide([entry(1)], {"desktop": NodeView(ONLINE, owned(H100, [budgeted]))}, {"q-1": on("desktop")},
                      budgets={"q-1": 40 * GIB})
    assert decision.waits == {"q-1": "needs 40.0 GiB on a GPU: the most free is 39.2 GiB on desktop GPU 0, held by "
                                     "homegpu worker 0 of job finetune run finetune-1 (40.0 GiB)"}
    unbudgeted = decide([entry(1)], {"desktop": NodeView(ONLINE, owned(H100, [worker("bob", "x", "x-1")]))},
                        {"q-1": on("desktop")}, budgets={"q-1": 40 * GIB})
    assert unbudgeted.start == ("q-1",)  # a worker without one counts at what it holds


def test_each_run_takes_the_card_with_the_most_room() -> None:
    entries = [entry(n) for n in range(1, 5)]
    decision = decide(entries, {"closet": two_h100_nvl()}, {e.id: on("closet") for e in entries},
                      budgets={e.id: 40 * GIB for e in entries})
    assert decision.gpus == {"q-1": {"closet": 0}, "q-2": {"closet": 1}, "q-3": {"closet": 0}, "q-4": {"closet": 1}}


def test_whole_gpu_runs_and_sharing_runs_keep_out_of_each_others_nodes() -> None:
    sharing = entry(1, state=RUNNING, run_id="r1")
    whole = entry(2)
    decision = decide([sharing, whole], {"desktop": h100_idle()}, {"q-1": on("desktop"), "q-2": on("desktop")},
                      budgets={"q-1": 5 * GIB}, placed={"q-1": {"desktop": 0}})
    assert decision.waits == {"q-2": "node desktop busy: q-1 runs there"}
    whole_running = entry(1, state=RUNNING, run_id="r1")
    decision = decide([whole_running, entry(2)], {"desktop": h100_idle()}, {"q-1": on("desktop"), "q-2": on("desktop")},
                      budgets={"q-2": 5 * GIB})
    assert decision.waits == {"q-2": "node desktop busy: q-1 runs there"}


def test_a_node_whose_cards_memory_is_unknown_or_asleep_takes_a_budget_without_a_card() -> None:
    asleep = NodeView(NodeState.ASLEEP)
    decision = decide([entry(1)], {"closet": asleep}, {"q-1": on("closet")}, budgets={"q-1": 5 * GIB})
    assert decision.start == ("q-1",) and decision.gpus == {"q-1": {}}
