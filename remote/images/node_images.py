"""Worker images on the nodes: build them there, or copy one from node to node.

Home clusters rarely have a registry, so images move the way `docker save | ssh … docker load`
would move them, but node to node in a chain (remote/images/chain.py): the source's export crosses
every link once, each target loading it while passing it on, with no tar file on disk anywhere.
The engines are asked through the nodes' forwarded sockets which targets need the image at all,
and afterwards whether each now holds the source's image id.

Builds run on every chosen node in parallel through the API (the node's engine pulls the base
image itself when it can reach a registry).

docker-py blocks, so its calls run in threads; progress comes back to the event loop as calls of
the `on_line` / `on_progress` callbacks there.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import docker.errors

from homegpu.remote.images.chain import IDLE_SECONDS, CopyProgress, copy_chain
from homegpu.remote.nodes import NODE_GONE, NodeSession
from homegpu.remote.runtimes import DockerLink, DockerUnavailable, docker_client

LineCallback = Callable[[str, str], None]  # (node, line)


class ImageError(Exception):
    """An image operation cannot start at all (no such image on the source, …)."""


@dataclass(frozen=True)
class NodeOutcome:
    """How one node fared: ok, and a short line for the summary (image id, or what went wrong)."""

    node: str
    ok: bool
    detail: str


# -- threads to the event loop ---------------------------------------------------------------------


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable) -> Callable:
    """A thread-safe wrapper that runs `callback(*args)` on `loop`."""
    def call(*args) -> None:
        loop.call_soon_threadsafe(callback, *args)
    return call


# -- build -----------------------------------------------------------------------------------------


async def build_on_nodes(nodes: Sequence[NodeSession], dockerfile: Path, tag: str,
                         on_line: LineCallback) -> list[NodeOutcome]:
    """Build `dockerfile` (its directory is the context) as `tag` on every node at once."""
    results = await asyncio.gather(*(build_on_node(node, dockerfile, tag, on_line) for node in nodes),
                                   return_exceptions=True)
    return [_outcome(node, result) for node, result in zip(nodes, results)]


async def build_on_node(node: NodeSession, dockerfile: Path, tag: str, on_line: LineCallback) -> NodeOutcome:
    """One node's build; the image id on success. Raises DockerUnavailable, ImageError."""
    emit = _on_loop(asyncio.get_running_loop(), on_line)
    async with docker_client(node) as link:
        image_id = await link.call(_run_build, link, dockerfile, tag, lambda text: emit(node.name, text))
    return NodeOutcome(node.name, True, f"built {tag} ({_short_id(image_id)})")


def _run_build(link: DockerLink, dockerfile: Path, tag: str, emit: Callable[[str], None]) -> str:
    """The blocking build: streams the context up and the engine's messages back. Returns the id."""
    image_id = ""
    stream = link.api.build(path=str(dockerfile.parent), dockerfile=dockerfile.name, tag=tag, rm=True,
                            forcerm=True, decode=True, timeout=None)
    for message in stream:
        if "error" in message:
            raise ImageError(message.get("errorDetail", {}).get("message") or message["error"])
        image_id = message.get("aux", {}).get("ID", image_id)
        for line in build_message_lines(message):
            emit(line)
    if not image_id:
        raise ImageError("the build ended without an image")
    return image_id


def build_message_lines(message: dict) -> list[str]:
    """The lines worth showing from one decoded build message (pure; progress bars dropped)."""
    if "stream" in message:
        return [line.rstrip() for line in message["stream"].splitlines() if line.strip()]
    if "status" in message and not message.get("progressDetail"):
        ident = f"{message['id']}: " if message.get("id") else ""
        return [f"{ident}{message['status']}"]
    return []


# -- copy ------------------------------------------------------------------------------------------


async def copy_image(image: str, source: NodeSession, targets: Sequence[NodeSession],
                     on_progress: Callable[[CopyProgress], None], *, port: int = 0,
                     idle: float = IDLE_SECONDS) -> list[NodeOutcome]:
    """Copy `image` from `source`'s engine into each target's, node to node (remote/images/chain.py).

    Targets whose engine cannot be reached, or that already hold the very same image (same id),
    are left out of the chain; each loaded target is checked to hold the source's image id.

    Raises:
        ImageError: the source does not have the image.
        DockerUnavailable: the source's engine cannot be reached.
    """
    async with contextlib.AsyncExitStack() as stack:
        # the source's image and the targets' engines at once; every task ends before the stack closes
        found, *opened = await asyncio.gather(_source_image(source, image),
                                              *(_open_target(stack, node) for node in targets),
                                              return_exceptions=True)
        for result in (found, *opened):
            if isinstance(result, BaseException):
                raise result
        image_id, size = found["Id"], int(found.get("Size") or 0)
        outcomes = {outcome.node: outcome for outcome in opened if isinstance(outcome, NodeOutcome)}
        links = {link.node: link for link in opened if isinstance(link, DockerLink)}
        held = await asyncio.gather(*(_has_image(link, image_id) for link in links.values()))
        for name, has in zip(links, held):
            if has:
                outcomes[name] = NodeOutcome(name, True, f"already has {image} ({_short_id(image_id)})")
        wanted = [node for node in targets if node.name not in outcomes]
        if wanted:
            chained = await copy_chain(image, size, source, wanted, on_progress, port=port, idle=idle)
            for name, (ok, detail) in chained.items():
                if ok and not await _has_image(links[name], image_id):
                    ok, detail = False, f"{detail}, but not as {_short_id(image_id)}: the stream was altered"
                outcomes[name] = NodeOutcome(name, ok, detail)
    return [outcomes[node.name] for node in targets]


async def _source_image(source: NodeSession, image: str) -> dict:
    """The source engine's inspection of `image`. Raises ImageError, DockerUnavailable."""
    async with docker_client(source) as src:
        try:
            return await src.call(src.api.inspect_image, image)
        except docker.errors.NotFound:
            raise ImageError(f"image {image} is not on {source.name}: build it there first "
                             f"(homegpu image build --node {source.name})") from None


async def _open_target(stack: contextlib.AsyncExitStack, node: NodeSession) -> DockerLink | NodeOutcome:
    """A link to the target kept open until `stack` closes, or its failure as an outcome."""
    try:
        return await stack.enter_async_context(docker_client(node))
    except (DockerUnavailable, *NODE_GONE) as exc:
        return _outcome(node, exc)


async def _has_image(link: DockerLink, image_id: str) -> bool:
    try:
        await link.call(link.api.inspect_image, image_id)
    except docker.errors.NotFound:
        return False
    return True


# -- outcomes --------------------------------------------------------------------------------------


def _outcome(node: NodeSession, result: object) -> NodeOutcome:
    return _outcome_named(node.name, result)


def _outcome_named(name: str, result: object) -> NodeOutcome:
    """A gather() result as a NodeOutcome; unexpected exceptions propagate (bugs must show)."""
    if isinstance(result, NodeOutcome):
        return result
    if isinstance(result, (ImageError, DockerUnavailable, *NODE_GONE)):
        text = str(result)
        return NodeOutcome(name, False, text.removeprefix(f"{name}: "))
    if isinstance(result, BaseException):
        raise result
    raise TypeError(f"unexpected result {result!r}")


def _short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]
