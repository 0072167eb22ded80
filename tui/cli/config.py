"""`homegpu check` and `homegpu init`: validate, show and write cluster.toml."""

from __future__ import annotations

import argparse
from pathlib import Path

from homegpu.remote.config import (
    DEFAULT_CONFIG_NAME, DEMO_JOB, FRAMEWORKS, LOCAL_HOST, RUNTIMES, ConfigError, NodeSpec, cluster_to_toml,
    parse_cluster, starter_cluster,
)
from homegpu.remote.nodes import ssh_target
from homegpu.tui.cli.common import UserError, load_spec
from homegpu.tui.view.text import format_cluster


def register(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "check", help="validate cluster.toml and print the parsed cluster",
        description="Validate the cluster file and print what homegpu understood from it. "
                    "Exit status 2 (with one line naming the file, line and key) when it has a mistake.",
    )
    check.set_defaults(handler=run_check)

    init = commands.add_parser(
        "init", help="write a starter cluster.toml",
        description="Write a starter cluster file. Without --node it holds this machine only "
                    '(host = "local"). Edit it afterwards; `homegpu check` validates it.',
        epilog="example: homegpu init --node desktop=192.168.1.20 --node closet=closet:2222 --user alice",
    )
    init.add_argument("--node", action="append", default=[], metavar="NAME=HOST[:PORT]",
                      help="a node to include (repeatable); HOST may be an ~/.ssh/config alias or 'local'")
    init.add_argument("--user", help="SSH user for all nodes (default: your ~/.ssh/config or login name)")
    init.add_argument("--runtime", choices=RUNTIMES, default="docker",
                      help="how the nodes run workers: docker (containers with the GPUs passed through; "
                           "the default) or process (a plain Python with TensorFlow on the node)")
    init.add_argument("--name", default="home", help="cluster name (default: home)")
    init.add_argument("--framework", choices=FRAMEWORKS, default="tensorflow",
                      help="the demo job's framework: the built-in TensorFlow trainer, the PyTorch demo "
                           "(DDP under torchrun) or the JAX demo (jax.distributed); each trains on synthetic data "
                           "(default: tensorflow)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(handler=run_init)


def run_check(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    print(format_cluster(spec, {node.name: ssh_target(spec, node) for node in spec.nodes if not node.is_local}))
    return 0


def run_init(args: argparse.Namespace) -> int:
    target = Path(args.config) if args.config else Path(DEFAULT_CONFIG_NAME)
    if target.exists() and not args.force:
        raise UserError(f"{target} already exists; pass --force to overwrite it, or --config FILE to write elsewhere")
    spec = starter_cluster(tuple(parse_node_option(value, args.runtime) for value in args.node), args.user,
                           args.name, args.framework)
    text = cluster_to_toml(spec)
    try:  # the options get the same validation as a hand-written file
        parse_cluster(text, "homegpu init")
    except ConfigError as exc:
        raise UserError(f"homegpu init: {exc.key}: {exc.problem}; {exc.hint}") from None
    target.write_text(text, encoding="utf-8")
    command = f"homegpu{' --config ' + str(target) if args.config else ''}"
    print(f"wrote {target} with {len(spec.nodes)} node{'s' if len(spec.nodes) != 1 else ''} and the job "
          f"{DEMO_JOB!r}; next: `{command} check`, `{command} doctor`, `{command} run {DEMO_JOB}`")
    return 0


def parse_node_option(value: str, runtime: str = "docker") -> NodeSpec:
    """`NAME=HOST[:PORT]` (HOST may be `[v6addr]`) into a NodeSpec with `runtime`; `local` nodes use processes."""
    name, sep, endpoint = value.partition("=")
    if not sep or not name or not endpoint:
        raise UserError(f"--node {value!r}: expected NAME=HOST[:PORT], e.g. --node desktop=192.168.1.20")
    host, port = _split_endpoint(endpoint)
    if port is not None and not port.isdigit():
        raise UserError(f"--node {value!r}: port {port!r} is not a number")
    if host == LOCAL_HOST:
        return NodeSpec.this_machine(name)
    return NodeSpec(name=name, host=host, port=int(port) if port else None, runtime=runtime)


def _split_endpoint(endpoint: str) -> tuple[str, str | None]:
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if endpoint.count(":") == 1:
        host, port = endpoint.split(":")
        return host, port
    return endpoint, None

