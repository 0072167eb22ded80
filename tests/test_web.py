"""The terminal UI in a browser (tui/web/server.py): a real Chromium, driven by playwright, opens the web view
and finds the nodes' table; nothing the view serves answers without its token, and a request without
it starts no app process.

The server is `homegpu serve --web` as a user runs it (its children are the browser sessions' apps), or
`start_web` on this test's event loop, as serve runs it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest
from helpers import homegpu, homegpu_argv, wait_for, wait_until
from playwright.sync_api import sync_playwright

from homegpu.tui.errors import UserError
from homegpu.tui.web.server import Listen, check_token, parse_listen, start_web
from homegpu.tui.web.token_gate import REFUSED, cookie_name

TOKEN = "test-token-for-the-web-view-0123456789"
NODE = "webnode"
CLUSTER_TOML = f'[cluster]\nname = "webtest"\n\n[[nodes]]\nname = "{NODE}"\nhost = "local"\n'

# textual-serve's page keeps its xterm.js Terminal to itself and draws it on a canvas; this catches it
# as the page's script stores it (`this.terminal = new Terminal(...)`), so the test reads the screen's text.
TERMINAL_HOOK = """
Object.defineProperty(Object.prototype, "terminal", {configurable: true, set(value) {
    Object.defineProperty(this, "terminal", {value, writable: true, configurable: true, enumerable: true});
    if (value && value.buffer) window.__homegpuTerminal = value;
}});
"""
# what the page's policy (tui/web/headers.py) refused: a script, a style, a font or a connection it blocked
CSP_WATCH = """
window.__homegpuBlocked = [];
document.addEventListener("securitypolicyviolation", (event) =>
    window.__homegpuBlocked.push(`${event.effectiveDirective} ${event.blockedURI} ${event.sample}`));
"""
ROBOTO_LOADED = """() => [...document.fonts].some(
    (font) => font.family.includes("Roboto Mono") && font.status === "loaded")"""
SCREEN_TEXT = """() => {
    const terminal = window.__homegpuTerminal;
    if (!terminal) return "";
    const buffer = terminal.buffer.active, rows = [];
    for (let row = 0; row < terminal.rows; row++) {
        const line = buffer.getLine(buffer.viewportY + row);
        rows.push(line ? line.translateToString(true) : "");
    }
    return rows.join("\\n");
}"""


@dataclass(frozen=True)
class Served:
    process: subprocess.Popen
    url: str  # with the token
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def app_children(pid: int) -> list[int]:
    """The browser sessions' apps: the living children of `pid` that run homegpu's command line."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            state, parent = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:2]
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue  # it ended while we looked
        if int(parent) == pid and state != "Z" and b"homegpu.tui.cli.main" in command:
            found.append(int(entry))
    return found


def cluster_file(folder: Path) -> Path:
    path = folder / "cluster.toml"
    path.write_text(CLUSTER_TOML)
    return path


