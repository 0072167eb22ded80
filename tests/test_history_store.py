"""The cluster's history store (remote/history/): real SQLite files in tmp_path, events made of the hub's real
dataclasses, and stats that are real recorded agent output parsed by the controller's own parser: the
stats agent's NVML lines recorded on a real NVIDIA H100 80GB HBM3 under load, the TUI fixtures' H100
with MIG (three processes, no utilisation reading) and two H100 NVL, and 8 H100 SXM's nvidia-smi output
(tests/history_events.py; the recordings predate process owners, so owners are added in the agent's
JSON format). A simulated clock drives the real recorder through hours and days in a second or two.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import wait_until
from history_events import h100_lines, owned, parsed, process, sxm8_idle, tui_line, worker
from homegpu.remote.config import Tariff, embedded_default, load_cluster
from homegpu.remote.events import (
    NA, EventHub, GpuProcess, NodeState, NodeStateChanged, NodeStats, NodeStatsUpdated, ProcessOwner,
)
from homegpu.remote.history import (
    HistoryDamaged, HistoryError, HistoryReader, HistoryRecorder, NodeOffline, history_path,
)
from homegpu.remote.history.samples import UNKNOWN_OWNER, OwnerKey, owner_key, owner_shares

T0 = 1_795_316_400.0  # a whole hour (and minute): buckets start at T0
HOUR, DAY = 3600.0, 86400.0
MIB = 1024 * 1024
ALICE_DEMO = worker("alice", "demo", "demo-1")


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def h100(owner: dict | None = ALICE_DEMO, k: int = 0):
    """The k-th recorded H100 line (they differ in power, clocks, CPU), its one process owned by `owner`."""
    lines = h100_lines()
    return owned(lines[k % len(lines)], [owner])


def mig_shared():
    """The recorded MIG H100: two memhogs (2296 + 1272 MiB) of bob's, a gpu_burn (7484 MiB) of alice's run."""
    return owned(tui_line("h100_mig_load"), [process("bob"), process("bob"), worker("alice", "burn", "burn-1")])


def feed(recorder: HistoryRecorder, clock: Clock, node: str, stats, start: float, stop: float,
         every: float = 1.0, tick: float = 1.0) -> None:
    """`node`'s samples from `start` to `stop` inclusive, `every` seconds, the clock following them in
    steps of `tick` (a minute makes a simulated day's writes 60 times fewer, the rows the same).
    `stats` is a NodeStats or a function of the sample's number."""
    k, t = 0, start
    while t <= stop:
        if t - clock.t >= tick or t == stop:
            clock.t = t
        recorder.handle(NodeStatsUpdated(node, stats(k) if callable(stats) else stats, at=t))
        k, t = k + 1, start + (k + 1) * every


def state(recorder: HistoryRecorder, clock: Clock, node: str, at: float, new: NodeState, reason: str = "") -> None:
    clock.t = max(clock.t, at)
    recorder.handle(NodeStateChanged(node, new, reason, at=at))


def rows(path: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute(sql, args).fetchall()


def on_disk(path: Path) -> int:
    """The file and its write-ahead log, as the size bound counts them."""
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


# -- the GPU-hours rule ---------------------------------------------------------------------------------


def test_owner_shares_follow_memory_and_split_evenly_where_it_is_not_known():
    bob, job = ProcessOwner("process", user="bob", uid=1001), ProcessOwner("worker", "alice", 1000, "r1", "demo", 0)
    shares = owner_shares([GpuProcess(1, "a", 3000, bob), GpuProcess(2, "b", 1000, bob), GpuProcess(3, "c", 4000, job)])
    assert [(s.owner, s.share, s.mem) for s in shares] == [
        (OwnerKey("process", "bob", "", "", ""), 0.5, 4000), (OwnerKey("worker", "alice", "demo", "r1", ""), 0.5, 4000)]
    shares = owner_shares([GpuProcess(1, "a", NA, bob), GpuProcess(3, "c", 4000, job), GpuProcess(4, "d", 10, None)])
    assert [s.share for s in shares] == [pytest.approx(1 / 3)] * 3 and shares[0].mem is None
    assert shares[2].owner == UNKNOWN_OWNER  # an agent that did not say whose
    assert owner_key(ProcessOwner("process", uid=1234)) == OwnerKey("process", "uid 1234", "", "", "")
    assert owner_shares([]) == []


# -- recording ---------------------------------------------------------------------------------------


def test_samples_are_buffered_and_written_once_a_second_of_the_clock(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    for n in range(16):  # a second's worth of a 16-node cluster: nothing is written yet
        recorder.handle(NodeStatsUpdated(f"node{n}", h100(k=n), at=T0 + n / 100))
    assert rows(path, "SELECT count(*) FROM node_samples") == [(0,)]
    clock.t = T0 + 1.0
    recorder.handle(NodeStatsUpdated("node0", h100(), at=T0 + 1.0))
    assert rows(path, "SELECT count(*), count(DISTINCT node) FROM node_samples") == [(17, 16)]
    assert rows(path, "SELECT count(*) FROM gpu_samples") == [(17,)]
    clock.t = T0 - HOUR  # the clock set back (NTP): writing goes on, it does not wait an hour
    recorder.handle(NodeStatsUpdated("node0", h100(), at=T0 + 2.0))
    assert rows(path, "SELECT count(*) FROM node_samples") == [(18,)]
    recorder.close()


def test_recorded_values_come_back_as_means_per_point(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    lines = h100_lines()
    feed(recorder, clock, "h100", lambda k: parsed(lines[k % len(lines)]), T0, T0 + 599)
    feed(recorder, clock, "mig", parsed(tui_line("h100_mig_load")), T0, T0 + 599)
    feed(recorder, clock, "nvl", parsed(tui_line("h100nvl_idle")), T0, T0 + 299)  # offline for the second half
    recorder.close()

    with HistoryReader(path, clock=clock) as history:
        gpus = {(g.node, g.gpu): g for g in history.gpus(T0, T0 + 600, points=10)}
        assert sorted(gpus) == [("h100", 0), ("mig", 0), ("nvl", 0), ("nvl", 1)]
        h100_gpu = gpus[("h100", 0)]
        assert h100_gpu.name == "NVIDIA H100 80GB HBM3" and h100_gpu.mem_total == 81559
        assert h100_gpu.times == tuple(T0 + 30 + 60 * i for i in range(10))  # each slice's middle
        assert h100_gpu.util == (100,) * 10 and h100_gpu.mem_used == (20564,) * 10
        assert gpus[("mig", 0)].util == (None,) * 10  # MIG: no utilisation reading, NULL and not 0
        assert gpus[("nvl", 1)].util == (0,) * 5 + (None,) * 5  # nothing recorded while it was away
        power = [round(line["gpus"][0]["power"]) for line in lines]
        with sqlite3.connect(path) as db:  # a point is the mean of its 60 samples, each kept in whole watts
            first = db.execute("SELECT avg(power) FROM gpu_samples WHERE node = 1 AND t < ?", (T0 + 60,)).fetchone()
        assert first[0] == pytest.approx(sum(power[k % len(power)] for k in range(60)) / 60)
        cpu = {n.node: n for n in history.nodes(T0, T0 + 600, points=2)}
        expected_cpu = sum(round(lines[k % len(lines)]["cpu"]) for k in range(300)) / 300  # each kept in whole %
        assert cpu["h100"].cpu[0] == pytest.approx(expected_cpu) and cpu["h100"].mem_total == 128887
        assert history.span() == (T0, T0 + 599)


def test_tiers_compact_as_the_clock_moves_and_old_rows_are_dropped(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    lines = h100_lines()
    feed(recorder, clock, "h100", lambda k: h100(k=k), T0, T0 + 3 * HOUR - 1, tick=10)  # 3 h at 1 Hz
    now = clock.t
    recorder.flush()
    # Older than an hour (and the minute compaction may lag): 10 s buckets of 10 samples at their middles.
    old = rows(path, "SELECT t, n, power FROM gpu_samples WHERE t < ?", now - HOUR - 60)
    assert old and all(n == 10 and (t - T0 - 5) % 10 == 0 for t, n, _ in old)
    first_ten = [round(lines[k % len(lines)]["gpus"][0]["power"]) for k in range(10)]
    assert old[0] == (T0 + 5, 10, round(sum(first_ten) / 10))
    assert rows(path, "SELECT count(*), min(n), max(n) FROM gpu_samples WHERE t > ?", now - HOUR) == [(3600, 1, 1)]

    feed(recorder, clock, "h100", h100(), now + 300, now + 2 * DAY, every=300)  # two days, a sample each 5 min
    now = clock.t
    recorder.flush()
    day_old = rows(path, "SELECT t, n FROM gpu_samples WHERE t < ? ORDER BY t", now - DAY - 60)
    assert all((t - T0 - 30) % 60 == 0 for t, _ in day_old)  # 60 s buckets, made of the 10 s ones
    assert [n for _, n in day_old[:180]] == [60] * 180  # the first 3 h: 60 samples a minute, none lost
    for table in ("node_samples", "gpu_samples", "owner_samples"):  # every sample still counted, in every table
        assert rows(path, f"SELECT sum(n) FROM {table}") == [(3 * 3600 + 2 * 288,)], table

    feed(recorder, clock, "h100", h100(), now + HOUR, now + 31 * DAY, every=6 * HOUR)  # a month on
    recorder.flush()
    oldest = rows(path, "SELECT min(t) FROM gpu_samples")[0][0]
    assert clock.t - 30 * DAY - 60 <= oldest  # nothing older than 30 days (give or take the minute's lag)
    recorder.close()


# -- the queries -------------------------------------------------------------------------------------------


def test_gpu_hours_per_user_and_per_run_by_hand_and_through_the_tiers(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    feed(recorder, clock, "mig", mig_shared(), T0, T0 + 600)  # 601 samples: 600 s of GPU time
    feed(recorder, clock, "h100", h100(), T0, T0 + 1800)  # alice's demo-1 worker: 1800 s
    state(recorder, clock, "h100", T0 + 1800.5, NodeState.OFFLINE, "connection lost")
    state(recorder, clock, "h100", T0 + 1890, NodeState.CONNECTING)
    state(recorder, clock, "h100", T0 + 1899, NodeState.ONLINE)
    feed(recorder, clock, "h100", h100(), T0 + 1900, T0 + 2000)  # after the gap: 100 s, not 200
    feed(recorder, clock, "h100", h100(), T0 + 2030, T0 + 2100)  # a 30 s silence counts max_gap (10 s): 80 s
    recorder.flush()

    bob_s = 600 * (2296 + 1272) / (2296 + 1272 + 7484)  # the memhogs' share of the MIG GPU's 600 s
    burn_s = 600 * 7484 / (2296 + 1272 + 7484)
    demo_s = 1800 + 100 + 10 + 70
    expected_users = {"alice": (demo_s + burn_s) / HOUR, "bob": bob_s / HOUR}
    expected_runs = {"demo-1": demo_s / HOUR, "burn-1": burn_s / HOUR}

    def check(history: HistoryReader) -> None:
        users = history.gpu_hours_by_user(T0, T0 + HOUR)
        assert [u.user for u in users] == ["alice", "bob"]
        for found in users:  # each sample's share is kept to the millisecond
            assert found.gpu_hours == pytest.approx(expected_users[found.user], abs=1e-4)
        runs = history.gpu_hours_by_run(T0, T0 + HOUR)
        assert [(r.job, r.run_id, r.user) for r in runs] == [("demo", "demo-1", "alice"), ("burn", "burn-1", "alice")]
        assert runs[0].gpu_hours == pytest.approx(demo_s / HOUR, abs=1e-6)  # the whole GPU: no rounding
        assert runs[1].gpu_hours == pytest.approx(expected_runs["burn-1"], abs=1e-4)

    with HistoryReader(path, clock=clock) as history:
        check(history)
        assert history.gpu_hours_by_user(T0 + 1000, T0 + 1100)[0].gpu_hours == pytest.approx(100 / HOUR)
    check_in_buckets(recorder, path, clock, check)
    assert rows(path, "SELECT count(*) FROM owner_samples WHERE (t - 30) % 60 != 0") == [(0,)]
    recorder.close()


def check_in_buckets(recorder: HistoryRecorder, path: Path, clock: Clock, check) -> None:
    """Two days on, every row is in 60 s buckets: `check` the history again (the sums must be the same)."""
    clock.t = T0 + 2 * DAY
    recorder.flush()
    with HistoryReader(path, clock=clock) as history:
        check(history)


def test_offline_intervals_and_a_node_gone_for_a_day(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    for node in ("a", "b", "c"):
        state(recorder, clock, node, T0, NodeState.CONNECTING)  # a session starts by connecting: not offline
    state(recorder, clock, "a", T0 + 1, NodeState.ONLINE)
    state(recorder, clock, "c", T0 + 1, NodeState.ONLINE)
    state(recorder, clock, "b", T0 + 50, NodeState.OFFLINE, "ssh: connect to node b: No route to host")
    state(recorder, clock, "a", T0 + 100, NodeState.OFFLINE, "connection lost")
    state(recorder, clock, "a", T0 + 110, NodeState.CONNECTING)  # retrying is still offline
    state(recorder, clock, "a", T0 + 120, NodeState.OFFLINE, "timed out")
    state(recorder, clock, "a", T0 + 400, NodeState.ONLINE)
    feed(recorder, clock, "c", h100(), T0 + 401, T0 + DAY + 50, every=600)  # a day passes; b never comes back
    clock.t = T0 + DAY + 50
    recorder.flush()

    with HistoryReader(path, clock=clock) as history:
        found = {n.node: n for n in history.offline(T0, T0 + DAY + 50)}
        assert sorted(found) == ["a", "b", "c"]
        (a,) = found["a"].intervals
        assert (a.start, a.stop, a.state, a.reason, a.ongoing) == (T0 + 100, T0 + 400, "offline", "connection lost",
                                                                    False)
        assert found["a"].seconds == 300
        (b,) = found["b"].intervals
        assert b.ongoing and b.start == T0 + 50 and found["b"].seconds == DAY
        assert found["c"] == NodeOffline("c", (), 0)
        clipped = {n.node: n.seconds for n in history.offline(T0 + 200, T0 + 1000)}
        assert clipped == {"a": 200, "b": 800, "c": 0}
    recorder.close()  # b's interval ends where recording ended
    with HistoryReader(path, clock=Clock(T0 + 5 * DAY)) as history:
        b = {n.node: n for n in history.offline(T0, T0 + 5 * DAY)}["b"]
        assert not b.intervals[0].ongoing and b.seconds == DAY


# -- lasting -----------------------------------------------------------------------------------------------


def test_reopening_keeps_the_data_and_goes_on(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    feed(recorder, clock, "h100", h100(), T0, T0 + 2 * HOUR)
    recorder.close()
    before = rows(path, "SELECT * FROM gpu_samples ORDER BY t")

    recorder = HistoryRecorder(path, clock=clock)
    assert rows(path, "SELECT * FROM gpu_samples ORDER BY t") == before
    feed(recorder, clock, "h100", h100(), T0 + 2 * HOUR + 1, T0 + 3 * HOUR)
    recorder.close()
    with HistoryReader(path, clock=clock) as history:
        # 3 h of the one process, less one second: the first sample after the restart counts no time
        (alice,) = history.gpu_hours_by_user(T0, T0 + 3 * HOUR + 1)
        assert alice.gpu_hours == pytest.approx((3 * HOUR - 1) / HOUR)
        assert history.span() == (T0 + 5, T0 + 3 * HOUR)  # the oldest now a 10 s bucket's middle
    assert rows(path, "SELECT count(*) FROM nodes") == [(1,)] and rows(path, "SELECT count(*) FROM sessions") == [(2,)]

    recorder = HistoryRecorder(path, clock=clock)  # two days on: all of it in 60 s buckets
    feed(recorder, clock, "h100", h100(), T0 + 3 * HOUR + 600, T0 + 2 * DAY, every=600, tick=600)
    recorder.close()
    minutes = rows(path, "SELECT t FROM gpu_samples WHERE t < ?", T0 + DAY)
    recorder = HistoryRecorder(path, clock=clock)  # reopened, its tiers go on where they were
    feed(recorder, clock, "h100", h100(), T0 + 2 * DAY + 60, T0 + 2 * DAY + 180, every=60)
    recorder.close()
    assert minutes and rows(path, "SELECT t FROM gpu_samples WHERE t < ?", T0 + DAY) == minutes
    assert all((t - T0 - 30) % 60 == 0 for (t,) in minutes)


CRASH = """
import sys
sys.path.insert(0, {tests!r})
import os
from history_events import h100_lines, parsed
from homegpu.remote.history import HistoryRecorder
from homegpu.remote.events import NodeState, NodeStateChanged, NodeStatsUpdated
now = [{t0!r}]
recorder = HistoryRecorder({path!r}, clock=lambda: now[0])
recorder.handle(NodeStateChanged("gone", NodeState.OFFLINE, "connection lost", at=now[0]))
for s in range(120):
    now[0] = {t0!r} + s
    recorder.handle(NodeStatsUpdated("h100", parsed(h100_lines()[0]), at=now[0]))
recorder.flush()
os._exit(9)  # killed: no close()
"""


def test_a_recorder_killed_without_closing_leaves_a_store_that_reopens(tmp_path):
    path = tmp_path / "history.sqlite"
    script = CRASH.format(tests=str(Path(__file__).parent), t0=T0, path=str(path))
    assert subprocess.run([sys.executable, "-c", script]).returncode == 9
    clock = Clock(T0 + DAY)
    HistoryRecorder(path, clock=clock).close()  # reopened: the interval left open ends at the last write
    with HistoryReader(path, clock=clock) as history:
        (gone,) = [n for n in history.offline(T0, T0 + DAY) if n.node == "gone"]
        assert 119 - 10 <= gone.seconds <= 119 and not gone.intervals[0].ongoing  # to its last mark (each 10 s)
        assert history.span() == (T0, T0 + 119)


def test_the_size_bound_holds_through_a_long_period(tmp_path):
    path, clock, bound = tmp_path / "history.sqlite", Clock(), 1 * MIB
    recorder = HistoryRecorder(path, max_bytes=bound, clock=clock)
    biggest = 0
    # Two days of one H100 node with its worker: 1 Hz for the last 6 hours, a sample each 10 s before
    # (what is bucketed holds as many rows either way), the file measured on disk every simulated minute.
    for start, stop, every in ((T0, T0 + 1.75 * DAY - 10, 10.0), (T0 + 1.75 * DAY, T0 + 2 * DAY, 1.0)):
        for minute in range(int((stop - start) // 60) + 1):
            first = start + minute * 60
            feed(recorder, clock, "h100", h100(), first, min(stop, first + 60 - every), every=every, tick=60)
            biggest = max(biggest, on_disk(path))
    now = clock.t
    recorder.close()
    assert biggest <= bound and on_disk(path) <= bound
    assert recorder.bound.trims > 0  # it did have to drop rows to stay there
    oldest, newest = rows(path, "SELECT min(t), max(t) FROM gpu_samples")[0]
    assert oldest > T0 + DAY and newest == now  # the oldest went first; the newest hour is whole:
    assert rows(path, "SELECT count(*) FROM gpu_samples WHERE t > ?", now - HOUR) == [(3600,)]
    with HistoryReader(path, clock=clock) as history:
        (alice,) = history.gpu_hours_by_user(now - HOUR + 0.5, now + 1)  # 3600 samples, each standing for 1 s
        assert alice.gpu_hours == pytest.approx(1.0)


def test_a_lower_bound_on_reopening_shrinks_the_file_at_once(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, max_bytes=8 * MIB, clock=clock)
    for node in ("a", "b"):
        feed(recorder, clock, node, h100(), T0, T0 + HOUR)
    feed(recorder, clock, "c", parsed(sxm8_idle()), T0, T0 + HOUR)
    recorder.close()
    assert path.stat().st_size > 1.2 * MIB
    recorder = HistoryRecorder(path, max_bytes=1 * MIB, clock=clock)
    assert on_disk(path) <= 1 * MIB
    assert rows(path, "SELECT max(t) FROM gpu_samples") == [(T0 + HOUR,)]  # the oldest went, not the newest
    recorder.close()
    with pytest.raises(ValueError, match="at least 1048576 bytes"):
        HistoryRecorder(path, max_bytes=1000)


# -- a damaged file ------------------------------------------------------------------------------------------


def damaged_files(tmp_path: Path) -> dict[str, Path]:
    whole = tmp_path / "whole.sqlite"
    clock = Clock()
    recorder = HistoryRecorder(whole, clock=clock)
    feed(recorder, clock, "h100", h100(), T0, T0 + 600)
    recorder.close()
    data = whole.read_bytes()
    files = {"truncated": data[: len(data) // 2], "garbage": os.urandom(64 * 1024), "empty": b""}
    made = {}
    for name, content in files.items():
        made[name] = tmp_path / f"{name}.sqlite"
        made[name].write_bytes(content)
    made["other sqlite"] = tmp_path / "timeline.sqlite"
    with sqlite3.connect(made["other sqlite"]) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    return made


def modes(path: Path) -> dict[str, str]:
    """The permission bits of a store, its -wal and -shm where they are, and its folder."""
    found = {path.name + suffix: path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm")}
    found["folder"] = path.parent
    return {name: oct(stat.S_IMODE(each.stat().st_mode)) for name, each in found.items() if each.exists()}


def test_the_history_is_its_users_alone_with_its_wal_and_shm(tmp_path):
    """Who ran what, on which GPU, for how long: 0600 in a 0700 folder, the files SQLite makes beside it too."""
    path, clock = tmp_path / "data" / "homegpu" / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    feed(recorder, clock, "h100", h100(), T0, T0 + 3)
    assert modes(path) == {"history.sqlite": "0o600", "history.sqlite-wal": "0o600", "history.sqlite-shm": "0o600",
                           "folder": "0o700"}
    recorder.close()


def test_an_older_homegpus_open_history_and_folder_are_closed_when_serve_opens_them(tmp_path):
    path, clock = tmp_path / "homegpu" / "history.sqlite", Clock()
    HistoryRecorder(path, clock=clock).close()
    path.parent.chmod(0o755)  # as an older homegpu left them
    path.chmod(0o644)
    with sqlite3.connect(path) as reader:  # a reader that makes its -wal and -shm as the file is, 0644
        reader.execute("SELECT count(*) FROM nodes").fetchall()
        assert modes(path)["history.sqlite-shm"] == "0o644"
        recorder = HistoryRecorder(path, clock=clock)
        feed(recorder, clock, "h100", h100(), T0, T0 + 3)
        assert set(modes(path).values()) == {"0o600", "0o700"} and len(modes(path)) == 4, modes(path)
        recorder.close()


def test_a_damaged_file_is_one_line_naming_it_and_what_to_do(tmp_path):
    for kind, path in damaged_files(tmp_path).items():
        before = path.read_bytes()
        for open_it in (HistoryRecorder, HistoryReader):
            with pytest.raises(HistoryDamaged) as caught:
                open_it(path).close()
            message = str(caught.value)
            assert "\n" not in message and message.startswith(f"{path} is damaged ("), (kind, message)
            assert f"mv {path} {path}.damaged" in message
        assert path.read_bytes() == before, kind  # left as it was, for the user to look at
    assert "not a homegpu history file" in str(pytest.raises(HistoryDamaged, HistoryReader,
                                                             tmp_path / "timeline.sqlite").value)


def test_a_history_that_cannot_be_created_is_one_line_too(tmp_path):
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "history.sqlite"  # its folder is a file
    with pytest.raises(HistoryError) as caught:
        HistoryRecorder(path)
    assert str(caught.value).startswith(f"cannot write the history {path} (") and "\n" not in str(caught.value)
    with pytest.raises(HistoryDamaged, match="not a file"):
        HistoryRecorder(tmp_path)


def test_each_cluster_file_has_its_own_history(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    first, second = tmp_path / "one" / "cluster.toml", tmp_path / "two" / "cluster.toml"
    for config in (first, second):
        config.parent.mkdir()
        config.write_text('[cluster]\nname = "lab"\n\n[[nodes]]\nname = "a"\nhost = "local"\n')
    paths = {history_path(load_cluster(config)) for config in (first, second)}
    assert len(paths) == 2 and all(p.parent == tmp_path / "data" / "homegpu" for p in paths)
    assert all(p.name.startswith("history-lab-") and p.suffix == ".sqlite" for p in paths)
    assert history_path(embedded_default()).name.startswith("history-")


# -- on the hub --------------------------------------------------------------------------------------------


async def test_the_recorder_follows_the_hub_as_one_more_subscriber(tmp_path):
    path, hub = tmp_path / "history.sqlite", EventHub()
    recorder = HistoryRecorder(path).follow(hub)
    front_end = hub.subscribe()
    hub.publish(NodeStateChanged("h100", NodeState.CONNECTING))
    hub.publish(NodeStateChanged("h100", NodeState.ONLINE))
    start = time.time()
    for i in range(5):  # samples 0.3 s apart, as a fast agent sends them
        hub.publish(NodeStatsUpdated("h100", h100(), at=start + 0.3 * i))
    # written while it runs (a write a second), not only when it stops
    await wait_until(lambda: rows(path, "SELECT count(*) FROM gpu_samples") == [(5,)], 60, "the samples written")
    hub.publish(NodeStateChanged("h100", NodeState.OFFLINE, "connection lost"))
    await recorder.stop()
    assert rows(path, "SELECT count(*) FROM gpu_samples") == [(5,)]
    assert rows(path, "SELECT state, reason, stop IS NOT NULL FROM node_down") == [("offline", "connection lost", 1)]
    assert len(front_end.drain(100)) == 8  # the other subscriber got everything too


# -- energy ---------------------------------------------------------------------------------------------


def without_processes(line: dict) -> dict:
    return dict(line, gpus=[dict(gpu, processes=[]) for gpu in line["gpus"]])


def with_counter(line: dict, joules: float) -> NodeStats:
    """`line` parsed, its GPU's energy counter at `joules` (as NVML reads it on Volta and newer)."""
    return parsed(dict(line, gpus=[dict(gpu, energy=joules) for gpu in line["gpus"]]))


def test_energy_per_gpu_user_and_run_with_the_idle_part_through_the_tiers(tmp_path):
    """The recorded MIG H100 (433.78 W) shared by bob and alice's run for 600 s, then idle for 300 s; the
    recorded H100 (its draw varying from line to line) alice's demo run for 120 s, a gap, 60 s more. Each
    step's energy is its trapezoid; the owners share it as they share the GPU's time; no process: idle."""
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    feed(recorder, clock, "mig", mig_shared(), T0, T0 + 600)
    feed(recorder, clock, "mig", parsed(without_processes(tui_line("h100_mig_load"))), T0 + 601, T0 + 900)
    lines = h100_lines()
    feed(recorder, clock, "h100", lambda k: h100(k=k), T0, T0 + 120)
    state(recorder, clock, "h100", T0 + 120.5, NodeState.OFFLINE, "connection lost")
    state(recorder, clock, "h100", T0 + 200, NodeState.ONLINE)
    feed(recorder, clock, "h100", lambda k: h100(k=k), T0 + 200, T0 + 260)
    recorder.flush()

    watts = [lines[k % len(lines)]["gpus"][0]["power"] for k in range(121)]
    demo_j = sum((a + b) / 2 for a, b in zip(watts, watts[1:])) + sum((a + b) / 2 for a, b in zip(watts[:61], watts[1:61]))
    mig_j, idle_j = 433.78 * 900, 433.78 * 300  # the step into the idle stretch is idle's
    shares = {"bob": (2296 + 1272) / (2296 + 1272 + 7484), "burn-1": 7484 / (2296 + 1272 + 7484)}

    def check(history: HistoryReader) -> None:
        gpus = {g.node: g for g in history.gpu_energy(T0, T0 + HOUR, Tariff(0.5, "EUR"))}
        assert gpus["mig"].energy_kwh * 3.6e6 == pytest.approx(mig_j, rel=1e-9)
        assert gpus["mig"].idle_kwh * 3.6e6 == pytest.approx(idle_j, rel=1e-9)
        assert gpus["mig"].cost == pytest.approx(gpus["mig"].energy_kwh * 0.5) and gpus["mig"].method == "integrated"
        assert gpus["h100"].energy_kwh * 3.6e6 == pytest.approx(demo_j, rel=1e-9) and gpus["h100"].idle_kwh == 0
        owners = {(o.user, o.run_id): o.energy_kwh * 3.6e6 for o in history.owner_energy(T0, T0 + HOUR)}
        # each row keeps whole millijoules: a share's rounding, alike in every row, adds up to a few ppm
        assert owners[("bob", "")] == pytest.approx(433.78 * 600 * shares["bob"], rel=1e-5)
        assert owners[("alice", "burn-1")] == pytest.approx(433.78 * 600 * shares["burn-1"], rel=1e-5)
        assert owners[("alice", "demo-1")] == pytest.approx(demo_j, rel=1e-9)

    with HistoryReader(path, clock=clock) as history:
        check(history)
    check_in_buckets(recorder, path, clock, check)
    recorder.close()


def test_the_energy_counter_is_used_where_the_gpu_has_one(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    line = without_processes(tui_line("h100_mig_load"))
    feed(recorder, clock, "mig", lambda k: with_counter(line, 1e6 + 500.0 * k), T0, T0 + 100)  # 500 W counted

    def check(history: HistoryReader) -> None:
        (gpu,) = history.gpu_energy(T0, T0 + HOUR)
        assert (gpu.energy_kwh * 3.6e6, gpu.method) == (pytest.approx(50_000.0), "counter")  # not 433.78 W's
    with HistoryReader(path, clock=clock) as history:
        check(history)
    check_in_buckets(recorder, path, clock, check)  # a bucket of counted samples is counted, not "mixed"
    recorder.close()


def test_a_gpu_counted_for_part_of_the_window_is_mixed_in_every_tier(tmp_path):
    path, clock = tmp_path / "history.sqlite", Clock()
    recorder = HistoryRecorder(path, clock=clock)
    line = without_processes(tui_line("h100_mig_load"))
    feed(recorder, clock, "mig", lambda k: with_counter(line, 1e6 + 500.0 * k) if k < 150 else parsed(line), T0,
         T0 + 300)

    def check(history: HistoryReader) -> None:
        assert [gpu.method for gpu in history.gpu_energy(T0, T0 + HOUR)] == ["mixed"]
    with HistoryReader(path, clock=clock) as history:
        check(history)
    check_in_buckets(recorder, path, clock, check)
    recorder.close()


def test_a_history_from_before_energy_gets_its_columns_when_serve_opens_it(tmp_path):
    """An older homegpu's file has no energy columns: read as having no energy; the recorder adds them."""
    path, clock = tmp_path / "history.sqlite", Clock()
    HistoryRecorder(path, clock=clock).close()
    with sqlite3.connect(path) as db:  # as the first homegpu with a history made it
        for table, column in (("gpu_samples", "energy_mj"), ("gpu_samples", "counted"), ("owner_samples", "energy_mj")):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.close()
    with HistoryReader(path, clock=clock) as history:
        assert history.gpu_energy(T0, T0 + HOUR) == () and history.owner_energy(T0, T0 + HOUR) == ()
    recorder = HistoryRecorder(path, clock=clock)
    feed(recorder, clock, "h100", h100(), T0, T0 + 10)
    recorder.close()
    with HistoryReader(path, clock=clock) as history:
        (gpu,) = history.gpu_energy(T0, T0 + HOUR)
    assert gpu.energy_kwh > 0


def test_energy_totals_never_go_back_across_restarts_and_lose_only_the_downtime(tmp_path):
    """/metrics' counters: each GPU's joules since the history began, kept with the rows they count; serve
    stopped for 100 s loses those 100 s, nothing is counted twice, and a write that failed is not counted."""
    path, clock = tmp_path / "history.sqlite", Clock()
    line = without_processes(tui_line("h100_mig_load"))  # 433.78 W
    recorder = HistoryRecorder(path, clock=clock)
    feed(recorder, clock, "mig", parsed(line), T0, T0 + 100)
    recorder.close()
    ((node, gpu, model, _, first),) = HistoryRecorder(path, clock=clock).energy_totals()  # reopened: the same
    assert (node, gpu, model, first) == ("mig", 0, "NVIDIA H100 80GB HBM3", pytest.approx(433.78 * 100))
    recorder = HistoryRecorder(path, clock=clock)
    feed(recorder, clock, "mig", parsed(line), T0 + 200, T0 + 300)  # down from 100 s to 200 s
    (total,) = recorder.energy_totals()
    recorder.close()
    assert total[-1] == pytest.approx(433.78 * 200)
    with HistoryReader(path, clock=clock) as history:
        (recorded,) = history.gpu_energy(T0, T0 + HOUR)
    assert recorded.energy_kwh * 3.6e6 == pytest.approx(total[-1])  # the counter and the history agree
