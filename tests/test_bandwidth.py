"""Bandwidth: iperf3 JSON parsing, pairs, the all-reduce estimate and advice (pure, table-tested on
real iperf3 output recorded in tests/fixtures/iperf3/), then `measure` and `homegpu bandwidth`
against the real sshd nodes of tests/simcluster.py, with real iperf3 between their addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import homegpu
import tomli_w

from simcluster import SimCluster, SimNode, free_port
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.events import BandwidthMatrix, BandwidthMeasured, LinkResult
from homegpu.remote.net import bandwidth
from homegpu.remote.net.bandwidth import (
    BandwidthError, advice, allreduce_seconds, describe_failure, format_duration, format_gbits, iperf3_seconds, measure,
    measure_link, pairs, parse_iperf3_json,
)
from homegpu.remote.nodes.cluster import Cluster
from homegpu.tui.cli import bandwidth as bandwidth_command
from homegpu.tui.cli.bandwidth import matrix_json
from homegpu.tui.view.text import format_matrix

FIXTURES = Path(__file__).parent / "fixtures" / "iperf3"
RESNET50 = 25_600_000


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# -- parsing iperf3 -J ---------------------------------------------------------------------------


def test_parse_reads_what_the_receiver_counted():
    assert parse_iperf3_json(fixture("client_loopback_1s.json")) == pytest.approx(22592241314.37002)


def test_parse_falls_back_to_what_was_sent_when_the_receiver_sum_is_missing():
    data = json.loads(fixture("client_loopback_1s.json"))
    del data["end"]["sum_received"]
    assert parse_iperf3_json(json.dumps(data)) == pytest.approx(22647928020.17483)


@pytest.mark.parametrize("name, message", [
    ("error_connection_refused.json", "unable to connect to server: Connection refused"),
    ("error_server_killed_mid_test.json", "unable to write to stream socket: Connection reset by peer"),
])
def test_parse_raises_iperf3s_own_error(name, message):
    with pytest.raises(BandwidthError) as caught:
        parse_iperf3_json(fixture(name))
    assert str(caught.value) == message


@pytest.mark.parametrize("text, words", [
    (fixture("server_address_in_use.txt"), "did not print JSON"),
    ("", "did not print JSON"),
    ("[1, 2]", "not an object"),
    ('{"start": {}, "intervals": [], "end": {}}', "no throughput"),
    ('{"end": {"sum_received": {"bits_per_second": "fast"}}}', "no throughput"),
])
def test_parse_rejects_output_without_a_throughput(text, words):
    with pytest.raises(BandwidthError, match=words):
        parse_iperf3_json(text)


# -- why an iperf3 ended early --------------------------------------------------------------------


@pytest.mark.parametrize("status, stderr, expected", [
    (127, "sh: 1: exec: iperf3: not found",
     "iperf3 is not installed on n1: install it (sudo apt install iperf3)"),
    (127, "bash: line 1: timeout: command not found",
     "`timeout` (GNU coreutils) is not installed on n1: install coreutils"),
    (1, fixture("server_address_in_use.txt"),
     "iperf3 on n1 failed: unable to start listener for connections: Address already in use"),
    (137, "", "iperf3 on n1 failed: exit status 137"),
    (None, "", "iperf3 on n1 failed: the connection ended without an exit status"),
])
def test_describe_failure(status, stderr, expected):
    assert str(describe_failure("n1", status, stderr)) == expected


# -- pairs, estimate, advice --------------------------------------------------------------------


@pytest.mark.parametrize("names, star, expected", [
    (["a", "b"], None, [("a", "b"), ("b", "a")]),
    (["a", "b", "c"], None, [("a", "b"), ("a", "c"), ("b", "a"), ("b", "c"), ("c", "a"), ("c", "b")]),
    (["a", "b", "c"], "b", [("b", "a"), ("a", "b"), ("b", "c"), ("c", "b")]),
    (["a"], None, []),
    (["a"], "a", []),
])
def test_pairs(names, star, expected):
    assert pairs(names, star) == expected


def test_pairs_with_an_unknown_star_names_the_nodes():
    with pytest.raises(ValueError, match=r"no node named 'x' \(nodes: a, b\)"):
        pairs(["a", "b"], "x")


@pytest.mark.parametrize("params, n, gbits, seconds", [
    (RESNET50, 2, 1.0, 0.8192),            # 102.4 MB each way at 125 MB/s
    (RESNET50, 3, 10.0, 4 / 3 * 102.4e6 / 1.25e9),
    (RESNET50, 4, 1.0, 1.5 * 0.8192),
    (1_000_000, 8, 100.0, 2 * 7 / 8 * 4e6 / 12.5e9),
    (RESNET50, 1, 1.0, 0.0),               # one worker: nothing crosses the network
])
def test_allreduce_seconds(params, n, gbits, seconds):
    assert allreduce_seconds(params, n, gbits) == pytest.approx(seconds)


def test_allreduce_over_a_dead_link_takes_forever():
    assert math.isinf(allreduce_seconds(RESNET50, 2, 0.0))


def link(src: str, dst: str, gbits: float | None, error: str = "") -> LinkResult:
    return LinkResult(src, dst, gbits, error, at=1.0)


MATRIX = BandwidthMatrix((
    link("desktop", "laptop", 0.94),
    link("laptop", "desktop", 0.61),
    link("desktop", "closet", 9.41),
    link("closet", "desktop", None, "iperf3 is not installed on closet: install it (sudo apt install iperf3)"),
), at=2.0)


def test_matrix_lookups():
    assert MATRIX.nodes == ("desktop", "laptop", "closet")
    assert MATRIX.reachable == ("desktop", "laptop", "closet")  # closet → desktop failed, not closet
    assert MATRIX.get("desktop", "closet").gbits == 9.41
    assert MATRIX.get("laptop", "closet") is None
    assert MATRIX.slowest() == link("laptop", "desktop", 0.61)  # the failed link is not "slowest"
    assert [r.src for r in MATRIX.failed] == ["closet"]


@pytest.mark.parametrize("step, words", [
    (None, ["Slowest link: laptop → desktop at 0.61 Gbit/s.", "25,600,000 parameters", "102.4 MB",
            "3 workers", "about 1.79 s per step",
            "If your GPUs compute a step in less than 1.79 s, the network sets the pace"]),
    (0.25, ["about 1.79 s per step", "Your GPUs compute a step in 250 ms, less than that: "
            "the network sets the pace", "8.2× the compute time"]),
    (5.0, ["Your GPUs take 5.00 s per step, longer than that: the GPUs set the pace",
           "at most 36%"]),
])
def test_advice_names_the_slowest_link_and_who_sets_the_pace(step, words):
    text = advice(RESNET50, MATRIX, step)
    for expected in words:
        assert expected in text


def test_advice_counts_only_nodes_with_a_measured_link_as_workers():
    offline = "ghost is offline: cannot connect"
    matrix = BandwidthMatrix((link("a", "b", 1.0), link("b", "a", 1.0), link("a", "ghost", None, offline)))
    assert matrix.reachable == ("a", "b")
    assert "across 2 workers takes about 819 ms per step" in advice(RESNET50, matrix)


@pytest.mark.parametrize("matrix, words", [
    (BandwidthMatrix((), at=1.0), "Fewer than two nodes"),
    (BandwidthMatrix((link("a", "b", None, "a is offline"), link("b", "a", None, "a is offline"))),
     "No link could be measured"),
])
def test_advice_without_an_estimate_says_why(matrix, words):
    assert words in advice(RESNET50, matrix)


@pytest.mark.parametrize("value, text", [(9.4123, "9.41 Gbit/s"), (0.0941, "0.0941 Gbit/s"),
                                         (22.59, "22.6 Gbit/s"), (123.4, "123 Gbit/s")])
def test_format_gbits(value, text):
    assert format_gbits(value) == text


@pytest.mark.parametrize("seconds, text", [(0.0041, "4.1 ms"), (0.109, "109 ms"), (1.7862, "1.79 s"),
                                           (math.inf, "forever")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds, whole", [(0.2, 1), (1.0, 1), (1.2, 2), (3, 3)])
def test_iperf3_seconds_is_whole_and_never_zero(seconds, whole):
    # iperf3 3.12 reads -t with atoi: "0.5" would be 0, which means "run until killed".
    assert iperf3_seconds(seconds) == whole


# -- the command's rendering -----------------------------------------------------------------------


def test_matrix_table_with_errors_and_unmeasured_links():
    text = format_matrix(MATRIX, ["desktop", "laptop", "closet"])
    lines = text.splitlines()
    assert lines[0] == "Gbit/s, rows: from, columns: to"
    assert lines[1].split() == ["FROM", "\\", "TO", "desktop", "laptop", "closet"]
    assert lines[2].split() == ["desktop", "—", "0.94", "9.41"]
    assert lines[3].split() == ["laptop", "0.61", "—", "·"]
    assert lines[4].split() == ["closet", "err[1]", "·", "—"]
    assert lines[5].strip() == "[1] iperf3 is not installed on closet: install it (sudo apt install iperf3)"
    assert lines[6].strip() == "· not measured (--star)"


def test_links_failing_for_one_reason_share_a_footnote():
    offline = "ghost is offline: cannot connect"
    matrix = BandwidthMatrix((link("a", "ghost", None, offline), link("ghost", "a", None, offline)))
    text = format_matrix(matrix, ["a", "ghost"])
    assert text.count("err[1]") == 2 and "err[2]" not in text
    assert "not measured" not in text


def test_matrix_json():
    assert matrix_json(MATRIX, "ADVICE") == {
        "at": 2.0,
        "links": [
            {"src": "desktop", "dst": "laptop", "gbits": 0.94, "error": ""},
            {"src": "laptop", "dst": "desktop", "gbits": 0.61, "error": ""},
            {"src": "desktop", "dst": "closet", "gbits": 9.41, "error": ""},
            {"src": "closet", "dst": "desktop", "gbits": None,
             "error": "iperf3 is not installed on closet: install it (sudo apt install iperf3)"},
        ],
        "advice": "ADVICE",
    }


# -- against the real nodes --------------------------------------------------------------------------


def iperf3_left_running(*clusters: SimCluster) -> list[str]:
    """iperf3 processes (and their `timeout` wrappers) still alive on the simulated nodes.

    Only processes of these nodes count (found by walking their sshd trees and by their marker
    variable), so an iperf3 someone else runs on this machine cannot make the test fail.
    """
    found = []
    for cluster in clusters:
        for pid in cluster.pids():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # ended while we looked
            if comm in ("iperf3", "timeout"):
                found.append(f"{pid} {cmdline}")
    return found


async def measure_toml(path: Path, **options) -> tuple[BandwidthMatrix, list[object]]:
    """Measure the cluster in `path`; return the matrix and the events published meanwhile."""
    spec = load_cluster(path)
    async with Cluster(spec, stream_stats=False) as cluster:
        await cluster.wait_settled(spec.ssh.connect_timeout + 2)
        with cluster.subscribe() as events:
            matrix = await measure(cluster, **options)
            published = []
            with contextlib.suppress(asyncio.TimeoutError):
                while True:  # measure() has published before it returned: this only drains
                    published.append(await events.get(timeout=0.2))
    return matrix, published


async def test_every_pair_of_three_nodes_is_measured_and_published(sim_cluster, cluster_toml):
    matrix, published = await measure_toml(cluster_toml)
    assert [(r.src, r.dst) for r in matrix.results] == pairs(["node1", "node2", "node3"])
    for result in matrix.results:
        assert result.ok and 0 < result.gbits < 1.1, result  # the links are shaped to 1 Gbit/s
    assert [e.matrix for e in published if isinstance(e, BandwidthMeasured)] == [matrix]
    assert iperf3_left_running(sim_cluster) == []


async def test_star_mode_measures_only_to_and_from_the_hub(sim_cluster, cluster_toml):
    matrix, _ = await measure_toml(cluster_toml, star="node2")
    assert sorted((r.src, r.dst) for r in matrix.results) == sorted(
        [("node2", "node1"), ("node1", "node2"), ("node2", "node3"), ("node3", "node2")])
    assert all(r.ok and r.gbits > 0 for r in matrix.results)
    assert matrix.get("node1", "node3") is None
    assert iperf3_left_running(sim_cluster) == []


async def test_a_link_that_times_out_leaves_no_iperf3_behind(sim_cluster, cluster_toml):
    """A 10 s test under a 1.5 s limit: neither the client nor the one-shot server may outlive
    the link's timeout. (The kill by pid of a server that is not writing is what the test with
    `bare` below catches: a server whose client never came.)"""
    spec = load_cluster(cluster_toml)
    async with Cluster(spec, stream_stats=False) as cluster:
        await cluster.wait_settled(spec.ssh.connect_timeout + 2)
        result = await measure_link(cluster.nodes["node1"], cluster.nodes["node2"], seconds=10, timeout=1.5)
    assert result.gbits is None and result.error == "timed out after 1.5 s"
    assert iperf3_left_running(sim_cluster) == []


async def test_a_server_port_taken_meanwhile_is_retried_on_another(sim_cluster, cluster_toml, monkeypatch):
    """The port the node called free is taken before iperf3 binds it (a race a busy node can lose):
    iperf3 says "Address already in use" on stderr, and the server is started again elsewhere."""
    real_free_port = bandwidth._free_port
    asked: list[int] = []
    spec = load_cluster(cluster_toml)
    with sim_cluster.node("node2").listening() as taken_port:

        async def taken_first(session, address, timeout):
            asked.append(taken_port if not asked else await real_free_port(session, address, timeout))
            return asked[-1]

        monkeypatch.setattr(bandwidth, "_free_port", taken_first)
        async with Cluster(spec, stream_stats=False) as cluster:
            await cluster.wait_settled(spec.ssh.connect_timeout + 2)
            result = await measure_link(cluster.nodes["node1"], cluster.nodes["node2"], seconds=1, timeout=15)
    assert result.ok and result.gbits > 0, result
    assert len(asked) == 2 and asked[0] == taken_port != asked[1]
    assert iperf3_left_running(sim_cluster) == []


class NodeWithoutIperf3(SimNode):
    """A real sshd node whose sessions' PATH is one directory of links to the tools a node has
    (sh, bash, timeout, python3, kill, rm for a login shell's own init ...) but not iperf3.

    All simulated nodes share this machine's filesystem, where /usr/bin/iperf3 exists, so the
    only honest way to make a node lack it is the node's PATH, which sshd sets for the node's
    sessions (SetEnv; root's ~/.bashrc, which could put its own directories in front, is not
    run in the simulated nodes' sessions). The test checks that iperf3 is not found there.
    """

    TOOLS = ("sh", "bash", "dash", "env", "timeout", "python3", "kill", "cat", "sleep", "uname", "id", "rm")

    @property
    def session_path(self) -> str:
        tools = self.extra_path
        for tool in self.TOOLS:
            target = shutil.which(tool)
            if target and not (tools / tool).exists():
                (tools / tool).symlink_to(target)
        return str(tools)


@pytest.fixture(scope="module")
def node_without_iperf3(sim_cluster: SimCluster) -> Iterator[SimCluster]:
    """One more real machine, `bare` at 10.213.0.31 (ssh alias bare-bare)."""
    spare = SimCluster(0, name="bare")
    spare.add_node("bare", 31, NodeWithoutIperf3, extra_path=True)
    with spare:
        yield spare


@pytest.fixture
def mixed_toml(sim_cluster, node_without_iperf3, tmp_path) -> Path:
    """node1 and node2, plus `bare` (no iperf3 on its PATH) and `ghost` (nothing listens there)."""
    bare = node_without_iperf3.node("bare")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sim_cluster.known_hosts_path.read_text() + bare.known_hosts_line + "\n")
    data = copy.deepcopy(sim_cluster.cluster_dict(known_hosts=str(known_hosts)))
    data["nodes"] = [node for node in data["nodes"] if node["name"] in ("node1", "node2")]
    data["nodes"].append({"name": "bare", "host": bare.alias, "runtime": "process"})
    data["nodes"].append({"name": "ghost", "host": "127.0.0.32", "port": free_port("127.0.0.32"),
                          "address": "127.0.0.32", "runtime": "process"})
    path = tmp_path / "cluster.toml"
    path.write_text(tomli_w.dumps(data))
    return path


async def test_a_node_without_iperf3_and_an_offline_node_fail_only_their_own_links(
        sim_cluster, node_without_iperf3, mixed_toml):
    matrix, _ = await measure_toml(mixed_toml)
    assert matrix.get("node1", "node2").ok and matrix.get("node2", "node1").ok
    missing = "iperf3 is not installed on bare: install it (sudo apt install iperf3)"
    for other in ("node1", "node2"):
        assert matrix.get(other, "bare").error == missing    # the server side is missing
        assert matrix.get("bare", other).error == missing    # the client side is missing
    for other in ("node1", "node2", "bare"):
        for result in (matrix.get(other, "ghost"), matrix.get("ghost", other)):
            assert result.gbits is None and result.error.startswith("ghost is "), result
    # bare → node1 started a server on node1 that never got its client: it must have been killed.
    assert iperf3_left_running(sim_cluster, node_without_iperf3) == []


# -- the command -------------------------------------------------------------------------------------


def test_homegpu_bandwidth_prints_progress_the_matrix_and_advice(sim_cluster, cluster_toml):
    result = homegpu("--config", str(cluster_toml), "bandwidth", "--star", "node1")
    assert result.returncode == 0, result.stderr
    progress = result.stderr.splitlines()
    assert [line.split(" ... ")[0] for line in progress] == [
        "node1 → node2", "node2 → node1", "node1 → node3", "node3 → node1"]
    assert all(line.endswith(" Gbit/s") for line in progress), progress
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["FROM", "\\", "TO", "node1", "node2", "node3"]
    assert lines[2].split()[:2] == ["node1", "—"] and lines[3].split()[3] == "·"
    assert "Slowest link: " in result.stdout and "3 workers" in result.stdout


def test_bandwidth_json_prints_only_json(sim_cluster, cluster_toml, capsys):
    parser = argparse.ArgumentParser(prog="homegpu")
    parser.add_argument("--config")
    bandwidth_command.register(parser.add_subparsers())
    args = parser.parse_args(["--config", str(cluster_toml), "bandwidth", "--json", "--star", "node3",
                              "--params", "1000000"])
    assert args.handler(args) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert err == ""
    assert set(report) == {"at", "links", "advice"}
    assert len(report["links"]) == 4 and all(link["gbits"] > 0 and link["error"] == ""
                                             for link in report["links"])
    assert "1,000,000 parameters" in report["advice"]
