"""The web view's gate without a browser or an app: wrong tokens slowed per client (tui/web/throttle.py) on
an injected clock, and which websocket requests count as from the view's own page (tui/web/origin.py)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import DummyCookieJar, web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from homegpu.tui.web.origin import from_own_page
from homegpu.tui.web.throttle import Throttle
from homegpu.tui.web.token_gate import cookie_name, token_middleware

TOKEN = "test-token-for-the-web-gate-0123456789"
PORT = 8765


class Clock:
    """A clock that stands still unless slept on: each sleep asked for is recorded, and passes at once."""

    def __init__(self, advance: bool = True) -> None:
        self.now, self.advance, self.asked = 1000.0, advance, []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.asked.append(round(seconds, 6))
        if self.advance:
            self.now += seconds


def throttle_on(clock: Clock, clients: int = 1024) -> Throttle:
    return Throttle(first=0.05, cap=3.0, clients=clients, clock=clock, sleep=clock.sleep)


async def guess(throttle: Throttle, client: str, times: int = 1) -> None:
    for _ in range(times):
        await throttle.wrong(client)


async def test_each_wrong_token_waits_twice_as_long_up_to_the_cap():
    clock = Clock()
    await guess(throttle_on(clock), "10.0.0.9", 9)
    assert clock.asked == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0, 3.0]


async def test_wrong_tokens_at_once_are_answered_one_after_another():
    """Many connections guessing together guess no faster than one: each answer waits for the one before."""
    clock = Clock(advance=False)
    throttle = throttle_on(clock)
    await asyncio.gather(*(throttle.wrong("10.0.0.9") for _ in range(4)))
    assert clock.asked == [0.05, 0.15, 0.35, 0.75]


async def test_the_right_token_starts_a_client_over_and_clients_are_counted_apart():
    clock = Clock()
    throttle = throttle_on(clock)
    await guess(throttle, "10.0.0.9", 3)
    await guess(throttle, "10.0.0.8")
    throttle.right("10.0.0.9")
    await guess(throttle, "10.0.0.9")
    assert clock.asked == [0.05, 0.1, 0.2, 0.05, 0.05]


async def test_it_remembers_a_bounded_number_of_clients_the_least_recent_forgotten():
    clock = Clock()
    throttle = throttle_on(clock, clients=2)
    await guess(throttle, "a", 2)
    await guess(throttle, "b", 2)
    await guess(throttle, "a")  # a is now the most recent
    await guess(throttle, "c")  # one too many: b goes
    clock.asked.clear()
    await guess(throttle, "a")
    await guess(throttle, "b")
    assert clock.asked == [0.4, 0.05]


async def page(request: web.Request) -> web.Response:
    return web.Response(text="the page")


@pytest.fixture
async def gate():
    """A page behind token_middleware, with its throttle on a Clock; yields (client, clock)."""
    clock = Clock()
    app = web.Application(middlewares=[token_middleware(TOKEN, PORT, throttle_on(clock))])
    app.router.add_get("/", page)
    async with TestClient(TestServer(app), cookie_jar=DummyCookieJar()) as client:  # each request's cookie its own
        yield client, clock


async def test_the_gate_slows_wrong_tokens_only(gate):
    client, clock = gate
    wrong = "wrong-token-of-the-right-length"
    for path, headers in (("/", {}), (f"/?token={wrong}", {}), ("/", {"Cookie": f"{cookie_name(PORT)}={wrong}"}),
                          ("/?token=", {})):
        async with client.get(path, headers=headers, allow_redirects=False) as response:
            assert response.status == 401
    assert clock.asked == [0.05, 0.1, 0.2]  # none for the request without a token: it guesses nothing

    clock.asked.clear()
    for path, headers in ((f"/?token={TOKEN}", {}), ("/", {"Cookie": f"{cookie_name(PORT)}={TOKEN}"})):
        async with client.get(path, headers=headers, allow_redirects=False) as response:
            assert response.status in (200, 302)
    async with client.get(f"/?token={wrong}", allow_redirects=False) as response:
        assert response.status == 401
    assert clock.asked == [0.05], "the right token waits for nothing and starts its client over"


def websocket_request(host: str, origin: str | None):
    headers = {"Host": host, "Upgrade": "websocket", "Connection": "Upgrade"}
    return make_mocked_request("GET", "/ws", headers={**headers, **({"Origin": origin} if origin else {})})


@pytest.mark.parametrize("host, origin, loopback, own", [
    ("127.0.0.1:8765", "http://127.0.0.1:8765", True, True),
    ("localhost:9000", "http://LOCALHOST:9000", True, True),  # through ssh -L to another port
    ("[::1]:8765", "http://[::1]:8765", True, True),
    ("127.0.0.1:8765", None, True, False),  # no browser's websocket
    ("127.0.0.1:8765", "http://evil.example", True, False),
    ("127.0.0.1:8765", "http://127.0.0.1:1", True, False),  # another port of the same host
    ("127.0.0.1:8765", "https://127.0.0.1:8765", True, False),  # another scheme
    ("evil.example:8765", "http://evil.example:8765", True, False),  # DNS rebinding to a loopback view
    ("lab.lan:8765", "http://lab.lan:8765", False, True),  # a view on the LAN, by this machine's name
    ("lab.lan:8765", "http://evil.example", False, False),
])
def test_a_websocket_is_from_the_own_page_when_origin_is_scheme_and_host(host, origin, loopback, own):
    assert from_own_page(websocket_request(host, origin), loopback) is own
