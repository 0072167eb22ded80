"""Write a ClusterSpec back to cluster.toml text (tomli-w), the inverse of config.parse_cluster."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import tomli_w

from homegpu.remote.config import ClusterSpec, NodeSpec, SshDefaults
from homegpu.remote.job_config import JobSpec

STARTER_HEADER = """\
# homegpu cluster file, written by `homegpu init`.
# Each [[nodes]] table is one machine. host is an address, an ~/.ssh/config alias, or "local".
# address is where TensorFlow and iperf3 traffic goes (defaults to host).
# runtime is "docker" (containers, GPUs passed through) or "process" (plain python on the node).
# Check it with `homegpu check`; the full reference is in README.md.

"""


def cluster_to_dict(spec: ClusterSpec) -> dict[str, Any]:
    """The TOML document for `spec`, leaving out every value that equals its default."""
    cluster: dict[str, Any] = {"name": spec.name}
    cluster.update(_non_default(spec.ssh, SshDefaults()))
    if spec.stats_interval != ClusterSpec.stats_interval:
        cluster["stats_interval"] = spec.stats_interval
    if spec.work_dir != ClusterSpec.work_dir:
        cluster["work_dir"] = spec.work_dir
    document: dict[str, Any] = {"cluster": cluster, "nodes": [_node_dict(node) for node in spec.nodes]}
    if spec.jobs:
        document["jobs"] = {name: _job_dict(job) for name, job in spec.jobs.items()}
    return document


def cluster_to_toml(spec: ClusterSpec, header: str = STARTER_HEADER) -> str:
    """TOML text for `spec`. Each node gets its own [[nodes]] table, which tomli-w would inline."""
    document = cluster_to_dict(spec)
    nodes = document.pop("nodes")
    jobs = document.pop("jobs", {})
    parts = [tomli_w.dumps(document)]
    parts += [f"[[nodes]]\n{tomli_w.dumps(node)}" for node in nodes]
    if jobs:
        parts.append(tomli_w.dumps({"jobs": jobs}))
    return header + "\n".join(parts)


def _node_dict(node: NodeSpec) -> dict[str, Any]:
    table = {"name": node.name, "host": node.host}
    table.update(_non_default(node, NodeSpec(name=node.name, host=node.host)))
    return table


def _job_dict(job: JobSpec) -> dict[str, Any]:
    table = _non_default(job, JobSpec(name=job.name))
    table.pop("name", None)
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
