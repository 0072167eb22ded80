"""Slurm's hostlist expressions, expanded and compressed exactly as a real `scontrol show hostnames` and
`scontrol show hostlist` did (tests/fixtures/slurm/scontrol_*.txt), and refused when malformed."""

from __future__ import annotations

import random
import shlex

import pytest
from slurm_recorded import recorded

from homegpu.remote.slurm import HostlistError, compress, expand


def argument(name: str) -> str:
    """The expression or names the recorded scontrol command was given."""
    return shlex.split(recorded(name).command)[-1]


@pytest.mark.parametrize("name", ["scontrol_hostnames", "scontrol_hostnames_widths"])
def test_an_expression_expands_to_the_names_scontrol_printed(name):
    assert expand(argument(name)) == recorded(name).output.split()


@pytest.mark.parametrize("name", ["scontrol_hostlist", "scontrol_hostlist_widths"])
def test_names_compress_to_the_expression_scontrol_printed(name):
    assert compress(argument(name).split(",")) == recorded(name).output.strip()


def test_the_nodes_squeue_and_sinfo_name_expand():
    assert expand("node[2-3]") == ["node2", "node3"]
    assert expand("node1") == ["node1"]
    assert expand("rack[1-2]-gpu[01-02]") == ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]


def test_compress_then_expand_gives_the_names_back():
    rng = random.Random(39)
    for _ in range(200):
        names = [rng.choice(["node", "gpu", "r1-n"]) + str(rng.randint(0, 120)).zfill(rng.choice([0, 2, 3]))
                 for _ in range(rng.randint(1, 10))]
        assert expand(compress(names)) == names


def test_a_name_without_a_number_stays_as_it_is():
    assert compress(["login", "gpu-a", "gpu-b"]) == "login,gpu-a,gpu-b"


@pytest.mark.parametrize("expression, problem", [
    ("node[1-3", "unclosed bracket"), ("node1-3]", "unbalanced or nested"), ("node[[1]]", "unbalanced or nested"),
    ("node[3-1]", "runs backwards"), ("node[a-c]", "is not a number"), ("node1,,node2", "empty name"),
    ("node[0-99999]", "more than 65536 hosts"), ("n[0-999],m[0-999],o[0-99999]", "more than 65536 hosts"),
])
def test_a_malformed_expression_is_refused_saying_why(expression, problem):
    with pytest.raises(HostlistError, match=problem.replace("[", r"\[")):
        expand(expression)
