"""The documentation site in a real Chromium: its first page and the cluster.toml reference open, with the
headings a reader looks for (the headings are asserted, not the pixels; the screenshots are printed for a
person to look at)."""

from __future__ import annotations

import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
from playwright.sync_api import sync_playwright
from test_docs import build_site

REFERENCE_HEADINGS = ["[cluster]", "[[nodes]] (one table per machine)", "[jobs.NAME]", "[alerts]", "Mixed clusters",
                      "Validation"]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture
def site(tmp_path) -> Iterator[str]:
    """The built site, served over HTTP on a free loopback port; its base address."""
    built = build_site(tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(tmp_path / "site")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def headings(page, tag: str) -> list[str]:
    """The page's headings of `tag` as a reader sees them (the permalink's ¶ left out)."""
    texts = page.eval_on_selector_all(f"article {tag}", "nodes => nodes.map(node => node.innerText)")
    return [text.replace("¶", "").strip() for text in texts]


def test_the_first_page_and_the_reference_open_in_chromium(site, chromium, tmp_path: Path):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            elsewhere = []  # the site loads nothing from another host: it works on a LAN without internet
            page.on("request", lambda request: None if request.url.startswith(site) else elsewhere.append(request.url))
            page.goto(site + "/")
            assert headings(page, "h1") == ["homegpu"]
            assert "Where to read what" in headings(page, "h2")
            assert page.locator("article img[src$='tui-main.svg']").count() == 1
            page.screenshot(path=str(tmp_path / "docs-home.png"))
            page.goto(site + "/reference/")
            assert headings(page, "h1") == ["cluster.toml reference"]
            assert [h for h in headings(page, "h2") if h in REFERENCE_HEADINGS] == REFERENCE_HEADINGS
            assert page.locator("article table code", has_text="sleep_after").count() >= 1
            page.screenshot(path=str(tmp_path / "docs-reference.png"), full_page=True)
            print(f"screenshots: {tmp_path / 'docs-home.png'}, {tmp_path / 'docs-reference.png'}")
            assert elsewhere == [], "the site loaded from another host"
        finally:
            browser.close()
