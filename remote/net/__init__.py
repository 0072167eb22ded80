"""homegpu.remote.net: the network between the nodes: the one TCP port probe, the proof that every node
reaches every worker's port, and iperf3 bandwidth with its all-reduce advice, kept per cluster.
"""

from __future__ import annotations

from homegpu.remote.net import bandwidth_store
from homegpu.remote.net.bandwidth import (
    RESNET50_PARAMS, BandwidthError, LinkCallback, advice,
    allreduce_seconds, format_duration, format_gbits, link_timeout, measure, pairs,
)
from homegpu.remote.net.bandwidth_store import links_json
from homegpu.remote.net.port_probe import bind_problem, json_object, parse_probe, probe_argv
from homegpu.remote.net.reach import Endpoint, reach_problems

__all__ = [
    "RESNET50_PARAMS", "BandwidthError", "Endpoint", "LinkCallback", "advice", "allreduce_seconds", "bandwidth_store",
    "bind_problem", "format_duration", "format_gbits", "json_object", "link_timeout", "links_json", "measure", "pairs",
    "parse_probe", "probe_argv", "reach_problems",
]
