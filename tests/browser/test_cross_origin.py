"""An app's page on its own origin, importing the client from the gateway (issue 30).

The app's server here is Python's http.server on another port: another
origin. The gateway answers /client.js and /healthz with CORS headers for the
origins it admits, so the page imports the client straight from it; a page of
an origin it does not admit, a missing key and an unknown session are each
reported as what they are (a browser cannot read a refused handshake's status).
"""

from __future__ import annotations

import functools
import http.client
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, StartGateway
from tests.browser.test_page import _keys_file

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"
)

STATIC = Path(__file__).parents[2] / "gateway" / "console" / "static"

APP = """
const q = new URLSearchParams(location.search);
const { Client } = await import(q.get("client"));
const c = new Client(q.get("gw"), {
  token: q.get("token") || undefined,
  sessionId: q.get("session") || undefined,
  after: q.get("session") ? 0 : undefined,
  backoffInitial: 10,
});
try {
  await c.connect();
  let answer = "";
  for await (const ev of c.send("hello")) if (ev.type === "respond") answer += ev.content;
  document.body.dataset.result = answer;
} catch (err) {
  document.body.dataset.result = `${err.name} ${err.status} ${err.reason}`;
} finally {
  c.close();
}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def app_origins(tmp_path: Path) -> Iterator[list[str]]:
    """Two app servers (two origins) serving the app page and a copy of the client."""
    (tmp_path / "index.html").write_text(
        '<!doctype html><script type="module" src="app.mjs"></script>'
    )
    (tmp_path / "app.mjs").write_text(APP)
    for module in ("client.js", "errors.js", "socket.js"):  # the client and what it imports
        shutil.copy(STATIC / module, tmp_path / module)
    servers = []
    for _ in range(2):
        handler = functools.partial(_Quiet, directory=str(tmp_path))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def _result(browser: Browser, origin: str, **query: str) -> str:
    context = browser.new_context()
    page: Page = context.new_page()
    try:
        page.goto(f"{origin}/index.html?{urlencode(query)}")
        page.wait_for_function("() => document.body?.dataset.result !== undefined", timeout=20_000)
        return str(page.evaluate("() => document.body.dataset.result"))
    finally:
        context.close()


def test_a_page_of_an_allowed_origin_imports_the_client_from_the_gateway(
    browser: Browser, start_gateway: StartGateway, app_origins: list[str]
) -> None:
    allowed, other = app_origins
    node = start_gateway("--allowed-origins", allowed)
    ws = f"{node.base}/v1/realtime"
    # The README's line: import the client from the gateway itself.
    assert _result(browser, allowed, client=f"{node.http}/client.js", gw=ws) == "Echo: hello"
    # Another origin may not connect; it learns so (its own copy of the client).
    assert _result(browser, other, client="./client.js", gw=ws) == "RefusedError 403 origin"


def test_refusals_in_a_browser_say_what_they_are(
    browser: Browser, start_gateway: StartGateway, app_origins: list[str], tmp_path: Path
) -> None:
    allowed, _ = app_origins
    key = "rtgw_cross-origin"
    node = start_gateway(
        "--allowed-origins", allowed, "--api-keys-file", str(_keys_file(tmp_path, key))
    )
    client = f"{node.http}/client.js"
    ws = f"{node.base}/v1/realtime"
    assert _result(browser, allowed, client=client, gw=ws) == "RefusedError 401 key"
    assert (
        _result(browser, allowed, client=client, gw=ws, token="rtgw_wrong")
        == "RefusedError 401 key"
    )
    assert (
        _result(browser, allowed, client=client, gw=ws, token=key, session="no-such-session")
        == "RefusedError 404 session"
    )
    assert _result(browser, allowed, client=client, gw=ws, token=key) == "Echo: hello"


def _get(base: str, path: str, origin: str) -> http.client.HTTPResponse:
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    conn.request("GET", path, headers={"Origin": origin})
    return conn.getresponse()


def test_cors_headers_for_the_admitted_origins_only(
    start_gateway: StartGateway, app_origins: list[str]
) -> None:
    allowed, other = app_origins
    node = start_gateway("--allowed-origins", allowed)
    for path in ("/client.js", "/errors.js", "/socket.js", "/client.d.ts", "/healthz"):
        ok = _get(node.http, path, allowed)
        assert ok.status == 200 and ok.getheader("Access-Control-Allow-Origin") == allowed, path
        assert ok.getheader("Vary") == "Origin"
        refused = _get(node.http, path, other)
        assert refused.status == 200 and refused.getheader("Access-Control-Allow-Origin") is None
    # The console's own page and assets are for its own origin only.
    assert _get(node.http, "/", allowed).getheader("Access-Control-Allow-Origin") is None
