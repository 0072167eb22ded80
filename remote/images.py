"""Worker images on the nodes: build them there, or copy one from node to node.

Home clusters rarely have a registry, so images move the way `docker save | ssh … docker load`
would move them, but through the Docker API on the nodes' forwarded sockets: the source's export
streams straight into each target's import, with no tar file on disk anywhere and at most a few
MiB per target in memory (one reader thread, one bounded queue per target). The slowest target
sets the pace; one that fails is dropped without stopping the others.

Builds run on every chosen node in parallel through the API (the node's engine pulls the base
image itself when it can reach a registry).

docker-py blocks, so its calls run in threads; progress comes back to the event loop as calls of
the `on_line` / `on_progress` callbacks there.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import docker.errors

from homegpu.remote.docker_link import DockerLink, DockerUnavailable, docker_client
from homegpu.remote.node import NODE_GONE, NodeSession

CHUNK_BYTES = 1 << 20
QUEUE_CHUNKS = 8  # per target: at most this many chunks wait in memory
PROGRESS_EVERY_BYTES = 64 << 20
PROGRESS_EVERY_SECONDS = 5.0
_PUT_POLL_SECONDS = 0.5
_END = object()

LineCallback = Callable[[str, str], None]  # (node, line)


class ImageError(Exception):
    """An image operation cannot start at all (no such image on the source, …)."""


@dataclass(frozen=True)
class NodeOutcome:
    """How one node fared: ok, and a short line for the summary (image id, or what went wrong)."""

    node: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class CopyProgress:
    """Bytes of the image that reached one target so far; `done` on the last report."""

    target: str
    bytes_sent: int
    seconds: float
    done: bool = False


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
                     on_progress: Callable[[CopyProgress], None]) -> list[NodeOutcome]:
    """Stream `image` from `source`'s engine into each target's engine (like docker save | docker load).

    Targets that already hold the very same image (same id) are left alone.

    Raises:
        ImageError: the source does not have the image.
        DockerUnavailable: the source's engine cannot be reached.
    """
    async with docker_client(source, timeout=None) as src:
        try:
            image_id = (await src.call(src.api.inspect_image, image))["Id"]
        except docker.errors.NotFound:
            raise ImageError(f"image {image} is not on {source.name}: build it there first "
                             f"(homegpu image build --node {source.name})") from None
        return await _copy_to(image, image_id, src, targets, on_progress)


async def _copy_to(image: str, image_id: str, src: DockerLink, targets: Sequence[NodeSession],
                   on_progress: Callable[[CopyProgress], None]) -> list[NodeOutcome]:
    """Open every target, leave out the up-to-date ones, then pump the export into all the rest."""
    async with contextlib.AsyncExitStack() as stack:
        opened = await asyncio.gather(*(_open_target(stack, node) for node in targets))
        outcomes = {outcome.node: outcome for outcome in opened if isinstance(outcome, NodeOutcome)}
        wanted = {}
        for link in (item for item in opened if isinstance(item, DockerLink)):
            if await _has_image(link, image_id):
                outcomes[link.node] = NodeOutcome(link.node, True, f"already has {image} ({_short_id(image_id)})")
            else:
                wanted[link.node] = link
        if wanted:
            outcomes.update(await _stream(image, src, wanted, on_progress))
    return [outcomes[node.name] for node in targets]


async def _open_target(stack: contextlib.AsyncExitStack, node: NodeSession) -> DockerLink | NodeOutcome:
    """A link to the target kept open until `stack` closes, or its failure as an outcome."""
    try:
        return await stack.enter_async_context(docker_client(node, timeout=None))
    except (DockerUnavailable, *NODE_GONE) as exc:
        return _outcome(node, exc)


async def _has_image(link: DockerLink, image_id: str) -> bool:
    try:
        await link.call(link.api.inspect_image, image_id)
    except docker.errors.NotFound:
        return False
    return True


async def _stream(image: str, src: DockerLink, targets: dict[str, DockerLink],
                  on_progress: Callable[[CopyProgress], None]) -> dict[str, NodeOutcome]:
    """One export from the source, fanned out to a load on every target; each target's outcome."""
    fanout = Fanout(list(targets))
    report = _on_loop(asyncio.get_running_loop(), on_progress)
    pump = asyncio.ensure_future(asyncio.to_thread(fanout.pump, lambda: src.api.get_image(image, CHUNK_BYTES)))
    results = await asyncio.gather(*(_load(link, name, fanout, report) for name, link in targets.items()),
                                   return_exceptions=True)
    await pump
    outcomes = {}
    for name, result in zip(targets, results):
        if isinstance(result, BaseException) and fanout.error is not None:
            result = ImageError(f"reading {image} from {src.node} failed: {fanout.error}")
        outcomes[name] = _outcome_named(name, result)
    return outcomes


