"""HTTP tools: a call is one POST of ``{"args", "session_id", "call_id"}`` to a URL.

The client is ``httpx2``, the fork of httpx the ``mcp`` SDK itself depends on:
one well-kept async client (connection pooling, HTTP/1.1 keep-alive, per-request
timeouts) is already in the dependency tree, so HTTP tools add nothing to it,
and aiohttp would be a second HTTP stack doing the same job. One client is
shared by every HTTP tool of a node, so calls reuse connections.

A 2xx answer with a JSON body is the tool's output; any other status, a body
that is not JSON, a refused connection or a timeout is a ``failure`` result
that says which, with the status and the start of the body, so the model (and
whoever reads the log) sees what the endpoint said.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

import httpx2

from tools.base import ToolContext, ToolFailure
from tools.described import DescribedTool
from tools.providers.specs import HttpToolSpec

__all__ = ["HttpTool", "HttpToolSpec", "http_client"]

_BODY_SHOWN: Final = 300


def http_client() -> httpx2.AsyncClient:
    """The shared client: no redirects (a tool URL is configured, not discovered), no proxies from the environment."""
    return httpx2.AsyncClient(follow_redirects=False, trust_env=False)


class HttpTool(DescribedTool):
    """A tool served by an HTTP endpoint."""

    def __init__(self, spec: HttpToolSpec, client: httpx2.AsyncClient) -> None:
        super().__init__(spec.name, spec.description, spec.parameters)
        self.spec = spec
        self._client = client

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        spec = self.spec
        body = {"args": args, "session_id": ctx.session_id, "call_id": uuid.uuid4().hex}
        try:
            response = await self._client.post(
                spec.url, json=body, headers=dict(spec.headers), timeout=spec.timeout
            )
        except httpx2.TimeoutException:
            raise ToolFailure(
                f"{spec.name!r} did not answer within {spec.timeout:g}s; "
                "try again later or ask for less at once"
            ) from None
        except httpx2.HTTPError as exc:
            raise ToolFailure(
                f"{spec.name!r} could not be reached ({type(exc).__name__}: {exc or 'no detail'}); "
                "the service may be down: try again later or do without it"
            ) from None
        text = response.text
        if not 200 <= response.status_code < 300:
            raise ToolFailure(f"{spec.name!r} answered HTTP {response.status_code}: {_start(text)}")
        try:
            return json.loads(text)
        except ValueError:
            raise ToolFailure(
                f"{spec.name!r} answered HTTP {response.status_code} but its body is not JSON: "
                f"{_start(text)}. This is a fault in the tool's service, not in your call"
            ) from None


def _start(text: str) -> str:
    text = text.strip()
    if not text:
        return "(empty body)"
    return text if len(text) <= _BODY_SHOWN else text[:_BODY_SHOWN] + "…"
