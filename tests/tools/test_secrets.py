"""A tool's secrets scrubbed from its results (``tools.secrets``), and where they come from."""

from __future__ import annotations

from protocol.calls import ToolResult
from tests.tools.test_toolsfile import parse
from tools.secrets import Secrets, header_secrets

KEY = "k-live-0123456789"


def test_every_place_a_secret_can_hide_in_a_json_value_is_scrubbed() -> None:
    secrets = Secrets([("X-Api-Key", KEY)])
    content = {"echo": KEY, KEY: [1, f"quoted: {KEY}!"], "deep": [[{"x": KEY}]], "n": 3}
    assert secrets.scrub(content) == {
        "echo": "[redacted:X-Api-Key]",
        "[redacted:X-Api-Key]": [1, "quoted: [redacted:X-Api-Key]!"],
        "deep": [[{"x": "[redacted:X-Api-Key]"}]],
        "n": 3,
    }
    assert secrets.scrub(f"failed for {KEY}") == "failed for [redacted:X-Api-Key]"


def test_a_result_without_a_secret_is_returned_as_it_is() -> None:
    secrets = Secrets([("X-Api-Key", KEY)])
    result = ToolResult(tool="t", status="success", content={"fine": [1, 2]})
    assert secrets.scrub_result(result) is result
    assert not Secrets([])


def test_a_secret_that_needs_escaping_in_json_is_found() -> None:
    odd = 'pa"ss\\wörd-123'
    assert Secrets([("P", odd)]).scrub({"v": f"<{odd}>"}) == {"v": "<[redacted:P]>"}


def test_short_values_are_not_secrets_and_longer_ones_go_first() -> None:
    pairs = header_secrets([("Authorization", f"Bearer {KEY}"), ("X-Mode", "fast")])
    secrets = Secrets(pairs)
    assert secrets.values == (f"Bearer {KEY}", KEY)  # "fast" and "Bearer" are too short
    assert secrets.scrub([f"Bearer {KEY}", KEY]) == [
        "[redacted:Authorization]",
        "[redacted:Authorization]",
    ]


def test_the_tools_file_marks_headers_and_environment_values_secret() -> None:
    tools = parse(
        "[mcp.m]\ncommand = ['x']\nenv = { MODE = 'plain', KEY = '${MCP_KEY}' }\n\n"
        "[http.h]\nurl = 'https://h.example/?k=${URL_KEY}'\ndescription = 'd'\n"
        "parameters = { type = 'object' }\nheaders = { X-Api-Key = 'written-in-the-file' }\n",
        env={"MCP_KEY": "mcp-secret-value", "URL_KEY": "url-secret-value"},
    )
    [mcp] = tools.mcp
    assert mcp.secrets == (("MCP_KEY", "mcp-secret-value"),)  # not MODE: not from the environment
    [http] = tools.http
    assert set(http.secrets) == {
        ("URL_KEY", "url-secret-value"),
        ("X-Api-Key", "written-in-the-file"),
    }
