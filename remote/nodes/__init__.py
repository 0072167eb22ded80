"""homegpu.remote.nodes: the cluster's live sessions: one per node over SSH (or local processes), host keys,
the stats agent's stream as snapshots (and what holds a GPU back, in words), a talking, slow or stuck login
shell in words, who owns each GPU process, and node text made visible.
"""

from __future__ import annotations

from homegpu.remote.nodes import hostkeys
from homegpu.remote.nodes.agent_bundle import agent_command, agent_payload
from homegpu.remote.nodes.asleep import AsleepNodes
from homegpu.remote.nodes.cluster import Cluster
from homegpu.remote.nodes.connect import (
    NodeError, OfferedKey, SshTarget, connect_wait, fetch_offered_key, jump_hostname_address, ssh_target,
)
from homegpu.remote.nodes.health import GpuHealth, ReasonTimer, held_back, link_causes, link_text
from homegpu.remote.nodes.login_shell import SHELL_FIX, talking_shell
from homegpu.remote.nodes.login_time import LOGIN_TIMEOUT_S, STUCK_LOGIN_S, LoginTiming, login_problem, login_words
from homegpu.remote.nodes.owners import (
    FOREIGN_SHARE, budget_text, budgeted_workers, card_budgets, foreign_memory_warnings, is_run_worker, owner_text,
    worker_budget,
)
from homegpu.remote.nodes.session import NODE_GONE, NodeOffline, NodeSession
from homegpu.remote.nodes.stats import StatsParseError, describe_gpus, parse_agent_line
from homegpu.remote.nodes.transport import (
    CommandResult, CommandTimeout, RemoteProcess, SshTransport, TransportError, cause, tied_to_session,
)
from homegpu.remote.nodes.units import MIB, MIB_PER_GIB, format_bytes, gib, is_number
from homegpu.remote.nodes.visible import visible, visible_fields
from homegpu.remote.nodes.waiting import wait_set

__all__ = [
    "FOREIGN_SHARE", "LOGIN_TIMEOUT_S", "MIB", "MIB_PER_GIB", "SHELL_FIX", "NODE_GONE", "AsleepNodes", "Cluster",
    "CommandResult", "CommandTimeout", "GpuHealth", "NodeError", "NodeOffline", "NodeSession", "OfferedKey",
    "ReasonTimer", "RemoteProcess", "STUCK_LOGIN_S", "SshTarget", "SshTransport", "StatsParseError",
    "TransportError", "agent_command", "agent_payload", "budget_text", "budgeted_workers", "card_budgets", "cause",
    "connect_wait", "describe_gpus",
    "fetch_offered_key", "foreign_memory_warnings", "format_bytes", "gib", "is_number", "held_back", "link_causes", "link_text",
    "hostkeys", "is_run_worker", "jump_hostname_address", "login_problem", "login_words", "LoginTiming",
    "owner_text", "parse_agent_line", "ssh_target", "talking_shell", "tied_to_session", "visible", "visible_fields",
    "wait_set", "worker_budget",
]
