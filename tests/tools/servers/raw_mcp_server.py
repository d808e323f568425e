"""A stdio MCP server without the SDK, to write what an SDK server never would.

The SDK's servers put ``id`` before ``result`` and keep a tool's stray
output off the protocol stream, so the other shapes an overlong line can take
need a server that writes its own JSON-RPC lines. It speaks the legacy
handshake (``server/discover`` is refused, so the client falls back to
``initialize``) and has one tool, ``emit``, whose ``shape`` says what it
writes for ``megabytes`` MB of text:

- ``id_last``: the answer with ``id`` as its last member (the TypeScript
  SDK's order: ``{"result": …, "jsonrpc": "2.0", "id": N}``);
- ``anonymous``: first a stray answer that names no request, then the answer;
- ``notice``: first a huge notification, then the answer;
- ``blocks``: an answer of 35,000 one-character text blocks (under 1 MiB);
- ``deep``: an answer nested 400 levels deep (under 1 MiB);
- ``malformed``: an answer whose ``content`` is no list;
- ``flood``: first 30,000 log notifications and 30,000 lines that are not JSON,
  then the answer;
- anything else: a short answer.

``RAW_MCP_LISTING`` makes its ``tools/list`` hostile: ``many`` lists 200 more tools
and three past the limits (a 100,000-character description, a schema 40 levels
deep, one of 50 kB); ``endless`` gives a page of one tool and a next cursor forever;
``hostile`` adds tools whose schemas a backtracking checker cannot take: ``redos`` (a
``pattern`` of nested quantifiers), ``expo`` (``anyOf``s 30 levels deep through ``$ref``),
``loop`` (a ``$ref`` loop).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_TOOL = {
    "name": "emit",
    "description": "Write an answer of a given shape and size.",
    "inputSchema": {
        "type": "object",
        "properties": {"shape": {"type": "string"}, "megabytes": {"type": "integer"}},
        "required": ["shape", "megabytes"],
    },
}


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _listing(cursor: str | None) -> dict[str, Any]:
    how = os.environ.get("RAW_MCP_LISTING", "")
    if how == "endless":
        page = int(cursor or 0)
        tool = {**_TOOL, "name": f"page{page}"}
        return {"tools": [tool], "nextCursor": str(page + 1)}
    if how == "hostile":
        return {"tools": [_TOOL, *_hostile()]}
    if how != "many":
        return {"tools": [_TOOL]}
    long = {**_TOOL, "name": "long", "description": "d" * 100_000}
    deep = {**_TOOL, "name": "deep", "inputSchema": _deep(40)}
    props = {f"p{n}": {"type": "string", "description": "x" * 500} for n in range(100)}
    big = {**_TOOL, "name": "big", "inputSchema": {"type": "object", "properties": props}}
    more = [{**_TOOL, "name": f"t{n}"} for n in range(200)]
    return {"tools": [_TOOL, long, deep, big, *more]}


def _hostile() -> list[dict[str, Any]]:
    redos = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    defs: dict[str, Any] = {"d0": {"type": "string"}}
    for n in range(1, 30):
        defs[f"d{n}"] = {"anyOf": [{"$ref": f"#/$defs/d{n - 1}"}, {"$ref": f"#/$defs/d{n - 1}"}]}
    expo = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d29"}}}
    loop = {
        "type": "object",
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "properties": {"x": {"$ref": "#/$defs/a"}},
    }
    return [
        {"name": "redos", "inputSchema": redos},
        {"name": "expo", "inputSchema": expo},
        {"name": "loop", "inputSchema": loop},
    ]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def emit(rid: Any, shape: str, megabytes: int) -> None:
    filler = "z" * (megabytes * 1_000_000)
    if shape == "id_last":
        sys.stdout.write(
            json.dumps({"result": text_result(filler)})[:-1]
            + f', "jsonrpc": "2.0", "id": {json.dumps(rid)}}}\n'
        )
        sys.stdout.flush()
        return
    if shape == "blocks":
        blocks = [{"type": "text", "text": "x"}] * 35_000
        answer = {"jsonrpc": "2.0", "id": rid, "result": {"content": blocks}}
        sys.stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")  # 945 KB
        sys.stdout.flush()
        return
    if shape == "deep":
        nested = "[" * 400 + "]" * 400
        sys.stdout.write(f'{{"jsonrpc": "2.0", "id": {json.dumps(rid)}, "result": {nested}}}\n')
        sys.stdout.flush()
        return
    if shape == "malformed":
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": "notalist"}})
        return
    if shape == "flood":
        note = {"jsonrpc": "2.0", "method": "notifications/message"}
        line = json.dumps({**note, "params": {"level": "info", "data": "x"}}) + "\n"
        sys.stdout.write((line + "not json\n") * 30_000)
    if shape == "anonymous":
        send({"jsonrpc": "2.0", "result": text_result(filler)})
    elif shape == "notice":
        send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": "info", "data": filler},
            }
        )
    send({"jsonrpc": "2.0", "id": rid, "result": text_result(f"emitted {shape}")})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, rid = message.get("method"), message.get("id")
        if rid is None:
            continue  # a notification
        if method == "initialize":
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "protocolVersion": message["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "raw", "version": "0"},
                    },
                }
            )
        elif method == "tools/list":
            cursor = (message.get("params") or {}).get("cursor")
            send({"jsonrpc": "2.0", "id": rid, "result": _listing(cursor)})
        elif method == "tools/call":
            args = message["params"]["arguments"]
            if message["params"]["name"] != "emit":  # the hostile listing's tools
                send({"jsonrpc": "2.0", "id": rid, "result": text_result("called")})
                continue
            emit(rid, args["shape"], args["megabytes"])
        else:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32601, "message": "Method not found"},
                }
            )


if __name__ == "__main__":
    main()
