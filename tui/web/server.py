"""The terminal UI in a browser: textual-serve behind a token, for a lab's second person.

textual-serve serves a page whose websocket starts `homegpu` anew for every browser session, each
with the cluster options the server got (`--config FILE` or `--local`), never the token. It has no
authentication of its own: tui/web/token_gate.py puts a token check in front of everything it serves,
tui/web/origin.py lets only its own page open the websocket, tui/web/headers.py keeps the page to its
own origin. The page is homegpu's (templates/, page/): textual-serve's without inline code or fonts
from another host.
It listens on 127.0.0.1 unless told otherwise, and elsewhere only with a token given on purpose; a
person reaches the loopback one with `ssh -L`.

`homegpu serve` runs it beside its other tasks on one event loop:

    view = await start_web(cluster_args(args), parse_listen("127.0.0.1:8765"), token=None, title=...)
    print(f"web: {view.url}")      # the address with its token, for the person who opens it
    ...
    await view.stop()              # stops listening, asks every session's app to quit, then ends it
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import shlex
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import aiohttp_jinja2
from aiohttp import WSCloseCode, web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

from homegpu.remote.config import find_config
from homegpu.tui.errors import UserError
from homegpu.tui.web import WEB_TOKEN_ENV
from homegpu.tui.web.headers import add_security_headers
from homegpu.tui.web.origin import is_loopback, origin_middleware
from homegpu.tui.web.token_gate import MIN_TOKEN_LENGTH, QUERY, new_token, token_middleware

DEFAULT_PORT = 8765
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
TOKEN_SHAPE = re.compile(rf"[A-Za-z0-9_-]{{{MIN_TOKEN_LENGTH},}}")  # token_urlsafe's alphabet: no quoting
QUIT_GRACE = 5.0  # seconds an app has to quit when the view stops, before it is terminated
TEMPLATES = Path(__file__).parent / "templates"  # the page, textual-serve's own made safe
PAGE_FILES = Path(__file__).parent / "page"  # its style and script, at /page/

log = logging.getLogger("homegpu.web")


@dataclass(frozen=True)
class Listen:
    """Where the web view listens; port 0 picks a free one."""

    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """`PORT`, `HOST`, `HOST:PORT`, `IPv6` or `[IPv6]:PORT`; the host defaults to 127.0.0.1, the port to 8765."""
    host, port = text.strip(), str(DEFAULT_PORT)
    if host.isdigit():
        host, port = "127.0.0.1", host
    elif host.startswith("["):
        inside, _, rest = host[1:].partition("]")
        host, port = inside, rest.removeprefix(":") or port
    elif host.count(":") == 1:
        host, port = host.split(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535 or (":" in host and not _ipv6(host)):
        raise UserError(f"listen address {text!r}: write PORT, HOST:PORT or [IPv6]:PORT with a port from 0 to 65535")
    return Listen(host, int(port))


def cluster_args(args: argparse.Namespace) -> list[str]:
    """The options that give each browser session's `homegpu` the cluster this command has."""
    if getattr(args, "local", False):
        return ["--local"]
    path = find_config(args.config)
    return ["--config", str(path.resolve())] if path else ["--local"]


def check_token(listen: Listen, token: str | None) -> str:
    """The token to use: the one given, else a new one; only loopback may do without one given."""
    if token is None and not listen.loopback:
        raise UserError(
            f"listen address {listen} is reachable from other machines: give it a token of your own "
            f"({WEB_TOKEN_ENV}, at least {MIN_TOKEN_LENGTH} characters), or listen on 127.0.0.1 and reach it "
            f"with ssh -L {listen.port or DEFAULT_PORT}:127.0.0.1:{listen.port or DEFAULT_PORT} THIS-HOST")
    if token is not None and not TOKEN_SHAPE.fullmatch(token):
        raise UserError(f"the web view's token must be at least {MIN_TOKEN_LENGTH} letters, digits, '-' or '_' (it "
                        "goes in an address); `python3 -c 'import secrets; print(secrets.token_urlsafe())'` makes one")
    return token or new_token()


class WebView:
    """A running web view: `url` (with its token) to print, `stop()` to end it and every session's app."""

    def __init__(self, runner: web.AppRunner, server: "_TokenServer", url: str) -> None:
        self.url, self._runner, self._server = url, runner, server
        self._stopped = False

    async def stop(self) -> None:
        """Idempotent: stop listening, ask every session's app to quit, end those that do not."""
        if self._stopped:
            return
        self._stopped = True
        await self._runner.cleanup()  # stops listening; on_shutdown closes every websocket, each app is asked to quit
        await self._server.end_apps(QUIT_GRACE)


