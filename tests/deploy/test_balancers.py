"""The shipped haproxy.cfg and nginx.conf in front of two real gateway nodes.

The configs run as written except for addresses: the compose service names
(gateway-1/2, port 8080) become the loopback ports of two ``gateway serve``
subprocesses sharing a real redis-server. Through the balancer a client runs
a turn, its node drains (SIGTERM), the client gets 1012 and resumes with
``after=SEQ`` on the other node, as docs/deploy.md promises.
"""

from __future__ import annotations

import http.client
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, binary, lb_backends, substitute_backends
from tests.support.client import GatewayClient, text_of
from tests.support.procs import NodeProcess
from tests.support.redis_server import free_port

pytestmark = pytest.mark.slow

NODES = ("gateway-1", "gateway-2")


class Cluster:
    def __init__(self, url: str, nodes: dict[str, NodeProcess]) -> None:
        self.url = url  # http://127.0.0.1:PORT of the balancer
        self.nodes = nodes

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/v1/realtime"


def _render(name: str, nodes: dict[str, NodeProcess], port: int, tmp: Path) -> str:
    text = (DEPLOY / name).read_text()
    addresses = {
        f"{host}:{p}": nodes[host].base.removeprefix("ws://") for host, p in lb_backends(text)
    }
    assert set(addresses) == {f"{n}:8765" for n in NODES}
    text = substitute_backends(text, addresses)
    if name == "haproxy.cfg":
        return re.sub(r"^(\s*bind\s+)\S+", rf"\g<1>127.0.0.1:{port}", text, flags=re.M)
    text = re.sub(r"^(\s*listen\s+)\d+;", rf"\g<1>127.0.0.1:{port};", text, flags=re.M)
    # Debian's nginx keeps temp files under /var/lib/nginx, writable by root only.
    temp = "".join(f"    {kind}_temp_path {tmp}/{kind};\n" for kind in ("client_body", "proxy"))
    return text.replace("http {\n", "http {\n" + temp, 1)


def _start_balancer(
    name: str, nodes: dict[str, NodeProcess], tmp: Path
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = tmp / name
    config.write_text(_render(name, nodes, port, tmp))
    if name == "haproxy.cfg":
        argv = [binary("haproxy"), "-db", "-f", str(config)]
    else:
        argv = [
            binary("nginx"),
            *("-p", f"{tmp}/", "-c", str(config), "-e", "stderr"),
            *("-g", f"daemon off; pid {tmp}/nginx.pid;"),
        ]
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    # A listening port has no event to await: poll it, with a deadline.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if _get(port, "/healthz").status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} did not come up:\n{(tmp / f'{name}.log').read_text()}")


def _get(port: int, path: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path)
    return conn.getresponse()


@pytest.fixture(params=["haproxy.cfg", "nginx.conf"])
def cluster(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    binary(request.param.split(".")[0])  # skip before starting anything
    nodes: dict[str, NodeProcess] = {}
    balancer: subprocess.Popen[bytes] | None = None
    try:
        for name in NODES:
            nodes[name] = NodeProcess(
                [
                    *("serve", "--port", "0", "--redis", redis_url),
                    *("--node-id", name, "--drain-timeout", "5"),
                ]
            ).start()
        balancer, port = _start_balancer(request.param, nodes, tmp_path)
        yield Cluster(f"http://127.0.0.1:{port}", nodes)
    finally:
        if balancer is not None:
            balancer.terminate()
            balancer.wait(10)
        for node in nodes.values():
            node.kill()


def test_the_page_is_served_through_the_balancer(cluster: Cluster) -> None:
    port = int(cluster.url.rsplit(":", 1)[1])
    page = _get(port, "/")
    assert page.status == 200
    assert "connect-src 'self' ws: wss:" in (page.getheader("Content-Security-Policy") or "")


async def test_a_session_moves_to_the_other_node_on_drain(cluster: Cluster) -> None:
    client = await GatewayClient.connect(cluster.ws)
    first = client.session.node
    assert first in NODES
    assert text_of(await client.turn("hello"), "respond") == "Echo: hello"

    cluster.nodes[first].terminate()  # SIGTERM: drain
    await client.ws.wait_closed()
    assert client.ws.close_code == 1012

    # The balancer sends the handshake to the node that is still up.
    resumed = await GatewayClient.connect(cluster.ws, session_id=client.sid, after=client.last_seq)
    try:
        assert resumed.session.resumed
        assert resumed.session.node != first
        events = await resumed.turn("again")
        assert events[0].seq == client.last_seq + 1  # the log continues: no gap, no reuse
        assert text_of(events, "respond") == "Echo: again"
    finally:
        await resumed.close()
    assert cluster.nodes[first].wait(20) == 0


@pytest.mark.parametrize("name", ["haproxy.cfg", "haproxy-api.cfg", "haproxy.local.cfg"])
def test_haproxys_health_check_request_is_answered_200_by_a_node(name: str, tmp_path: Path) -> None:
    """The exact request haproxy's ``http-check send`` makes, sent raw to a node: with
    haproxy's default HTTP/1.0 the node's parser refused it and, two checks after
    start, every node was DOWN ("no server available")."""
    import socket

    line = re.search(r"^\s*http-check send (.+)$", (DEPLOY / name).read_text(), re.M)
    assert line, f"{name} has no http-check send line"
    words = line.group(1).split()
    options = dict(zip(words[::2], words[1::2], strict=False))
    headers = "".join(
        f"{words[i + 1]}: {words[i + 2]}\r\n" for i, w in enumerate(words) if w == "hdr"
    )
    request = (
        f"{options.get('meth', 'OPTIONS')} {options.get('uri', '/')} "
        f"{options.get('ver', 'HTTP/1.0')}\r\n{headers}\r\n"
    )
    with NodeProcess(["serve", "--port", "0", "--workspace-root", str(tmp_path)]) as node:
        host, port = node.base.removeprefix("ws://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request.encode())
            answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), (request, answer[:200])
