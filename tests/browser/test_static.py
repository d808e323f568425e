"""``gateway.console.static_response`` and the page's HTTP face on a real node (no browser)."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from gateway.console import CONTENT_SECURITY_POLICY, content_security_policy, static_response
from tests.browser.conftest import StartGateway


@pytest.mark.parametrize(
    ("path", "content_type", "marker"),
    [
        ("/", "text/html; charset=utf-8", b"<!doctype html>"),
        ("/static/app.js", "text/javascript; charset=utf-8", b"window.rtgw"),
        ("/static/style.css", "text/css; charset=utf-8", b":root"),
        ("/static/conversation.js", "text/javascript; charset=utf-8", b"class Conversation"),
        ("/static/inspector.js", "text/javascript; charset=utf-8", b"class Inspector"),
        ("/static/settings.js", "text/javascript; charset=utf-8", b"class Settings"),
        ("/static/openai-door.js", "text/javascript; charset=utf-8", b"class DoorClient"),
        ("/static/voice.js", "text/javascript; charset=utf-8", b"class Voice"),
        ("/static/markdown.js", "text/javascript; charset=utf-8", b"export function markdown"),
        ("/static/dom.js", "text/javascript; charset=utf-8", b"export function h"),
        ("/static/mic-worklet.js", "text/javascript; charset=utf-8", b"registerProcessor"),
        ("/static/recording.js", "text/javascript; charset=utf-8", b"export function timelineRows"),
        ("/client.js", "text/javascript; charset=utf-8", b"export class Client"),
        ("/errors.js", "text/javascript; charset=utf-8", b"export class ClientError"),
        ("/socket.js", "text/javascript; charset=utf-8", b"export function openSocket"),
        ("/client.d.ts", "text/plain; charset=utf-8", b"export class Client"),
    ],
)
def test_known_paths_are_served(path: str, content_type: str, marker: bytes) -> None:
    response = static_response(path)
    assert response is not None
    assert response.status_code == 200
    headers = response.headers
    assert headers["Content-Type"] == content_type
    assert headers["Cache-Control"] == "no-cache"
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Length"] == str(len(response.body))
    assert marker in response.body


@pytest.mark.parametrize(
    "path",
    [
        "/index.html.bak",
        "/static/",
        "/static/nope.js",
        "/static/../__init__.py",
        "/static/..%2f__init__.py",
        "/static//etc/passwd",
        "/static/app.js/",
        "/favicon.ico",
    ],
)
def test_other_paths_are_not_ours(path: str) -> None:
    assert static_response(path) is None


def test_csp_is_strict_but_allows_the_websocket() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval
    assert directives["connect-src"] == "'self' ws: wss:"
    assert directives["frame-ancestors"] == "'none'"


def _get(base: str, path: str) -> http.client.HTTPResponse:
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    conn.request("GET", path)  # http.client sends the path as is: no ".." folding
    return conn.getresponse()


def test_a_node_serves_the_page_and_404s_the_rest(start_gateway: StartGateway) -> None:
    node = start_gateway()
    page = _get(node.http, "/?session_id=x")
    assert page.status == 200
    assert page.getheader("Content-Security-Policy") == CONTENT_SECURITY_POLICY
    assert b'src="/static/app.js"' in page.read()
    script = _get(node.http, "/static/app.js")
    assert (script.status, script.getheader("Content-Type")) == (
        200,
        "text/javascript; charset=utf-8",
    )
    assert _get(node.http, "/static/../gateway/console/__init__.py").status == 404
    assert _get(node.http, "/healthz").status == 200  # the page did not shadow the API


def test_the_page_may_call_the_http_api_on_its_port_only() -> None:
    assert content_security_policy(None) == CONTENT_SECURITY_POLICY
    policy = content_security_policy(8766)
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["connect-src"] == "'self' ws: wss: http://*:8766 https://*:8766"
    assert directives["script-src"] == "'self'"


def test_node_json_says_what_the_node_offers(start_gateway: StartGateway) -> None:
    node = start_gateway("--api-port", "0")
    answer = _get(node.http, "/node.json")
    assert answer.status == 200 and answer.getheader("Content-Type") == "application/json"
    offer = json.loads(answer.read())
    assert offer["provider"] == "sim" and offer["auth"] is False
    assert [p["name"] for p in offer["providers"]] == ["sim"]
    assert offer["providers"][0]["default_model"] == "sim"
    assert isinstance(offer["api_port"], int) and offer["api_port"] > 0
    # A simulator node's OpenAI door serves every model a provider lists (its flavour).
    assert {"gpt-realtime-2.1", "gemini-3.8-live"} <= set(offer["door_models"])
    # The page's policy names that port, so the console may delete a session there.
    page = _get(node.http, "/")
    assert f"http://*:{offer['api_port']}" in (page.getheader("Content-Security-Policy") or "")
