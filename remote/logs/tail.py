"""Follow a file or a command's output on a node, across reconnects, into a bounded buffer.

A file is resumed by byte offset (`tail -c +N -F`), counting only complete lines, so a reconnect
neither repeats nor skips a line. A command that replays its whole output when restarted (such as
`docker logs -f`) is resumed by skipping the lines already seen.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Callable, Sequence

from homegpu.remote.events import LogLine
from homegpu.remote.logs.classify import LineClassifier
from homegpu.remote.logs.console import ConsoleLines
from homegpu.remote.logs.script_progress import EpochNumbers
from homegpu.remote.nodes import NODE_GONE, NodeSession, tied_to_session

DEFAULT_MAX_LINES = 5_000
RETRY_SECONDS = 1.0


class _Resume:
    """How to (re)start following: the argv for the current position and how to count progress."""

    label: str
    follow: bool

    def argv(self) -> list[str]:
        raise NotImplementedError

    def advance(self, consumed: int) -> None:
        """Record that `consumed` more bytes of complete lines arrived."""

    def accept(self) -> bool:
        """Record that a line arrived; False means it was seen before and must be dropped."""
        return True


class FileResume(_Resume):
    def __init__(self, path: str, follow: bool = True) -> None:
        self.label, self.path, self.offset, self.follow = path, path, 0, follow

    def argv(self) -> list[str]:
        return ["tail", "-c", f"+{self.offset + 1}", *(["-F"] if self.follow else []), self.path]

    def advance(self, consumed: int) -> None:
        self.offset += consumed


class CommandResume(_Resume):
    follow = False  # a command that ends by itself is done: it is not restarted

    def __init__(self, argv: Sequence[str], label: str | None = None) -> None:
        self._argv, self.label = list(argv), label or " ".join(argv)
        self.seen = 0
        self._position = 0

    def argv(self) -> list[str]:
        self._position = 0
        return list(self._argv)

    def accept(self) -> bool:
        self._position += 1
        if self._position <= self.seen:
            return False
        self.seen = self._position
        return True


class LogTail:
    """Follows one log on one node until stopped; the last `max_lines` lines stay in `lines`. `on_end`: told when a
    command's output ended by itself (a container that stopped)."""

    def __init__(self, node: NodeSession, resume: _Resume, max_lines: int = DEFAULT_MAX_LINES,
                 on_line: Callable[[LogLine], None] | None = None, worker: str = "",
                 batch_size: int | None = None, epoch_numbers: EpochNumbers | None = None,
                 on_end: Callable[[], None] | None = None) -> None:
        self.node, self.resume, self.on_line, self.on_end = node, resume, on_line, on_end
        self.worker = worker or node.name
        self.classifier = LineClassifier(batch_size, epoch_numbers)
        self.lines: collections.deque[LogLine] = collections.deque(maxlen=max_lines)
        self.count = 0
        self.finished = asyncio.Event()
        self._task: asyncio.Task | None = None

    @classmethod
    def file(cls, node: NodeSession, path: str, follow: bool = True, **kwargs) -> "LogTail":
        return cls(node, FileResume(path, follow), **kwargs)

    @classmethod
    def command(cls, node: NodeSession, argv: Sequence[str], label: str | None = None, **kwargs) -> "LogTail":
        return cls(node, CommandResume(argv, label), **kwargs)

    def start(self) -> "LogTail":
        self._task = asyncio.create_task(self._follow(), name=f"tail {self.node.name}:{self.resume.label}")
        return self

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        """Restart the follower after every disconnect; one that ended by itself is done, unless
        it follows a file (tail -F only ends when killed)."""
        while True:
            try:
                await self.node.wait_online()
                if await self._stream_once() is not None and not self.resume.follow:
                    self.finished.set()
                    if self.on_end:
                        self.on_end()
                    return
            except NODE_GONE:
                pass
            await asyncio.sleep(RETRY_SECONDS)

    async def _stream_once(self) -> int | None:
        """Stream until the follower ends; its exit status, or None when the link dropped.

        The bytes go through a console model (remote/logs/console.py): what a terminal would finally
        show, so a progress bar's redraws collapse into one line and no line grows unbounded.
        """
        process = await self.node.spawn(tied_to_session(self.resume.argv()))
        console = ConsoleLines()  # a fresh one: an unfinished line is re-read from its start
        try:
            while chunk := await process.read_chunk():
                before = console.consumed
                lines = console.feed(chunk)
                self.resume.advance(console.consumed - before)
                for text in lines:
                    self._take(text)
            status = await process.wait()
        finally:
            await process.close()
        if status is not None:
            for text in console.flush():  # the command ended: its last line will never get a newline
                self._take(text)
        return status

    async def finish(self, timeout: float) -> bool:
        """Stop following and read a file's log to its end, the unfinished last line included.

        For a worker that has exited: its log will not grow, so this takes every byte there is.
        Returns False when the end could not be read (the node is gone, or `timeout` passed).
        """
        await self.stop()
        if not isinstance(self.resume, FileResume):
            return True
        self.resume.follow = False
        try:
            status = await asyncio.wait_for(self._stream_once(), timeout)
        except (asyncio.TimeoutError, *NODE_GONE):
            return False
        if status == 0:
            self.finished.set()
        return status == 0

    def _take(self, text: str) -> None:
        if not self.resume.accept():
            return
        self.count += 1
        line = LogLine(self.node.name, self.resume.label, self.count, text, self.worker,
                       metric=self.classifier.classify(text))
        self.lines.append(line)
        if self.on_line:
            self.on_line(line)