async def _load(link: DockerLink, name: str, fanout: "Fanout",
                report: Callable[[CopyProgress], None]) -> NodeOutcome:
    try:
        loaded = await link.call(_run_load, link, fanout.consume(name, report))
    finally:
        fanout.drop(name)  # a load that ended early must not keep the pump waiting on its queue
    return NodeOutcome(name, True, loaded)


def _run_load(link: DockerLink, chunks: Iterator[bytes]) -> str:
    """The blocking load; the engine's "Loaded image: …" line."""
    loaded = ""
    for message in link.api.load_image(chunks, quiet=True) or ():
        if "error" in message:
            raise ImageError(message.get("errorDetail", {}).get("message") or message["error"])
        loaded = message.get("stream", "").strip() or loaded
    return loaded or "loaded"


class Fanout:
    """Copies one stream of chunks to several consumers, each through its own bounded queue.

    `pump` runs in one thread; each `consume` generator runs in its consumer's thread. A consumer
    that stops early must be `drop`ped, after which its chunks are discarded instead of waited on.
    """

    def __init__(self, names: Iterable[str], depth: int = QUEUE_CHUNKS) -> None:
        self.queues = {name: queue.Queue(depth) for name in names}
        self._dropped: set[str] = set()
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def drop(self, name: str) -> None:
        with self._lock:
            self._dropped.add(name)

    def _live(self, name: str) -> bool:
        with self._lock:
            return name not in self._dropped

    def pump(self, open_source: Callable[[], Iterable[bytes]]) -> None:
        """Read the source to its end (or until every consumer dropped out), feeding every queue."""
        source = open_source()
        try:
            for chunk in source:
                if not any(self._live(name) for name in self.queues):
                    break
                for name in self.queues:
                    self._put(name, chunk)
        except BaseException as exc:  # handed to the consumers, whose loads then fail
            self.error = exc
        finally:
            getattr(source, "close", lambda: None)()
            for name in self.queues:
                self._put(name, _END)

    def _put(self, name: str, item: object) -> None:
        while self._live(name):
            try:
                self.queues[name].put(item, timeout=_PUT_POLL_SECONDS)
                return
            except queue.Full:
                continue

    def consume(self, name: str, report: Callable[[CopyProgress], None]) -> Iterator[bytes]:
        """The chunks for `name`, reporting progress; raises if the source failed mid-way."""
        started = last_time = time.monotonic()
        sent = last_sent = 0
        while (item := self.queues[name].get()) is not _END:
            sent += len(item)
            yield item
            now = time.monotonic()
            if sent - last_sent >= PROGRESS_EVERY_BYTES or now - last_time >= PROGRESS_EVERY_SECONDS:
                report(CopyProgress(name, sent, now - started))
                last_sent, last_time = sent, now
        if self.error is not None:
            raise ImageError(f"the source stopped sending: {self.error}")
        report(CopyProgress(name, sent, time.monotonic() - started, done=True))


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
