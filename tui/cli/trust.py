"""`homegpu trust NODE`: show a node's host key fingerprint and add it to known_hosts."""

from __future__ import annotations

import argparse
import asyncio
import sys

from homegpu.remote.nodes import NodeError, fetch_offered_key, hostkeys
from homegpu.tui.cli.common import UserError, load_spec


def register(commands: argparse._SubParsersAction) -> None:
    trust = commands.add_parser(
        "trust", help="trust a node's SSH host key (shows its fingerprint first)",
        description="Connect to NODE, show the SHA256 fingerprint of the host key it offers and, once "
                    "you confirm, append it to known_hosts. Compare the fingerprint with the one the "
                    "node itself prints: `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`. "
                    "A key that CHANGED is never replaced: remove the old line yourself after checking why.",
    )
    trust.add_argument("node", metavar="NODE", help="node name from cluster.toml")
    trust.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    trust.set_defaults(handler=run_trust)


def run_trust(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    names = [node.name for node in spec.nodes]
    if args.node not in names:
        raise UserError(f"no node named {args.node!r} in {spec.source}; nodes: {', '.join(names)}")
    node = spec.node(args.node)
    try:
        offered = asyncio.run(fetch_offered_key(spec, node))
    except NodeError as exc:
        print(f"homegpu: {node.name}: {exc}", file=sys.stderr)
        return 1
    print(f"{node.name} ({hostkeys.host_pattern(offered.host, offered.port)}) offers a "
          f"{offered.key.get_algorithm()} host key:\n  {offered.fingerprint}")
    if not args.yes and not _confirm("Trust this key and add it to " + spec.ssh.known_hosts + "? [y/N] "):
        print("not trusted; nothing was written")
        return 1
    path = hostkeys.append_trusted(spec.ssh.known_hosts, offered.host, offered.port, offered.key)
    print(f"added to {path}")
    return 0


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise UserError("no terminal to confirm on; check the fingerprint, then pass --yes")
    return input(question).strip().lower() in ("y", "yes")
