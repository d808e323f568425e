"""The official ``google-genai`` SDK's live client talks to the Gemini simulator.

The SDK always connects with ``wss://`` (it rewrites the base URL's scheme),
so the simulator serves TLS with a throwaway self-signed certificate, and the
client trusts it through ``http_options.async_client_args["ssl"]``. The SDK
turns frames into its models leniently, so every raw frame it receives is
also validated strictly — ``LiveServerMessage.model_validate_json(strict=True)``,
whose models forbid extra fields — so a misspelt or invented field in the
simulator fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google import genai
from google.genai import errors, live, types

from gateway.sim.gemini import GeminiSim
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim

from .helpers import STEP_TIMEOUT

# TEXT output: the simulator's own model (every current Live model answers in audio only,
# and the simulator refuses TEXT for them as the service does: test_gemini_models.py).
MODEL = "sim"
CONFIG = types.LiveConnectConfig(
    response_modalities=[types.Modality.TEXT], system_instruction="Be brief."
)


class TLS:
    """A self-signed certificate for 127.0.0.1: a server context and a client one trusting it."""

    def __init__(self, directory: Path) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        cert_file, key_file = directory / "cert.pem", directory / "key.pem"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        self.server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server.load_cert_chain(cert_file, key_file)
        self.client = ssl.create_default_context(cafile=str(cert_file))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLS:
    return TLS(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def frames(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes | str]]:
    """Every raw frame the SDK's live client receives (setupComplete included)."""
    received: list[bytes | str] = []
    real_connect = getattr(live, "ws_connect")  # noqa: B009 - not re-exported

    @contextlib.asynccontextmanager
    async def recording_connect(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with real_connect(*args, **kwargs) as ws:
            recv = ws.recv

            async def recording_recv(*a: Any, **k: Any) -> Any:
                data = await recv(*a, **k)
                received.append(data)
                return data

            ws.recv = recording_recv
            yield ws

    monkeypatch.setattr(live, "ws_connect", recording_connect)
    yield received


def strict(raw: bytes | str) -> types.LiveServerMessage:
    return types.LiveServerMessage.model_validate_json(raw, strict=True)


@contextlib.asynccontextmanager
async def gemini_sim(tls: TLS, **knobs: Any) -> AsyncIterator[GeminiSim]:
    async with serve_sim(SimConfig(flavor="gemini", **knobs), ssl=tls.server) as sim:
        assert isinstance(sim, GeminiSim)
        yield sim


def client(sim: GeminiSim, tls: TLS, api_key: str = "test") -> genai.Client:
    # The Gemini API serves Live on v1beta (the SDK's default version is not it).
    http_options = types.HttpOptions(
        base_url=sim.http_url, api_version="v1beta", async_client_args={"ssl": tls.client}
    )
    return genai.Client(api_key=api_key, http_options=http_options)


async def bounded(messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``async for`` with a per-message timeout."""
    iterator = messages.__aiter__()
    while True:
        try:
            async with asyncio.timeout(STEP_TIMEOUT):
                message = await iterator.__anext__()
        except StopAsyncIteration:
            return
        yield message


def user(text: str) -> list[types.Content | types.ContentDict]:
    return [types.Content(role="user", parts=[types.Part(text=text)])]


async def test_sdk_text_turn(tls: TLS, frames: list[bytes | str]) -> None:
    messages: list[types.LiveServerMessage] = []
    async with (
        gemini_sim(tls, chunk_size=5, api_key="test") as sim,
        client(sim, tls).aio.live.connect(model=MODEL, config=CONFIG) as session,
    ):
        await session.send_client_content(turns=user("hello sdk"), turn_complete=True)
        async for message in bounded(session.receive()):
            messages.append(message)
        [conversation] = sim.conversations()
    text = "<think>The user said something.</think>Echo: hello sdk<end>"
    assert "".join(m.text for m in messages if m.text) == text
    chunks = [m for m in messages if m.server_content and m.server_content.model_turn]
    assert all(len(m.text or "") <= 5 for m in chunks)
    assert messages[-2].server_content is not None
    assert messages[-2].server_content.generation_complete is True
    last = messages[-1]
    assert last.server_content is not None
    assert last.server_content.turn_complete is True
    assert last.usage_metadata is not None
    assert last.usage_metadata.response_token_count == len(chunks)
    assert last.usage_metadata.total_token_count == (
        (last.usage_metadata.prompt_token_count or 0) + len(chunks)
    )
    # Strictly valid, and the same as what the SDK made of each frame.
    assert strict(frames[0]).setup_complete is not None
    assert [strict(raw) for raw in frames[1:]] == messages
    assert conversation.instructions == "Be brief."
    assert conversation.messages() == [("user", "hello sdk"), ("model", text)]


async def test_sdk_sees_interruption_and_go_away(tls: TLS, frames: list[bytes | str]) -> None:
    messages: list[types.LiveServerMessage] = []
    async with (
        gemini_sim(tls, tokens_per_second=50, chunk_size=1, go_away_after=1) as sim,
        client(sim, tls).aio.live.connect(model=MODEL, config=CONFIG) as session,
    ):
        await session.send_client_content(turns=user("/raw " + "z" * 500), turn_complete=True)
        interrupted = False
        async for message in bounded(session.receive()):
            messages.append(message)
            if message.server_content and message.server_content.model_turn and not interrupted:
                interrupted = True
                await session.send_client_content(turns=user("/raw ok"), turn_complete=True)
        [conversation] = sim.conversations()
    go_away = [m.go_away for m in messages if m.go_away]
    assert len(go_away) == 1
    assert go_away[0].time_left == "10s"
    flags = [m.server_content.interrupted for m in messages if m.server_content]
    assert flags.count(True) == 1
    after = messages[
        [m.server_content and m.server_content.interrupted for m in messages].index(True) :
    ]
    assert "".join(m.text for m in after if m.text) == "ok"
    assert [strict(raw) for raw in frames[1:]] == messages
    assert [(i.role, i.status) for i in conversation.items][1] == ("model", "incomplete")


async def test_sdk_wrong_key_is_an_api_error(tls: TLS) -> None:
    async with gemini_sim(tls, api_key="right") as sim:
        with pytest.raises(errors.APIError) as info:
            async with client(sim, tls, api_key="wrong").aio.live.connect(
                model=MODEL, config=CONFIG
            ):
                pass
    assert info.value.code == 1007
    assert "API key not valid" in str(info.value)