async def start_web(cluster_options: Sequence[str], listen: Listen, token: str | None = None,
                    title: str = "homegpu") -> WebView:
    """Start serving on the running event loop and return at once.

    Raises:
        UserError: a non-loopback address without a token given, a short token, or an address that
            cannot be listened on.
    """
    token = check_token(listen, token)
    try:
        sock = socket.create_server((listen.host, listen.port), family=_family(listen.host))
    except OSError as exc:
        reason = str(exc.strerror or exc).split(" (while attempting")[0]  # create_server repeats the address
        raise UserError(f"cannot listen on {listen}: {reason}; choose another address or port") from None
    port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "homegpu.tui.cli.main", *cluster_options]
    server = _TokenServer(argv, title, token, Listen(listen.host, port))
    runner = web.AppRunner(await server._make_app(), access_log=None,  # an access log would record the token
                           shutdown_timeout=QUIT_GRACE, handle_signals=False)
    try:
        await runner.setup()
        await web.SockSite(runner, sock).start()
    except BaseException:
        sock.close()
        await runner.cleanup()
        raise
    return WebView(runner, server, f"http://{_url_host(listen.host)}:{port}/?{QUERY}={token}")


def _ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _url_host(host: str) -> str:
    """The host part of the address to print: a wildcard is named by this machine's name."""
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


class _AppProcess(AppService):
    """One browser session's `homegpu`: started without a shell, in a session of its own, without the token."""

    def __init__(self, argv: list[str], **kwargs) -> None:
        super().__init__(shlex.join(argv), **kwargs)
        self.argv = argv

    async def _open_app_process(self, width: int = 80, height: int = 24) -> asyncio.subprocess.Process:
        environment = self._build_environment(width=width, height=height)
        environment.pop(WEB_TOKEN_ENV, None)
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=environment, start_new_session=True)
        self._stdin = process.stdin
        return process

    async def end(self, grace: float) -> None:
        """Wait `grace` seconds for the app to have quit, then terminate it, then kill it."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        for signum, wait in ((None, grace), (signal.SIGTERM, 2.0), (signal.SIGKILL, None)):
            if signum is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), wait)
                return


class _TokenServer(Server):
    """textual-serve's Server with the token in front of every route, page URLs from the request's own
    address (the one the browser used: through `ssh -L` it is not the one listened on), and its
    sessions' apps tracked so that stopping ends them."""

    def __init__(self, argv: list[str], title: str, token: str, listen: Listen) -> None:
        super().__init__(shlex.join(argv), host=listen.host, port=listen.port, title=title, templates_path=TEMPLATES)
        self.argv, self.token, self.loopback = argv, token, listen.loopback
        self.apps: set[_AppProcess] = set()
        self.websockets: set[web.WebSocketResponse] = set()

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        # before every route textual-serve adds: the token, then which page opens the websocket
        app.middlewares[:0] = [token_middleware(self.token, self.port), origin_middleware(self.loopback)]
        app.router.add_static("/page", PAGE_FILES)
        app.on_response_prepare.append(add_security_headers)
        app.on_shutdown.append(self._close_websockets)
        return app

    async def on_startup(self, app: web.Application) -> None:
        """Quiet: the caller prints the address (textual-serve's banner would print one without the token)."""

    async def handle_index(self, request: web.Request) -> web.Response:
        context = {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"{'wss' if request.scheme == 'https' else 'ws'}://{request.host}/ws",
            "application": {"name": self.title},
        }
        return aiohttp_jinja2.render_template("app_index.html", request, context)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """textual-serve's own, with _AppProcess for its app and the session tracked."""
        websocket = web.WebSocketResponse(heartbeat=15)
        width = to_int(request.query.get("width", "80"), 80)
        height = to_int(request.query.get("height", "24"), 24)
        app: _AppProcess | None = None
        self.websockets.add(websocket)
        try:
            await websocket.prepare(request)
            app = _AppProcess(self.argv, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                              close=websocket.close, download_manager=self.download_manager)
            self.apps.add(app)
            await app.start(width, height)
            await self._process_messages(websocket, app)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception:
            log.exception("web session failed")
        finally:
            self.websockets.discard(websocket)
            if app is not None:
                await app.stop()  # asks the app to quit and waits for its output to end
                await app.end(QUIT_GRACE)  # and for its process, which a cancelled stop does not wait for
                self.apps.discard(app)  # not reached when cancelled: end_apps ends it then
        return websocket

    async def _close_websockets(self, app: web.Application) -> None:
        await asyncio.gather(*(websocket.close(code=WSCloseCode.GOING_AWAY, message=b"homegpu web view stopped")
                               for websocket in list(self.websockets)), return_exceptions=True)

    async def end_apps(self, grace: float) -> None:
        await asyncio.gather(*(app.end(grace) for app in list(self.apps)))
        self.apps.clear()
