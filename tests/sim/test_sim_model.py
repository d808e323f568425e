"""The simulated model's replies, its knobs and its command-line flags."""

from __future__ import annotations

import pytest

from gateway.cli import build_parser
from gateway.common.settings import flag_values, load
from gateway.config import Config, load_config
from gateway.sim.model import SimConfig, sim_reply
from protocol.assembly import results_message


def test_echo() -> None:
    assert sim_reply("hi") == "<think>The user said something.</think>Echo: hi<end>"
    # Asked to answer before anyone spoke (a reply): it speaks first.
    assert sim_reply("") == "<think>Nobody has spoken yet.</think>Hello! How can I help?<end>"


def test_tool_call() -> None:
    call = (
        "<think>I should call write.</think>\n"
        '<execute>\n[{"name": "write", "args": {"file": "a", "content": "</execute>"}}]\n</execute>'
    )
    message = '/tool write {"file": "a", "content": "</execute>"}'
    assert sim_reply(message, overrun=False) == call
    with_overrun = sim_reply(message)
    assert with_overrun.startswith(call)
    assert "<results>" in with_overrun[len(call) :]


def test_tool_call_args_are_verbatim() -> None:
    assert '"args": {broken}' in sim_reply("/tool read {broken}", overrun=False)
    assert '"args": {}' in sim_reply("/tool list", overrun=False)
    # "/tool" without a name, or glued to other text, is just a message.
    assert sim_reply("/tool").endswith("Echo: /tool<end>")
    assert sim_reply("/toolbox x").endswith("Echo: /toolbox x<end>")


def test_results_quote_the_first_status() -> None:
    message = results_message(
        '[{"tool": "a", "status": "failure", "content": "x"}, {"tool": "b", "status": "success"}]'
    )
    assert sim_reply(message.content) == (
        "<think>The tool answered.</think>The tool returned failure.<end>"
    )
    for bad in ("<results>[]</results>", "<results>{}</results>", "<results>[1", "<results>[{}]"):
        assert sim_reply(bad).endswith("The results were unreadable.<end>")


def test_raw() -> None:
    assert sim_reply("/raw <think>a</think>b<end>") == "<think>a</think>b<end>"
    assert sim_reply("/raw") == ""
    assert sim_reply("/rawx").endswith("Echo: /rawx<end>")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        SimConfig(chunk_size=0)
    with pytest.raises(ValueError, match="tokens_per_second"):
        SimConfig(tokens_per_second=-1)
    with pytest.raises(ValueError, match="drop_after"):
        SimConfig(drop_after=-1)


def sim_flags(*argv: str) -> SimConfig:
    """The ``SimConfig`` of ``gateway sim ARGV``, as the command builds it."""
    return load(SimConfig, flag_values(build_parser().parse_args(["sim", *argv]), SimConfig))


def test_command_line_flags() -> None:
    assert sim_flags() == SimConfig()
    args = [
        "--tokens-per-second",
        "25",
        "--chunk-size",
        "2",
        "--first-token-delay",
        "0.5",
        "--drop-after",
        "10",
        "--no-overrun",
        "--api-key",
        "k",
    ]
    assert sim_flags(*args) == SimConfig(
        tokens_per_second=25,
        chunk_size=2,
        first_token_delay=0.5,
        drop_after=10,
        overrun=False,
        api_key="k",
    )
    with pytest.raises(SystemExit):
        sim_flags("--chunk-size", "0")


def test_serve_takes_the_same_knobs_prefixed_and_from_the_environment() -> None:
    args = build_parser().parse_args(["serve", "--sim-api-key", "sim", "--sim-no-overrun"])
    config = load_config(flag_values(args, Config), env={"GATEWAY_SIM_CHUNK_SIZE": "3"})
    assert config.sim == SimConfig(api_key="sim", overrun=False, chunk_size=3)


def test_vad_flags() -> None:
    args = ["--vad-threshold", "1200", "--vad-silence-ms", "300", "--vad-min-speech-ms", "60"]
    assert sim_flags(*args) == SimConfig(
        vad_threshold=1200, vad_silence_ms=300, vad_min_speech_ms=60
    )
    with pytest.raises(SystemExit):
        sim_flags("--vad-silence-ms", "0")
