"""Write a ClusterSpec back to cluster.toml text (tomli-w), the inverse of config.parse_cluster."""

from __future__ import annotations

from dataclasses import fields
from types import MappingProxyType
from typing import Any

import tomli_w

from homegpu.remote.config.cluster_spec import (
    DEFAULT_CLUSTER_NAME, DEMO_JOB, AlertRules, ClusterSpec, NodeSpec, SshDefaults,
)
from homegpu.remote.config.job_spec import DEFAULT_JOB_PORT, JobSpec
from homegpu.remote.config.node_sleep_wake import NodeSleepWake
from homegpu.remote.config.slurm_keys import scheduler_keys
from homegpu.remote.config.sizes import size_key

STARTER_HEADER = """\
# homegpu cluster file, written by `homegpu init`.
# Each [[nodes]] table is one machine. host is an address, an ~/.ssh/config alias, or "local".
# address is where TensorFlow and iperf3 traffic goes (defaults to the address ssh reaches the node at).
# runtime is "docker" (containers, GPUs passed through) or "process" (plain python on the node);
# python is the interpreter of a process node ("python3" unless set; here, the one homegpu runs under).
# [jobs.demo] trains the built-in model on synthetic data across every node: `homegpu run demo`
# (framework = "pytorch": the PyTorch demo, DDP under torchrun on each node; "jax": the JAX demo).
# Check it with `homegpu check`, then `homegpu doctor`; the full reference is docs/reference.md.

"""

# Written commented out under [cluster] when it has no price: what a kWh costs, ready to enable.
PRICE_EXAMPLE = """\
# price_per_kwh = 0.35                  # what a kWh costs you: runs, `homegpu history` and /metrics show the cost
# currency = "EUR"
# tariffs = { "22:00-06:00" = 0.18 }    # optional time-of-day rates (local time)
"""

# Written commented out in a node's table without them: the draw the rest of its energy is estimated from.
WATTS_EXAMPLE = """\
# idle_watts = 45      # W the machine draws besides its GPUs doing nothing (a plug meter says), and
# busy_watts = 150     # with every CPU busy: its CPUs' energy is estimated where RAPL cannot be read
"""

# Written commented out in a remote node's table without a mac: how homegpu wakes it and lets it sleep.
WAKE_EXAMPLE = """\
# mac = "a8:a1:59:0c:22:7e"   # its wired NIC's (`ip link`): `homegpu wake` and queued work wake it (Wake-on-LAN)
# sleep_after = "30m"         # homegpu serve puts it to sleep when idle this long ("Machines that sleep")
"""

# Written commented out when a cluster has no [alerts]: what the table looks like, ready to enable.
ALERTS_EXAMPLE = """\
# Alerts (see "[alerts]" in docs/reference.md): uncomment to be told when something needs you. Each fires once
# and says "cleared" when its condition is over. The command runs here, without a shell, with the alert
# in HOMEGPU_ALERT* variables and its {placeholders} filled in.
# [alerts]
# gpu_temperature = 85          # °C, at or above (cleared 5 °C below)
# gpu_memory_percent = 95       # % of a GPU's memory used (cleared 5 points below)
# node_offline_seconds = 60     # a node that was online is unreachable this long
# job_failed = true
# job_stalled = true
# straggler = true
# job_succeeded = true
# queued_runs = true            # runs of `homegpu serve`'s queue: started, succeeded, failed, cancelled
# command = ["notify-send", "{title}", "{message}"]    # a desktop notification; or, instead,
# a phone push through ntfy (install its app and subscribe to your topic):
# command = ["curl", "-s", "-d", "{message}", "-H", "Title: {title}", "https://ntfy.sh/YOUR-TOPIC"]
# command_timeout = 30.0        # seconds before the command is killed
# budget_per_day = 2.50         # the cluster's electricity today cost this much (needs price_per_kwh)
# budget_per_run = 1.00         # a run's GPUs cost this much in electricity
"""


