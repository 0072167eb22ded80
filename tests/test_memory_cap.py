"""The examples of a step a GPU's memory holds (trainer/memory_cap.py), estimated from the peak its process held at
its share, and the line that says a cap holds a share down. These machines have no GPU: the readings are fed as a
framework gives them (bytes), and each framework's reader is fed its own call's format in test_balance_tf.py and
test_balance_torch.py."""

from __future__ import annotations

from homegpu.trainer import memory_cap
from homegpu.trainer.gpu_budget import BUDGET_ENV

GIB = 1024 ** 3


def test_the_cap_scales_the_share_to_nine_tenths_of_the_memory_and_never_below_the_share():
    # an RTX 4070's 12 GiB, 6 GiB held at 256 examples a step: about 460 fit in 90 % of it
    assert memory_cap.Reading(256, 6 * GIB, 12 * GIB).cap == int(256 * 0.9 * 12 / 6) == 460
    # 11.5 of 12 GiB at 256 is past the margin, but 256 ran: the cap stays there
    assert memory_cap.Reading(256, int(11.5 * GIB), 12 * GIB).cap == 256
    # the job's gpu_memory of 5 GiB on a 24 GiB card: what counts is the 5
    assert memory_cap.Reading(64, 2 * GIB, 5 * GIB).cap == 144


def test_a_reading_takes_the_peak_since_the_last_and_starts_the_count_again():
    peaks, resets = [int(7.2 * GIB), 0], []
    memory = memory_cap.GpuMemory(lambda: peaks[len(resets)], lambda: resets.append(True), 12 * GIB)
    reading = memory.read(200)
    assert reading == memory_cap.Reading(200, int(7.2 * GIB), 12 * GIB) and reading.cap == 300
    assert memory.read(200) is None  # nothing held since: no figure, no cap
    assert len(resets) == 2


def test_the_memory_a_process_may_hold_is_the_jobs_gpu_memory_else_the_cards():
    card = 12 * GIB
    assert memory_cap.usable(lambda: card, {BUDGET_ENV: str(5 * GIB)}) == 5 * GIB
    assert memory_cap.usable(lambda: card, {}) == card
    assert memory_cap.usable(lambda: None, {}) is None


def test_the_line_says_what_the_gpu_holds_from_what_it_held():
    reading = memory_cap.Reading(200, int(7.2 * GIB), 12 * GIB)
    assert reading.line("this process's GPU") == (
        "this process's GPU holds about 300 examples of a step (7.2 of 12.0 GiB used at 200): its share is capped "
        "there and the rest goes to the others")


def test_a_cap_is_said_as_it_starts_to_hold_a_share_down_and_with_each_new_split_while_it_does():
    watch = memory_cap.CapWatch()
    # (holds, moved): not yet; starts holding as the split moves; holds, unmoved; moves again; lets go; holds again
    heard = [watch.due(holds, moved) for holds, moved in
             [(False, True), (True, True), (True, False), (True, True), (False, False), (True, False)]]
    assert heard == [False, True, False, True, False, True]
