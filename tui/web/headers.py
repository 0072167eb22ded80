"""The security headers on every answer of the web view: the page, its files, redirects, 401s and 403s.

The page runs an app with the user's cluster behind it, so it must not be framed by another site
(clickjacking), load anything from another host, or run anything but its own files: its scripts and
styles are files under /static/ (textual-serve's) and /page/ (homegpu's), never inline, except the one
style element textual.js adds, allowed by its hash. Its websocket goes back to its own origin ('self').
"""

from __future__ import annotations

import base64
import hashlib

from aiohttp import web

# the CSS textual.js (textual-serve 1.1) bundles and inserts at start as a <style> element, empty at
# first (an empty style does nothing: its hash is allowed too); the browser test sees any style or script
# the policy blocks, so a textual-serve that changes it is caught there
TEXTUAL_JS_STYLE = ("h1{color:#fff;background-color:#000}body{margin:0;padding:0}"
                    ".textual-terminal{width:100vw;height:100vh}")


def csp_hash(text: str) -> str:
    """A CSP hash source: the one inline text it names may run or apply, and no other."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",  # scripts, fonts, images, the websocket: this origin only
    f"style-src 'self' {csp_hash(TEXTUAL_JS_STYLE)} {csp_hash('')}",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
))
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the address may carry the token
}


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """An aiohttp on_response_prepare hook: it runs for every response, whoever made it."""
    response.headers.update(SECURITY_HEADERS)