def web_line(output: Path, process: subprocess.Popen) -> str | None:
    """The `web: URL` line serve wrote, or what it left if it exited first; None while neither."""
    text = output.read_text()
    if found := [line for line in text.splitlines(keepends=True) if line.startswith("web: ") and line.endswith("\n")]:
        return found[0].strip()
    return f"(exit {process.returncode}) {text}" if process.poll() is not None else None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`homegpu --config cluster.toml serve --web` on free ports, with a token of its own from the environment."""
    folder = tmp_path_factory.mktemp("web")
    output = folder / "output.txt"  # a file, not a pipe nobody reads: the server writes its apps' stderr there
    with output.open("w") as sink:
        process = subprocess.Popen(
            homegpu_argv("--config", str(cluster_file(folder)), "serve", "--web", "--web-port", "0",
                         "--metrics-port", "0"), cwd=folder,
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "HOMEGPU_WEB_TOKEN": TOKEN})
    line = wait_for(lambda: web_line(output, process), 30, "the address line")
    assert line.startswith("web: http://127.0.0.1:"), f"no address printed: {output.read_text()}"
    url = line.split()[1]
    assert url.endswith(f"/?token={TOKEN}")
    yield Served(process, url, int(url.split(":")[2].split("/")[0]))
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0, output.read_text()
    assert app_children(process.pid) == []


# -- nothing without the token --------------------------------------------------------------------------


async def test_requests_without_the_token_get_401_and_start_no_app(served):
    async with aiohttp.ClientSession() as session:
        for method, path in (("GET", "/"), ("GET", "/?token=wrong-token-of-the-right-length"),
                             ("GET", "/?token="), ("GET", "/static/js/textual.js"), ("GET", "/download/x"),
                             ("GET", "/no/such/page"), ("POST", "/"), ("HEAD", "/")):
            async with session.request(method, served.base + path, allow_redirects=False) as response:
                assert response.status == 401, (method, path)
                assert await response.text() == ("" if method == "HEAD" else REFUSED), (method, path)
        wrong_cookie = {"Cookie": f"{cookie_name(served.port)}=not-the-token-at-all"}
        async with session.get(served.base + "/", headers=wrong_cookie) as response:
            assert response.status == 401
        for query in ("", "?token=wrong-token-of-the-right-length"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(served.base + "/ws" + query)
            assert refused.value.status == 401
        assert app_children(served.process.pid) == []


async def test_a_websocket_from_another_page_gets_403_and_starts_no_app(served):
    """The token, in the address or the cookie, does not say which page opened the websocket: Origin does."""
    cookie = {"Cookie": f"{cookie_name(served.port)}={TOKEN}"}
    async with aiohttp.ClientSession() as session:
        for origin, query, headers in (
                ("http://evil.example", f"?token={TOKEN}", {}),  # a page that learnt the token
                ("http://evil.example", "", cookie),  # the cookie a browser sends with any page's websocket
                ("http://127.0.0.1:1", "", cookie),  # another port of this host, which SameSite counts as one site
                (None, f"?token={TOKEN}", {}),  # no Origin: no browser's websocket
                # a page of another site whose name points here (DNS rebinding): Host and Origin agree
                (f"http://evil.example:{served.port}", f"?token={TOKEN}", {"Host": f"evil.example:{served.port}"})):
            with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
                await session.ws_connect(served.base + "/ws" + query, origin=origin, headers=headers)
            assert (foreign.value.status, origin) == (403, origin)
        assert app_children(served.process.pid) == []

        # its own page's websocket, with the cookie or the token, starts one app, which ends with the session
        for query, headers in (("", cookie), (f"&token={TOKEN}", {})):
            websocket = await session.ws_connect(served.base + "/ws?width=100&height=30" + query,
                                                 origin=served.base, headers=headers)
            assert await wait_until(lambda: len(app_children(served.process.pid)) == 1, 20)
            await websocket.close()
            assert await wait_until(lambda: app_children(served.process.pid) == [], 20)


async def test_every_answer_carries_the_security_headers(served):
    """The page, its files, the redirect, the refusals and a page that is not there."""
    cookie = {"Cookie": f"{cookie_name(served.port)}={TOKEN}"}
    answers = []
    async with aiohttp.ClientSession() as session:
        for path, headers in (("/", cookie), ("/static/js/textual.js", cookie), ("/page/page.css", cookie),
                              (f"/?token={TOKEN}", {}), ("/", {}), ("/no/such/page", cookie)):
            async with session.get(served.base + path, headers=headers, allow_redirects=False) as response:
                answers.append((response.status, response.headers))
        with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
            await session.ws_connect(served.base + "/ws", origin="http://evil.example", headers=cookie)
        answers.append((foreign.value.status, foreign.value.headers))
    assert [status for status, _ in answers] == [200, 200, 200, 302, 401, 404, 403]
    for status, headers in answers:
        assert (headers["X-Frame-Options"], headers["X-Content-Type-Options"], headers["Referrer-Policy"]) == (
            "DENY", "nosniff", "no-referrer"), status
        policy = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
        assert (policy["default-src"], policy["frame-ancestors"], policy["object-src"]) == (
            "'self'", "'none'", "'none'"), status
        assert "unsafe-inline" not in policy["style-src"] and "script-src" not in policy, status


def node_row(screen: str) -> str | None:
    """The node's row under the table's header (NODE, GPU, ...) once its stats came, else None."""
    lines = [line.split("│")[1].split() if line.count("│") >= 2 else [] for line in screen.splitlines()]
    header = next((index for index, cells in enumerate(lines) if cells[:2] == ["NODE", "GPU"]), None)
    if header is None or len(lines) <= header + 1 or NODE not in lines[header + 1] or "connecting" in lines[header + 1]:
        return None
    return " ".join(lines[header + 1])


# -- a person in a browser ------------------------------------------------------------------------------


def test_a_browser_with_the_address_sees_the_nodes_table(served, chromium, tmp_path):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.add_init_script(TERMINAL_HOOK)
            context.add_init_script(CSP_WATCH)
            page = context.new_page()
            requested = []  # everything the page loads, and its websocket: this view's own origin only
            page.on("request", lambda request: requested.append(request.url))
            page.on("websocket", lambda websocket: requested.append(websocket.url))
            page.goto(served.url)  # the address as printed: the page starts the app at once
            assert page.url == served.base + "/", "the token must leave the address bar"
            cookie, = context.cookies()
            assert (cookie["name"], cookie["value"], cookie["httpOnly"], cookie["sameSite"]) == (
                cookie_name(served.port), TOKEN, True, "Strict")
            screen = nodes_table(page)
            page.screenshot(path=str(tmp_path / "web-view.png"))
            print(f"screenshot: {tmp_path / 'web-view.png'}\n{screen}")
            assert "cluster webtest" in screen.splitlines()[0]
            wait_for(lambda: page.evaluate(ROBOTO_LOADED), 15, "the terminal's font, served by the view itself")
            assert page.evaluate("window.__homegpuBlocked") == [], "the page needs something its policy blocks"
            own = (served.base + "/", f"ws://127.0.0.1:{served.port}/")
            assert f"{own[1]}ws?width=" in " ".join(requested)
            assert [url for url in requested if not url.startswith(own)] == [], "the page loaded from another host"
            page.focus(".xterm-helper-textarea")  # where xterm.js takes the keyboard
            page.keyboard.press("?")  # the keys reach the app: its help opens
            wait_for(lambda: "run doctor on every node" in page.evaluate(SCREEN_TEXT), 15, "the help the ? key opens")

            app, = app_children(served.process.pid)
            assert TOKEN.encode() not in Path(f"/proc/{app}/cmdline").read_bytes()
            assert TOKEN.encode() not in Path(f"/proc/{app}/environ").read_bytes()
            page.close()  # the session ends: its app is asked to quit
            wait_for(lambda: app_children(served.process.pid) == [], 20, "the app to end with its page")

            # textual-serve's card, which ?delay=1 keeps up until its button is clicked; the cookie suffices now
            page = context.new_page()
            page.goto(served.base + "/?delay=1")
            assert "homegpu · cluster webtest" in page.inner_text(".intro-dialog")
            assert app_children(served.process.pid) == [], "the page alone must start nothing"
            page.click("#start")  # reloads the page without ?delay, which opens the websocket
            nodes_table(page)
            assert len(app_children(served.process.pid)) == 1
        finally:
            browser.close()
        wait_for(lambda: app_children(served.process.pid) == [], 20, "the app to end with the browser")


def nodes_table(page) -> str:
    """The terminal's text once the nodes' table shows the node with its stats."""
    return wait_for(lambda: (text := page.evaluate(SCREEN_TEXT)) and node_row(text) and text, 30,
                    "the nodes' table in the browser, with the node's stats")


# -- start_web on a running loop, as `homegpu serve` runs it ----------------------------------------------


async def test_start_web_serves_with_a_new_token_and_stop_ends_its_apps(tmp_path):
    view = await start_web(["--config", str(cluster_file(tmp_path))], Listen("127.0.0.1", 0), title="lab")
    base, token = view.url.split("/?token=")
    assert base.startswith("http://127.0.0.1:") and len(token) >= 40
    port = int(base.rsplit(":", 1)[1])
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            async with session.get(view.url) as page:  # the redirect sets the cookie the rest rides on
                assert page.status == 200 and token not in str(page.url)
                assert "lab" in await page.text()
            # the page's own addresses are the ones the browser used (through ssh -L, not the one listened on)
            async with session.get(base + "/", headers={"Host": "localhost:9999"}) as page:
                assert 'data-session-websocket-url="ws://localhost:9999/ws"' in await page.text()
            websocket = await session.ws_connect(base + "/ws", origin=base)
            assert await wait_until(lambda: len(app_children(os.getpid())) == 1, 20)
            await view.stop()
            assert app_children(os.getpid()) == []
            assert websocket.closed or (await websocket.receive()).type in (
                aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
    finally:
        await view.stop()


async def test_an_address_in_use_is_one_line():
    view = await start_web(["--local"], Listen("127.0.0.1", 0))
    port = int(view.url.split("/?")[0].rsplit(":", 1)[1])
    try:
        with pytest.raises(UserError, match=f"^cannot listen on 127.0.0.1:{port}: Address already in use; "):
            await start_web(["--local"], Listen("127.0.0.1", port))
    finally:
        await view.stop()


# -- where it listens -------------------------------------------------------------------------------------


def test_listen_addresses():
    assert parse_listen("8765") == Listen("127.0.0.1", 8765)
    assert parse_listen("0.0.0.0:9000") == Listen("0.0.0.0", 9000)
    assert parse_listen("[::1]:9000") == Listen("::1", 9000)
    assert parse_listen("localhost") == Listen("localhost", 8765)
    assert parse_listen("::1") == Listen("::1", 8765)
    for bad in ("host:99999", ":80", "a:b:c", "[::1]:x", ""):
        with pytest.raises(UserError):
            parse_listen(bad)
    assert Listen("127.0.0.2", 1).loopback and Listen("::1", 1).loopback and Listen("localhost", 1).loopback
    assert not Listen("0.0.0.0", 1).loopback and not Listen("lab.example", 1).loopback


def test_only_loopback_goes_without_a_token_given():
    assert len(check_token(Listen("127.0.0.1", 8765), None)) >= 40
    assert check_token(Listen("0.0.0.0", 8765), TOKEN) == TOKEN
    with pytest.raises(UserError, match="reachable from other machines.*ssh -L 8765:127.0.0.1:8765"):
        check_token(Listen("0.0.0.0", 8765), None)
    for bad in ("short", "a-token-long-enough-but&with-an-ampersand"):
        with pytest.raises(UserError, match="at least 16"):
            check_token(Listen("127.0.0.1", 8765), bad)


def test_web_on_another_address_without_a_token_is_one_line_exit_2(tmp_path):
    env_free = {key: value for key, value in os.environ.items() if key != "HOMEGPU_WEB_TOKEN"}
    result = subprocess.run(homegpu_argv("--local", "serve", "--web", "--listen", "0.0.0.0", "--web-port", "0"),
                            cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env=env_free)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("homegpu: error: listen address 0.0.0.0:0 is reachable from other machines")


def test_the_ui_opens_under_textual_serve_without_a_terminal(tmp_path):
    """Through pipes, plain `homegpu` prints its help; with Textual's web driver chosen it is the UI."""
    assert homegpu("--local", cwd=tmp_path).stdout.startswith("usage: homegpu")
    env = {**os.environ, "TEXTUAL_DRIVER": "textual.drivers.web_driver:WebDriver"}
    process = subprocess.Popen(homegpu_argv("--local"), cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout.readline() == b"__GANGLION__\n"  # the web driver's greeting to textual-serve
    finally:
        process.kill()
        process.wait()

