"""The tools file: what a good one gives, and what each mistake says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.cli import main
from tools.toolset import builtin_names
from tools.toolsfile import ToolsFileError, load_tools_file, parse_tools_file

NAMES = builtin_names()
WEATHER = """
[http.weather]
url = "https://weather.example/${REGION}/tool"
description = "Forecast."
parameters = { type = "object", properties = { city = { type = "string" } } }
headers = { Authorization = "Bearer ${TOKEN}" }
"""


def parse(text: str, env: dict[str, str] | None = None):
    return parse_tools_file(text, "t.toml", env=env or {}, builtin_names=NAMES)


def test_a_good_file_is_read_with_env_substituted(tmp_path: Path) -> None:
    text = '[builtin]\nenable = ["read", "shell"]\n[mcp.calc]\ncommand = ["python3", "s.py"]\n'
    tools = parse(text + WEATHER, {"TOKEN": "abc", "REGION": "eu"})
    assert tools.builtins == ("read", "shell")
    [calc] = tools.mcp
    # python3 is the gateway's own interpreter (its venv has the mcp SDK the server needs).
    assert calc.command == (sys.executable, "s.py") and calc.timeout == 30.0
    [weather] = tools.http
    assert weather.url == "https://weather.example/eu/tool"
    assert weather.headers == {"Authorization": "Bearer abc"} and weather.timeout == 10.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[mcp.calc\n", "t.toml: not valid TOML"),
        ("[tools.x]\n", "unknown section [tools]; use [builtin], [mcp.NAME] or [http.NAME]"),
        ('[mcp.calc]\ncommand = ["x"]\nretry = 1\n', "[mcp.calc] retry: unknown key"),
        ('[mcp.calc]\ncommand = "python3 s.py"\n', "[mcp.calc] command: must be a non-empty list"),
        ('[mcp.calc]\ncommand = ["x"]\nurl = "http://h/mcp"\n', "[mcp.calc]: give exactly one of"),
        ("[mcp.calc]\n", "[mcp.calc]: give exactly one of"),
        ('[mcp.calc]\nurl = "ftp://h"\n', "[mcp.calc] url: must be an http:// or https:// URL"),
        (
            '[mcp.calc]\ncommand = ["x"]\ntimeout = "soon"\n',
            "[mcp.calc] timeout: must be a positive",
        ),
        ('[mcp."a.b"]\ncommand = ["x"]\n', "[mcp.a.b]: the name must be"),
        (
            '[builtin]\nenable = ["read", "rm"]\n',
            "[builtin] enable: there is no built-in tool 'rm'",
        ),
        ('[builtin]\nenable = ["read", "read"]\n', "[builtin] enable: lists a tool twice"),
        (WEATHER, "[http.weather] url: the environment variable REGION is not set"),
        (
            WEATHER.replace('{ city = { type = "string" } }', '{ city = { type = "strin" } }'),
            '[http.weather] parameters: at #/properties/city/type: "strin" is not a type',
        ),
        (
            WEATHER.replace('type = "object", ', 'type = "array", '),
            "[http.weather] parameters: the parameters schema must describe an object",
        ),
        (
            '[http.read]\nurl = "http://h"\ndescription = "d"\nparameters = {}\n',
            "[http.read]: a built-in tool is already named 'read'",
        ),
        ('[http.w]\nurl = "http://h"\nparameters = {}\n', "[http.w] description: is missing"),
        (  # tomllib recurses per level: a RecursionError traceback before
            '[http.w]\nurl = "http://h"\nparameters = ' + "{a = " * 500 + "1" + "}" * 500,
            "t.toml: its tables or arrays nest too deeply to read",
        ),
    ],
)
def test_each_mistake_names_file_section_and_key(text: str, message: str) -> None:
    with pytest.raises(ToolsFileError) as info:
        parse(text, {"TOKEN": "x"})
    assert message in str(info.value)
    assert str(info.value).startswith("tools file t.toml")


def test_an_unreadable_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ToolsFileError, match=r"cannot be read .* --tools / GATEWAY_TOOLS"):
        load_tools_file(tmp_path / "nope.toml", builtin_names=NAMES)


def test_gateway_serve_prints_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "tools.toml"
    bad.write_text('[mcp.calc]\ncommand = ["x"]\nretry = 1\n')
    code = main(["serve", "--port", "0", "--tools", str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"gateway: tools file {bad}, [mcp.calc] retry: unknown key")
    assert "Traceback" not in err


def test_require_approval_is_read_per_section_and_checked() -> None:
    tools = parse(
        '[builtin]\nrequire_approval = ["write"]\n\n'
        '[http.pay]\nurl = "http://127.0.0.1:1/pay"\ndescription = "Pay."\n'
        'parameters = { type = "object" }\nrequire_approval = true\n\n'
        '[mcp.bank]\ncommand = ["python3", "bank.py"]\nrequire_approval = true\n'
    )
    assert tools.builtin_approval == ("write",)
    assert tools.http[0].require_approval and tools.mcp[0].require_approval
    with pytest.raises(ToolsFileError, match=r"\[http.pay\] require_approval: must be true"):
        parse(
            '[http.pay]\nurl = "http://127.0.0.1:1/pay"\ndescription = "Pay."\n'
            'parameters = { type = "object" }\nrequire_approval = "yes"\n'
        )
    with pytest.raises(ToolsFileError, match="no built-in tool 'pay'"):
        parse('[builtin]\nrequire_approval = ["pay"]\n')
