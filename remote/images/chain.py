"""`image copy` as a chain: source → first target → second target → …, the image crossing every link once.

The controller only sets the chain up and watches it: every node runs remote/node_side/scripts/image_relay.py (its
source, under the node's python), which reads `docker save` from the source's engine or loads what
it receives into its own while passing it on. A home LAN gives each machine one link, so N targets
cost about one copy's time instead of N copies through one uplink, and nothing crosses the
controller's link at all.

Each hop carries a one-time secret that the controller hands to both of its ends over SSH (stdin,
never argv), so a listener on a node takes the stream from its upstream only. Every relay's life is
bounded on the node itself (`timeout -s KILL`, long enough for a slow copy; every socket wait
inside is bounded by `idle`), and it stops as soon as its SSH session ends.

A node that fails mid-way (its link, its engine, its relay) costs only the nodes after it: those
before it finish their load, those after it are told where the chain broke.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from homegpu.remote.net import json_object
from homegpu.remote.node_side import script
from homegpu.remote.nodes import NODE_GONE, NodeSession, RemoteProcess, TransportError

IDLE_SECONDS = 60.0  # a hop silent this long has failed
ACCEPT_WAIT = 60.0  # how long a target waits for its upstream to connect
START_WAIT = 30.0  # for a relay to start and report its port
MIN_RATE = 2e6  # bytes/s: the slowest copy the kill bound allows for (16 Mbit/s)
LOAD_MARGIN = 600.0  # s: the engine's own work after the last byte, and setup
EXPORT_RATE = 20e6  # bytes/s: the slowest the source's engine may be to begin an export (its work before a byte)
PROGRESS_SECONDS = 5.0
PROGRESS_BYTES = 256 << 20
SECRET_BYTES = 32
STOPPED = "stopped: the chain broke before it"


@dataclass(frozen=True)
class CopyProgress:
    """One target's progress: bytes received so far (`done`: all of them), `loaded` once in its engine."""

    target: str
    bytes_sent: int
    seconds: float
    done: bool = False
    loaded: bool = False


@dataclass
class Relay:
    """One node's part of the chain and what it reported."""

    node: NodeSession
    role: str  # "source" or "target"
    secret: str = ""
    process: RemoteProcess | None = None
    port: int = 0
    bytes: int = 0
    received: bool = False
    loaded: str = ""
    error: str = ""
    next_failed: str = ""
    in_chain: bool = False  # it started and got its place in the chain
    stopped: bool = False  # by us: the chain broke before it

    @property
    def name(self) -> str:
        return self.node.name


def kill_after(image_bytes: int) -> int:
    """Seconds after which a relay is killed on its node whatever it is doing."""
    return int(ACCEPT_WAIT + LOAD_MARGIN + image_bytes / MIN_RATE)


def export_wait(image_bytes: int, idle: float) -> float:
    """Seconds the source waits for its engine's first byte, and the first target for the source: the engine works
    on a big image a while before it sends anything (more on a busy machine), and `idle` alone cut such copies off."""
    return idle + image_bytes / EXPORT_RATE


def relay_argv(python: str, image_bytes: int) -> list[str]:
    return ["timeout", "-s", "KILL", str(kill_after(image_bytes)), python, "-c", script("image_relay")]


def hop_line(target: Relay | None) -> bytes:
    """The second line each relay reads: where to send the stream (None: nowhere, the chain ends)."""
    hop = None if target is None else {"name": target.name, "host": target.node.address, "port": target.port,
                                       "secret": target.secret}
    return json.dumps({"next": hop}).encode() + b"\n"


def part_line(relay: Relay, upstream: str, image: str, port: int, idle: float, first_byte: float) -> bytes:
    """The first line: the relay's own part (the secret its upstream must send, for a target). `first_byte`: the
    source's wait for its engine's export (export_wait), which the source answers before it connects on."""
    part = {"role": relay.role, "name": relay.name, "socket": relay.node.spec.docker_socket, "idle": idle,
            "progress_seconds": PROGRESS_SECONDS, "progress_bytes": PROGRESS_BYTES}
    if relay.role == "source":
        part.update(image=image, export_wait=first_byte)
    else:
        part.update(listen=relay.node.address, port=port, secret=relay.secret, upstream=upstream,
                    accept_wait=ACCEPT_WAIT + first_byte)
    return json.dumps(part).encode() + b"\n"


async def copy_chain(image: str, image_bytes: int, source: NodeSession, targets: Sequence[NodeSession],
                     on_progress: Callable[[CopyProgress], None], *, port: int = 0,
                     idle: float = IDLE_SECONDS) -> dict[str, tuple[bool, str]]:
    """Stream `image` from `source` through every target in order; {target: (ok, detail)}.

    `port`: the port every target listens on (0: any free one; a firewall needs a fixed one).
    """
    head = Relay(source, "source")
    relays = [Relay(node, "target", secret=secrets.token_hex(SECRET_BYTES)) for node in targets]
    argv_of = {relay.name: relay_argv(relay.node.spec.python, image_bytes) for relay in [head, *relays]}
    started = time.monotonic()
    try:
        upstreams = [head.name, *(relay.name for relay in relays)]
        # all at once, the source too: it asks its engine for the export as it starts, and the
        # engine's wait before the first byte overlaps the targets' starts
        first_byte = export_wait(image_bytes, idle)
        await asyncio.gather(_start(head, argv_of[head.name], part_line(head, "", image, port, idle, first_byte)),
                             *(_start_target(relay, argv_of[relay.name],
                                             part_line(relay, up, image, port, idle, first_byte))
                               for relay, up in zip(relays, upstreams)))
        chain = [relay for relay in relays if not relay.error]
        for relay in chain:
            relay.in_chain = True
        if chain and not head.error:
            for relay, after in zip([head, *chain], [*chain, None]):
                relay.process.write(hop_line(after))
            line = [head, *chain]
            watching = asyncio.gather(*(_watch(relay, line[index + 1:], started, on_progress)
                                        for index, relay in enumerate(line)))
            try:  # the relays are killed on their nodes by then; a link gone silent may not say so
                await asyncio.wait_for(watching, kill_after(image_bytes) + START_WAIT)
            except asyncio.TimeoutError:
                for relay in [head, *chain]:
                    relay.error = relay.error or ("" if relay.loaded else "no word from the relay in time")
    finally:
        await asyncio.gather(*(relay.process.close() for relay in [head, *relays] if relay.process))
    return outcomes(head, relays)


