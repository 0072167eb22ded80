"""`homegpu image build` and `homegpu image copy`: get the worker image onto the Docker nodes.

Without a registry, an image is either built on each node (in parallel) or built once and copied
node to node in a chain (each target loads it while passing it on). Both print progress lines
prefixed by the node, then one summary line per node, and exit 1 if any node failed.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Sequence

from homegpu.remote.config import DEFAULT_IMAGE, DEFAULT_IMAGES, FRAMEWORKS, ClusterSpec
from homegpu.remote.images import CopyProgress, ImageError, NodeOutcome, build_on_nodes, copy_image
from homegpu.remote.nodes import Cluster, NodeSession, connect_wait, format_bytes
from homegpu.remote.runtimes import DockerUnavailable
from homegpu.tui.cli.common import UserError, load_spec

# Each framework's worker image: its Dockerfile in assets/ (an editable install or a source checkout has them).
DOCKERFILES = {"tensorflow": Path("assets") / "Dockerfile", "pytorch": Path("assets") / "pytorch.Dockerfile",
               "jax": Path("assets") / "jax.Dockerfile"}
_CHECKOUT = Path(__file__).resolve().parents[2]  # tui/cli/image.py -> the checkout


def register(commands: argparse._SubParsersAction) -> None:
    image = commands.add_parser(
        "image", help="build the worker image on the nodes, or copy it between them",
        description="Put the worker image on the Docker nodes: build it on each, or build it once "
                    "and copy it node to node over SSH (no registry needed).",
    )
    actions = image.add_subparsers(dest="image_command", metavar="ACTION", required=True)

    build = actions.add_parser(
        "build", help="build an image on every Docker node at once",
        description="Build a Dockerfile on every Docker node in parallel (or only the --node ones). "
                    "The Dockerfile's directory is the build context.",
        epilog=f"examples: homegpu image build --node desktop --tag {DEFAULT_IMAGE}\n"
               "          homegpu image build --framework pytorch\n"
               "          homegpu image build --framework jax",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    build.add_argument("--node", action="append", default=[], metavar="NODE",
                       help="build on this node only (repeatable; default: every node with runtime docker)")
    build.add_argument("--framework", choices=FRAMEWORKS, default="tensorflow",
                       help="which worker image: TensorFlow (default), PyTorch or JAX; sets the default --file and "
                            "--tag")
    build.add_argument("--tag", help="image name (default: the framework's, what a job uses when it names none: "
                                     + ", ".join(DEFAULT_IMAGES.values()) + ")")
    build.add_argument("--file", metavar="DOCKERFILE",
                       help="the Dockerfile (default: the framework's in ./assets/, else the one shipped with "
                            "homegpu: " + ", ".join(str(path) for path in DOCKERFILES.values()) + ")")
    build.set_defaults(handler=run_build)

    copy = actions.add_parser(
        "copy", help="copy an image from one node to others",
        description="Stream an image from one node's Docker engine into the others' in a chain: "
                    "the source sends it to the first target, which loads it while passing it on to "
                    "the next, so it crosses each node's link once (docker save | docker load, nothing "
                    "written to disk on the way). Nodes talk over TCP, each connection opened with a "
                    "one-time secret handed out over SSH. Nodes that already hold the same image are "
                    "skipped.",
        epilog=f"example: homegpu image copy {DEFAULT_IMAGE} --from desktop --to closet",
    )
    copy.add_argument("image", metavar="IMAGE", help="image name or id on the source node")
    copy.add_argument("--from", dest="source", required=True, metavar="NODE", help="the node that has the image")
    copy.add_argument("--to", action="append", default=[], metavar="NODE",
                      help="a node to copy to (repeatable, in chain order; default: every other node with "
                           "runtime docker)")
    copy.add_argument("--port", type=int, default=0, metavar="PORT",
                      help="the TCP port the targets listen on (default: any free port; set one that "
                           "a firewall lets through, e.g. after `sudo ufw allow PORT/tcp`)")
    copy.set_defaults(handler=run_copy)


# -- build -----------------------------------------------------------------------------------------


def run_build(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    names = _docker_nodes(spec, args.node)
    dockerfile = find_dockerfile(args.file, args.framework)
    tag = args.tag or DEFAULT_IMAGES[args.framework]
    print(f"building {tag} from {dockerfile} on {', '.join(names)}", flush=True)
    outcomes = asyncio.run(_build(spec, names, dockerfile, tag))
    return _summarise(outcomes)


def find_dockerfile(given: str | None, framework: str = "tensorflow") -> Path:
    """--file, else the framework's ./assets/ Dockerfile, else the checkout's; UserError when there is none."""
    candidates = [Path(given)] if given else [DOCKERFILES[framework], _CHECKOUT / DOCKERFILES[framework]]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise UserError(f"no Dockerfile at {candidates[0]}; pass --file PATH")


async def _build(spec: ClusterSpec, names: list[str], dockerfile: Path, tag: str) -> list[NodeOutcome]:
    async with Cluster(spec, stream_stats=False) as cluster:
        online, offline = await _connect(cluster, names)
        built = await build_on_nodes(online, dockerfile, tag, _print_line) if online else []
    return _in_order(names, built + offline)


def _print_line(node: str, line: str) -> None:
    print(f"{node} | {line}", flush=True)


# -- copy ------------------------------------------------------------------------------------------


def run_copy(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port: give 1-65535, or 0 for any free port")
    spec = load_spec(args)
    _check_known(spec, [args.source])
    targets = _docker_nodes(spec, args.to, exclude=args.source)
    print(f"copying {args.image} from {args.source} to {', '.join(targets)}", flush=True)
    try:
        outcomes = asyncio.run(_copy(spec, args.image, args.source, targets, args.port))
    except (ImageError, DockerUnavailable) as exc:
        print(f"homegpu: {exc}", flush=True)
        return 1
    return _summarise(outcomes)


async def _copy(spec: ClusterSpec, image: str, source: str, names: list[str], port: int) -> list[NodeOutcome]:
    async with Cluster(spec, stream_stats=False) as cluster:
        online, offline = await _connect(cluster, [source, *names])
        if any(outcome.node == source for outcome in offline):
            raise ImageError(next(o.detail for o in offline if o.node == source))
        targets = [node for node in online if node.name != source]
        copied = await copy_image(image, cluster.node(source), targets, _print_progress, port=port) if targets else []
    return _in_order(names, copied + offline)


def _print_progress(progress: CopyProgress) -> None:
    if progress.loaded:
        print(f"{progress.target} | loaded ({progress.seconds:.0f} s)", flush=True)
        return
    rate = progress.bytes_sent / progress.seconds / 1e6 if progress.seconds > 0 else 0.0
    verb = "received" if progress.done else "receiving"
    then = ", loading" if progress.done else ""
    print(f"{progress.target} | {verb} {format_bytes(progress.bytes_sent)} "
          f"({progress.seconds:.0f} s, {rate:.0f} MB/s){then}", flush=True)


# -- shared ----------------------------------------------------------------------------------------


def _check_known(spec: ClusterSpec, names: Sequence[str]) -> None:
    known = [node.name for node in spec.nodes]
    for name in names:
        if name not in known:
            raise UserError(f"no node named {name!r} in {spec.source} (nodes: {', '.join(known)})")


def _docker_nodes(spec: ClusterSpec, chosen: Sequence[str], exclude: str = "") -> list[str]:
    """The chosen nodes, else every node with runtime docker (minus `exclude`)."""
    if chosen:
        _check_known(spec, chosen)
        names = [name for name in dict.fromkeys(chosen) if name != exclude]
    else:
        names = [node.name for node in spec.nodes if node.runtime == "docker" and node.name != exclude]
    if not names:
        raise UserError(f"no Docker nodes to work on in {spec.source}: name them with --node/--to, "
                        'or set runtime = "docker" on the nodes')
    return names


async def _connect(cluster: Cluster, names: Sequence[str]) -> tuple[list[NodeSession], list[NodeOutcome]]:
    """The named nodes that came online, and an outcome for each that did not."""
    await cluster.wait_settled(connect_wait(cluster.spec, 5), names)
    online, offline = [], []
    for name in names:
        node = cluster.node(name)
        if node.transport is not None:
            online.append(node)
        else:
            offline.append(NodeOutcome(name, False, f"{node.state.value}: {node.reason or 'no answer'}"))
    return online, offline


def _in_order(names: Sequence[str], outcomes: list[NodeOutcome]) -> list[NodeOutcome]:
    by_name = {outcome.node: outcome for outcome in outcomes}
    return [by_name[name] for name in names if name in by_name]


def _summarise(outcomes: list[NodeOutcome]) -> int:
    for outcome in outcomes:
        print(f"{outcome.node}: {'ok' if outcome.ok else 'FAILED'}: {outcome.detail}", flush=True)
    failed = [outcome.node for outcome in outcomes if not outcome.ok]
    if failed:
        print(f"failed on {', '.join(failed)}", flush=True)
    return 1 if failed else 0
