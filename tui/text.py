"""Plain-text renderings for the command line (no Textual): tables of specs and snapshots."""

from __future__ import annotations

from typing import Sequence

from homegpu.remote.config import ClusterSpec


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    """Left-aligned columns sized to their widest cell."""
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells
    )


def format_cluster(spec: ClusterSpec) -> str:
    """What `homegpu check` prints: the cluster settings, then one row per node."""
    ssh = spec.ssh
    jobs = ", ".join(spec.jobs) or "none"
    lines = [
        f"{spec.source}: cluster {spec.name!r}, {_plural(len(spec.nodes), 'node')}, jobs: {jobs}",
        f"  ssh: user {ssh.user or '(from ~/.ssh/config or login)'}, "
        f"key {ssh.identity_file or '(ssh defaults)'}, known_hosts {ssh.known_hosts}",
        f"       connect timeout {ssh.connect_timeout:g}s, keepalive every {ssh.keepalive_interval:g}s, "
        f"offline after {ssh.keepalive_count_max} missed",
        f"  stats every {spec.stats_interval:g}s",
        "",
    ]
    rows = [
        (node.name, node.host, node.port or ("-" if node.is_local else 22), node.user or ssh.user or "-",
         node.cluster_address, node.runtime if node.runtime == "docker" else f"process ({node.python})",
         spec.work_dir_of(node), ",".join(node.tags) or "-")
        for node in spec.nodes
    ]
    lines.append(table(("NODE", "HOST", "PORT", "USER", "ADDRESS", "RUNTIME", "WORK DIR", "TAGS"), rows))
    return "\n".join(lines)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"
