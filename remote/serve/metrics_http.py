"""The HTTP endpoint Prometheus scrapes: GET /metrics on the serve process's own event loop (aiohttp), so a
scrape reads the nodes' latest stats where they live, with no thread and no lock."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

# The text format every Prometheus 2.x reads (Debian's 2.42 included); what generate_latest writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsEndpoint:
    """Serves `collector` at http://HOST:PORT/metrics; start() returns the URL, close() stops it."""

    def __init__(self, collector: Collector, host: str = "127.0.0.1", port: int = 9469) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Raises OSError when the port cannot be bound (in use, or not an address of this machine)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        self.port = self._runner.addresses[0][1]  # the port the system chose for port 0
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE})