async def _start(relay: Relay, argv: list[str], part: bytes) -> None:
    try:
        relay.process = await relay.node.spawn(argv)
        relay.process.write(part)
        await relay.process.drain()
    except NODE_GONE as exc:
        relay.error = f"could not start the relay: {exc}"


async def _start_target(relay: Relay, argv: list[str], part: bytes) -> None:
    """Start a target's relay and read the port it listens on (or why it could not)."""
    await _start(relay, argv, part)
    if relay.error:
        return
    try:
        line = await asyncio.wait_for(_next_event(relay.process), START_WAIT)
    except (TransportError, asyncio.TimeoutError) as exc:
        line = {"event": "error", "error": f"the relay did not start: {str(exc) or 'timed out'}"}
    if line is None:
        stderr = (await relay.process.stderr_text()).strip().splitlines()
        line = {"event": "error", "error": f"{relay.node.spec.python} could not run the relay: "
                                           f"{stderr[-1] if stderr else 'it printed nothing'}"}
    if line.get("event") == "listening":
        relay.port = int(line["port"])
    else:
        relay.error = str(line.get("error", line))


async def _next_event(process: RemoteProcess) -> dict | None:
    lines = process.raw_lines()
    try:
        async for raw in lines:
            if (event := json_object(raw)) is not None:
                return event
        return None
    finally:
        await lines.aclose()


async def _watch(relay: Relay, after: Sequence[Relay], started: float,
                 on_progress: Callable[[CopyProgress], None]) -> None:
    """Follow one relay's reports to its end (or its node's loss). When it fails before the whole
    image went through it, the relays `after` it that are still waiting for it are stopped."""
    try:
        while (event := await _next_event(relay.process)) is not None:
            _apply(relay, event, time.monotonic() - started, on_progress)
            if relay.next_failed:
                # the next node speaks for itself once it got bytes (it may have died: its own
                # watcher says); one that got none waits for a stream that will not come
                _stop(after[1:] if after and after[0].bytes else after)
    except TransportError as exc:
        relay.error = relay.error or f"lost during the copy: {exc}"
    if not (relay.loaded or relay.error or relay.role == "source"):
        status = await relay.process.wait()
        relay.error = STOPPED if relay.stopped else f"the relay ended without a word (status {status})"
    if relay.error and not relay.received:
        _stop(after)


def _stop(relays: Sequence[Relay]) -> None:
    """Stop the relays that wait for a stream that will not come (their stdin closes: they end)."""
    for relay in relays:
        if not (relay.received or relay.stopped):
            relay.stopped = True
            relay.process.terminate()


def _apply(relay: Relay, event: dict, seconds: float, on_progress: Callable[[CopyProgress], None]) -> None:
    kind = event.get("event")
    if kind in ("progress", "received", "sent"):
        relay.bytes = int(event.get("bytes", relay.bytes))
        relay.received = relay.received or kind == "received"
        if relay.role == "target":
            on_progress(CopyProgress(relay.name, relay.bytes, seconds, done=kind == "received"))
    elif kind == "loaded":
        relay.loaded = str(event.get("detail") or "loaded")
        on_progress(CopyProgress(relay.name, relay.bytes, seconds, done=True, loaded=True))
    elif kind == "next_failed":
        relay.next_failed = str(event.get("error", ""))
    elif kind == "error":
        relay.error = str(event.get("error", "failed"))


def outcomes(head: Relay, relays: Sequence[Relay]) -> dict[str, tuple[bool, str]]:
    """Each target's (ok, detail): its load, its own failure, or where the chain broke before it.

    The first node that did not receive the whole image is where the chain broke; every node
    after it that got nothing complete either is told so, with that node's reason.
    """
    results: dict[str, tuple[bool, str]] = {}
    broke_at = "" if not head.error else f"the source {head.name} failed: {head.error}"
    upstream = head
    for relay in relays:
        if not relay.in_chain:
            results[relay.name] = (False, relay.error)
            continue
        if relay.loaded:
            results[relay.name] = (True, relay.loaded)
        elif relay.received:
            results[relay.name] = (False, relay.error or "not loaded")
        elif broke_at:
            results[relay.name] = (False, f"not copied: {broke_at}")
        else:  # the chain broke here: on this node, or on the way to it
            own = relay.error or "not loaded"
            if relay.error in ("", STOPPED) and upstream.next_failed:
                own = f"{upstream.name} could not pass the image on: {upstream.next_failed}"
            results[relay.name] = (False, own)
            broke_at = f"{relay.name} before it in the chain failed: {own}"
        upstream = relay
    return results
