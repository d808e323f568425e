"""The JavaScript client as the npm package the repository ships (gateway/console/static).

``npm pack`` makes the tarball, a fresh project installs it (offline: the
package has no dependencies), and Node imports it by name, as the README
says, and runs a turn against a real gateway.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.gateway.conftest import GatewayFactory

PACKAGE = Path(__file__).parents[2] / "gateway" / "console" / "static"

pytestmark = pytest.mark.skipif(
    shutil.which("npm") is None or shutil.which("node") is None, reason="npm/node not installed"
)

SCRIPT = """
import { Client, RefusedError } from "realtime-gateway-client";
const c = new Client(process.env.GATEWAY_URL);
await c.connect();
let answer = "";
for await (const ev of c.send("hello")) if (ev.type === "respond") answer += ev.content;
c.close();
console.log(JSON.stringify({ answer, refused: typeof RefusedError }));
"""


async def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{out.decode()}"
    return out.decode()


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_npm_pack_installs_and_runs_under_node(
    gateway_factory: GatewayFactory, store_kind: str, tmp_path: Path
) -> None:
    manifest = json.loads((PACKAGE / "package.json").read_text())
    packed = tmp_path / "packed"
    packed.mkdir()
    await _run("npm", "pack", str(PACKAGE), "--pack-destination", str(packed), cwd=tmp_path)
    tarball = packed / f"{manifest['name']}-{manifest['version']}.tgz"
    assert tarball.exists(), list(packed.iterdir())
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    await _run("npm", "install", "--offline", "--no-audit", "--no-fund", str(tarball), cwd=app)
    installed = app / "node_modules" / manifest["name"]
    assert sorted(p.name for p in installed.iterdir()) == [
        "client.d.ts",
        "client.js",
        "errors.js",
        "package.json",
        "socket.js",
    ]
    (app / "main.mjs").write_text(SCRIPT)
    async with gateway_factory() as gw:
        out = await _run("node", "main.mjs", cwd=app, env={"GATEWAY_URL": gw.url})
    assert json.loads(out.strip().splitlines()[-1]) == {
        "answer": "Echo: hello",
        "refused": "function",
    }
