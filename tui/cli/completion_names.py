"""`homegpu --complete KIND [--config FILE | --local]`: the names a completion script offers on Tab, one a line.

The bash, zsh and fish scripts (completion.py) run it for an argument whose values live in the cluster file
(jobs, nodes) or in serve's queue (queue ids), passing on the --config or --local typed on the line. It runs on
every Tab press, so main.py answers it before loading any command module, and it prints nothing at all, not
even an error, when it cannot tell: a broken cluster file or no serve completes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from homegpu.remote.config import ClusterSpec, ConfigError, embedded_default, find_config, load_cluster

COMPLETE_OPTION = "--complete"
JOBS, NODES, QUEUE_IDS = "jobs", "nodes", "queue-ids"
QUEUE_TIMEOUT = 1.0  # seconds a Tab press waits for serve's answer before completing nothing


def print_names(argv: Sequence[str]) -> int:
    """Print the names `argv` (KIND, then --config FILE or --local, as typed) asks for. Always succeeds."""
    for name in completion_names(argv):
        print(name)
    return 0


def completion_names(argv: Sequence[str]) -> list[str]:
    """The names of KIND (argv[0]) in the cluster that the rest of `argv` selects; [] when it cannot tell."""
    if not argv:
        return []
    try:
        spec = requested_cluster(argv[1:])
    except (ConfigError, OSError):
        return []
    if argv[0] == JOBS:
        return list(spec.jobs)
    if argv[0] == NODES:
        return [node.name for node in spec.nodes]
    if argv[0] == QUEUE_IDS:
        return open_queue_ids(spec)
    return []


def requested_cluster(options: Sequence[str]) -> ClusterSpec:
    """The cluster as the command would load it (common.load_spec) from `--local` or `--config FILE`
    (`--config=FILE` too). FILE is as typed on the line, so `~` is expanded here: no shell did it."""
    if "--local" in options:
        return embedded_default()
    explicit = None
    for index, option in enumerate(options):
        if option == "--config" and index + 1 < len(options):
            explicit = options[index + 1]
        elif option.startswith("--config="):
            explicit = option.removeprefix("--config=")
    return load_cluster(find_config(str(Path(explicit).expanduser()) if explicit else None))


def open_queue_ids(spec: ClusterSpec) -> list[str]:
    """The ids of the queue's entries that have not finished (what `cancel` and `submit --after` take), asked
    of serve; [] without a serve or when it is slow."""
    import asyncio  # these load only for `cancel <Tab>` and `--after <Tab>`

    from homegpu.remote.queue import QueueClient, QueueError, socket_path

    async def ask() -> list[str]:
        entries = await asyncio.wait_for(QueueClient(socket_path(spec)).entries(), QUEUE_TIMEOUT)
        return [entry.id for entry in entries if not entry.state.finished]

    try:
        return asyncio.run(ask())
    except (QueueError, OSError, TimeoutError):
        return []
