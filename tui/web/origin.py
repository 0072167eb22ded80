"""Only the view's own page may open its websocket, which starts an app with the user's cluster.

A browser sends the cookie, and a page that learnt the token can put it in the address, so neither
says who opened the websocket: Origin does. A browser always sends it on a websocket and a page
cannot set it; nor can a page set Host, the address the browser opened, so the page's own origin is
`scheme://Host` as this server received it (through `ssh -L` that is not the address listened on).
X-Forwarded-* are never read: nothing proxies this view. A page can make Host and Origin agree on
its own site only by pointing that site's name at this machine (DNS rebinding), so a view listening
on the loopback takes websockets only from pages opened at a loopback address.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from homegpu.tui.web.token_gate import Handler, Middleware, is_websocket

FOREIGN = "homegpu web view: a websocket from another page\n"


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address; any other name resolves wherever its owner says."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def from_own_page(request: web.Request, loopback: bool) -> bool:
    """Whether a websocket request comes from the page this server served to the same address."""
    origin = request.headers.get("Origin")
    if origin is None or origin.lower() != f"{request.scheme}://{request.host}".lower():
        return False
    return not loopback or is_loopback(urlsplit(f"//{request.host}").hostname or "")


def origin_middleware(loopback: bool) -> Middleware:
    """An aiohttp middleware that answers 403 to every websocket upgrade not from the view's own page."""

    @web.middleware
    async def require_own_page(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_websocket(request) and not from_own_page(request, loopback):
            return web.Response(status=403, text=FOREIGN, headers={"Cache-Control": "no-store"})
        return await handler(request)

    return require_own_page
