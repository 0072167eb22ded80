"""The pure half of the image chain: which line each target gets, and the relay's kill bound.

The chain itself runs against real nodes and engines in tests/test_image_commands.py.
"""

from __future__ import annotations

from types import SimpleNamespace

from homegpu.remote.images.chain import Relay, kill_after, outcomes


def relay(name: str, role: str = "target", **state) -> Relay:
    state.setdefault("in_chain", role == "target")
    return Relay(SimpleNamespace(name=name), role, **state)


def test_every_target_that_loaded_is_ok():
    head = relay("src", "source")
    targets = [relay("a", received=True, loaded="Loaded image: x"), relay("b", received=True, loaded="Loaded image: x")]
    assert outcomes(head, targets) == {"a": (True, "Loaded image: x"), "b": (True, "Loaded image: x")}


def test_the_node_that_dropped_out_says_why_and_the_nodes_after_it_name_it():
    head = relay("src", "source")
    targets = [relay("a", received=True, loaded="Loaded image: x", next_failed="sending to b failed"),
               relay("b", error="lost during the copy: connection lost"),
               relay("c", error="b sent nothing for 60 s (after 1048576 bytes)")]
    assert outcomes(head, targets) == {
        "a": (True, "Loaded image: x"),
        "b": (False, "lost during the copy: connection lost"),
        "c": (False, "not copied: b before it in the chain failed: lost during the copy: connection lost"),
    }


def test_a_load_that_fails_after_the_whole_image_arrived_costs_only_that_node():
    head = relay("src", "source")
    targets = [relay("a", received=True, error="the Docker engine's load failed: no space left on device"),
               relay("b", received=True, loaded="Loaded image: x")]
    assert outcomes(head, targets) == {"a": (False, "the Docker engine's load failed: no space left on device"),
                                       "b": (True, "Loaded image: x")}


def test_a_target_that_never_started_is_left_out_of_the_chain_and_blames_nobody():
    head = relay("src", "source")
    targets = [relay("a", in_chain=False, error="cannot listen on 10.0.0.9:0: Cannot assign requested address"),
               relay("b", received=True, loaded="Loaded image: x")]
    assert outcomes(head, targets)["a"] == (False, "cannot listen on 10.0.0.9:0: Cannot assign requested address")
    assert outcomes(head, targets)["b"] == (True, "Loaded image: x")


def test_a_failed_source_is_named_by_every_target():
    head = relay("src", "source", error="the Docker engine would not export x: HTTP 404")
    targets = [relay("a", error="src never connected (waited 60 s)"), relay("b")]
    reason = "not copied: the source src failed: the Docker engine would not export x: HTTP 404"
    assert outcomes(head, targets) == {"a": (False, reason), "b": (False, reason)}


def test_the_kill_bound_leaves_room_for_a_slow_link():
    assert kill_after(0) == 660
    assert kill_after(2_400_000_000) == 660 + 1200  # 2.4 GB at 16 Mbit/s


def test_a_hop_that_could_not_be_reached_is_named_by_the_node_before_it():
    head = relay("src", "source")
    targets = [relay("a", received=True, loaded="Loaded image: x",
                     next_failed="cannot reach b at 10.0.0.3:4000: Connection refused"),
               relay("b", stopped=True, error="stopped: the chain broke before it"),
               relay("c", stopped=True, error="stopped: the chain broke before it")]
    why = "a could not pass the image on: cannot reach b at 10.0.0.3:4000: Connection refused"
    assert outcomes(head, targets) == {"a": (True, "Loaded image: x"), "b": (False, why),
                                       "c": (False, f"not copied: b before it in the chain failed: {why}")}
