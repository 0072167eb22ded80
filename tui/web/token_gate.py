"""The web view's one lock: a token checked on every request, the page, its files and its websocket alike.

textual-serve has no authentication of its own and starts an app process for every websocket, so
nothing it serves may answer without the token: a request that lacks it gets HTTP 401 and one line.
The token comes once in the address (`/?token=...`); the answer is a redirect to the same address
without it, with an HttpOnly, SameSite=Strict cookie that the page's own files and websocket carry.
The token then stays out of the address bar, the history and any Referer header.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

QUERY = "token"
MIN_TOKEN_LENGTH = 16  # a token given by hand must not be guessable; generated ones have 43 characters
REFUSED = "homegpu web view: this address needs its token; open the address with ?token= that homegpu printed\n"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def matches(given: str | None, token: str) -> bool:
    """Constant-time comparison, so a wrong guess's timing says nothing about the right one."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def cookie_name(port: int) -> str:
    """Browsers share cookies across ports, so two web views on one host each keep their own."""
    return f"homegpu_web_{port}"


def token_middleware(token: str, port: int) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """An aiohttp middleware that lets through only requests that carry `token` (query or cookie)."""
    cookie = cookie_name(port)

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        if matches(request.query.get(QUERY), token):
            if websocket or request.method not in ("GET", "HEAD"):
                return await handler(request)
            return _enter(request, cookie, token)
        if not matches(request.cookies.get(cookie), token):
            return web.Response(status=401, text=REFUSED, headers={"Cache-Control": "no-store"})
        if websocket and not _same_origin(request):
            # SameSite counts every port of a host as one site: another page served from this host must
            # not drive the app through the cookie the browser holds for this one
            return web.Response(status=403, text="homegpu web view: a websocket from another page\n")
        return await handler(request)

    return require_token


def _enter(request: web.Request, cookie: str, token: str) -> web.Response:
    """The redirect that trades the token in the address for the cookie."""
    response = web.Response(status=302, headers={
        "Location": str(request.rel_url.without_query_params(QUERY)), "Cache-Control": "no-store",
        "Referrer-Policy": "no-referrer"})
    response.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
    return response


def _same_origin(request: web.Request) -> bool:
    """A browser's websocket says which page opened it (Origin); other clients send none."""
    origin = request.headers.get("Origin")
    return origin is None or urlsplit(origin).netloc.lower() == request.host.lower()