def starter_cluster(nodes: tuple[NodeSpec, ...] = (), user: str | None = None,
                    name: str = DEFAULT_CLUSTER_NAME, framework: str = "tensorflow") -> ClusterSpec:
    """What `homegpu init` writes: `nodes` (else this machine) and a `demo` job ready to run.

    The demo job is the built-in trainer on synthetic data across every node (with `framework`
    "pytorch", the PyTorch demo under torchrun; "jax", the JAX demo), so init → check → doctor → tfconfig → run
    needs no edit. Nodes keep the runtime they were given. This machine alone gets two TensorFlow workers, so
    that MultiWorkerMirroredStrategy really synchronises.
    """
    nodes = nodes or (NodeSpec.this_machine(),)
    if framework in ("pytorch", "jax"):
        port = 29500 if framework == "pytorch" else DEFAULT_JOB_PORT
        demo = JobSpec(name=DEMO_JOB, framework=framework, epochs=5, port=port)
    else:
        demo = JobSpec(name=DEMO_JOB, workers_per_node=2 if len(nodes) == 1 else 1)
    return ClusterSpec(name=name, nodes=nodes, ssh=SshDefaults(user=user), jobs=MappingProxyType({DEMO_JOB: demo}))


def cluster_to_dict(spec: ClusterSpec) -> dict[str, Any]:
    """The TOML document for `spec`, leaving out every value that equals its default."""
    cluster: dict[str, Any] = {"name": spec.name}
    cluster.update(_non_default(spec.ssh, SshDefaults()))
    if spec.stats_interval != ClusterSpec.stats_interval:
        cluster["stats_interval"] = spec.stats_interval
    if spec.work_dir != ClusterSpec.work_dir:
        cluster["work_dir"] = spec.work_dir
    cluster.update(scheduler_keys(spec.scheduler, spec.slurm_login))
    if spec.tariff.priced:
        cluster.update((key, value) for key, value in spec.tariff.as_dict().items() if value not in ("", {}))
    document: dict[str, Any] = {"cluster": cluster, "nodes": [_node_dict(node) for node in spec.nodes]}
    if spec.jobs:
        document["jobs"] = {name: _job_dict(job) for name, job in spec.jobs.items()}
    alerts = _non_default(spec.alerts, AlertRules())
    if alerts:
        document["alerts"] = alerts
    return document


def cluster_to_toml(spec: ClusterSpec, header: str = STARTER_HEADER) -> str:
    """TOML text for `spec`. Each node gets its own [[nodes]] table, which tomli-w would inline."""
    document = cluster_to_dict(spec)
    nodes = document.pop("nodes")
    jobs = document.pop("jobs", {})
    alerts = document.pop("alerts", {})
    parts = [tomli_w.dumps(document) + ("" if spec.tariff.priced else PRICE_EXAMPLE)]
    parts += [f"[[nodes]]\n{tomli_w.dumps(table)}" + ("" if node.idle_watts is not None else WATTS_EXAMPLE)
              + ("" if node.sleep_wake.wakeable or node.is_local else WAKE_EXAMPLE) for table, node in zip(nodes, spec.nodes)]
    if jobs:
        parts.append(tomli_w.dumps({"jobs": jobs}))
    parts.append(tomli_w.dumps({"alerts": alerts}) if alerts else ALERTS_EXAMPLE)
    return header + "\n".join(parts)


def _node_dict(node: NodeSpec) -> dict[str, Any]:
    table = {"name": node.name, "host": node.host}
    table.update(_non_default(node, NodeSpec(name=node.name, host=node.host)))
    table.pop("sleep_wake", None)  # its keys are the node's own
    table.update(_non_default(node.sleep_wake, NodeSleepWake()))
    return table


# written even at their defaults, so a job's table says what it trains
_TRAINER_KEYS = ("data", "model", "epochs")


def _job_dict(job: JobSpec) -> dict[str, Any]:
    # the other demos have their own data, and the JAX demo its own model
    shown = _TRAINER_KEYS if job.is_tensorflow else ("model", "epochs") if job.is_pytorch else ("epochs",)
    table = {key: getattr(job, key) for key in shown} if job.uses_trainer else {}
    table.update(_non_default(job, JobSpec(name=job.name)))
    table.pop("name", None)
    if isinstance(job.gpu_memory, int) and job.gpu_memory:
        table["gpu_memory"] = size_key(job.gpu_memory)
    return table


def _non_default(value: Any, default: Any) -> dict[str, Any]:
    """Fields that differ from `default`, as TOML-ready values (tuples → lists, mappings → dicts)."""
    return {
        f.name: _toml_value(getattr(value, f.name))
        for f in fields(value)
        if getattr(value, f.name) != getattr(default, f.name)
    }


def _toml_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "items"):
        return dict(value)
    return value
