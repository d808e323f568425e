"""Every error code a client can get is documented, and none leaks upstream secrets."""

from __future__ import annotations

import ast
import re
import socket
import typing
from pathlib import Path

import msgspec

from protocol.events import Error, ErrorCode
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient
from tests.support.source import parse

ROOT = Path(__file__).resolve().parents[2]
# Where client-visible events are made; the simulator and the adapters speak
# the providers' own error codes, which never reach a client as such.
CLIENT_FACING = ["protocol", "gateway/edge", "gateway/sessions", "gateway/app.py"]


def _documented() -> set[str]:
    protocol = (ROOT / "docs" / "protocol.md").read_text()
    table = protocol.split("Error codes:", 1)[1].split("\n\n", 2)[1]
    return set(re.findall(r"^\| `([a-z_]+)`", table, re.M)) - {"code"}  # the header


def _sent() -> set[str]:
    """String codes given to ``Error(code=…)`` or to the limits' ``_refuse(code, …)``."""
    codes: set[str] = set()
    for place in CLIENT_FACING:
        path = ROOT / place
        for file in [path] if path.is_file() else path.rglob("*.py"):
            for node in ast.walk(parse(file.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name == "Error":
                    for kw in node.keywords:
                        if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                            codes.add(kw.value.value)
                elif (
                    name == "_refuse"  # limits' error replies (admission's are HTTP reasons)
                    and file.name != "admission.py"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    codes.add(node.args[0].value)
    return codes


def test_the_protocol_doc_table_lists_exactly_the_error_codes() -> None:
    declared = set(typing.get_args(ErrorCode))
    assert _documented() == declared, (
        "docs/protocol.md's 'Error codes' table and protocol.events.ErrorCode differ: "
        f"undocumented {sorted(declared - _documented())}, "
        f"not in ErrorCode {sorted(_documented() - declared)}"
    )


def test_every_code_the_gateway_sends_is_declared() -> None:
    sent = _sent()
    assert {"turn_active", "quota_exceeded", "store"} <= sent  # the scan finds them
    assert sent <= set(typing.get_args(ErrorCode)), sorted(sent - set(typing.get_args(ErrorCode)))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_upstream_tells_the_client_without_its_url_or_key(
    gateway_factory: GatewayFactory,
) -> None:
    port = _closed_port()
    settings = {
        "provider": "openai",
        "openai_base_url": f"ws://127.0.0.1:{port}/v1?key=SECRET",
        "openai_api_key": "sk-SECRET-KEY",
        "upstream_retries": 0,
    }
    async with gateway_factory(**settings) as gw:
        client = await GatewayClient.connect(gw.url)
        events = await client.turn("hello")
        errors = [e for e in events if isinstance(e, Error)]
        assert [e.code for e in errors] == ["upstream"]
        assert "unreachable" in errors[0].content and "again" in errors[0].content
        for event in events:
            # Every field but the clock's: a timestamp's digits once held the port's.
            fields = msgspec.structs.asdict(event)
            fields.pop("timestamp", None)
            text = repr(fields)
            assert "SECRET" not in text and str(port) not in text, text
        await client.close()
