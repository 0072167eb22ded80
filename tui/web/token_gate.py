"""The web view's lock: a token checked on every request, the page, its files and its websocket alike.

textual-serve has no authentication of its own and starts an app process for every websocket, so
nothing it serves may answer without the token: a request that lacks it gets HTTP 401 and one line.
The token comes once in the address (`/?token=...`); the answer is a redirect to the same address
without it, with an HttpOnly, SameSite=Strict cookie that the page's own files and websocket carry.
The token then stays out of the address bar, the history and any Referer header. Which page may
open the websocket is tui/web/origin.py's concern, checked after this.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Awaitable, Callable

from aiohttp import web

from homegpu.tui.web.throttle import Throttle

QUERY = "token"
MIN_TOKEN_LENGTH = 16  # a token given by hand must not be guessable; generated ones have 43 characters
REFUSED = "homegpu web view: this address needs its token; open the address with ?token= that homegpu printed\n"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def matches(given: str | None, token: str) -> bool:
    """Constant-time comparison, so a wrong guess's timing says nothing about the right one."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def cookie_name(port: int) -> str:
    """Browsers share cookies across ports, so two web views on one host each keep their own."""
    return f"homegpu_web_{port}"


def token_middleware(token: str, port: int, throttle: Throttle | None = None) -> Middleware:
    """An aiohttp middleware that lets through only requests that carry `token` (query or cookie); a
    wrong token is answered late, later each time (tui/web/throttle.py), a missing one at once."""
    cookie, throttle = cookie_name(port), throttle or Throttle()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        in_query, in_cookie, client = request.query.get(QUERY), request.cookies.get(cookie), request.remote or ""
        if not (matches(in_query, token) or matches(in_cookie, token)):
            if in_query is not None or in_cookie is not None:
                await throttle.wrong(client)
            return web.Response(status=401, text=REFUSED, headers={"Cache-Control": "no-store"})
        throttle.right(client)
        if matches(in_query, token) and request.method in ("GET", "HEAD") and not is_websocket(request):
            return _enter(request, cookie, token)
        return await handler(request)

    return require_token


def _enter(request: web.Request, cookie: str, token: str) -> web.Response:
    """The redirect that trades the token in the address for the cookie."""
    response = web.Response(status=302, headers={
        "Location": str(request.rel_url.without_query_params(QUERY)), "Cache-Control": "no-store"})
    response.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
    return response
