"""The house's rules, checked on the source: imports point one way and never loop.

An AST import graph of every module in ``protocol``, ``tools`` and ``gateway``,
counting every import statement wherever it stands: at module level, inside a
function (a lazy import is still a dependency) and under ``TYPE_CHECKING`` (a
cycle hidden there is still a cycle for a reader).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.source import parse

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "tools", "gateway")
# Which top-level package may import which.
ALLOWED = {"protocol": {"protocol"}, "tools": {"protocol", "tools"}, "gateway": set(PACKAGES)}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The project modules ``name`` imports (``from a import b`` counts ``a.b`` if it is one)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] not in PACKAGES:
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            if subs:
                yield from subs
            if len(subs) < len(node.names):
                yield target


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        name: {t for t in _imports(name, path, known) if t in known and t != name}
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.timeout(30)
def test_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.timeout(30)
def test_layers_point_one_way() -> None:
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in _graph().items()
        for dep in deps
        if dep.split(".")[0] not in ALLOWED[mod.split(".")[0]]
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(30)
def test_client_and_sim_import_no_server_code() -> None:
    """The client and the simulator are programs of their own: no edge or session code."""
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in _graph().items()
        if mod.startswith(("gateway.client", "gateway.sim"))
        for dep in deps
        if dep.startswith(("gateway.edge", "gateway.sessions", "gateway.store"))
    ]
    assert not wrong, "\n".join(wrong)


# Rooms on the lowest floor: several rooms stand on them (edge/ and upstream/ on
# wsfast; the server and the client library on common/), so they import nothing of
# ours; the console is files and their table, which the edge serves.
GROUND_FLOOR = ("gateway.wsfast", "gateway.common", "gateway.console")


def _within(mod: str, room: str) -> bool:
    return mod == room or mod.startswith(f"{room}.")


@pytest.mark.timeout(30)
def test_the_ground_floor_stands_on_nothing_of_ours() -> None:
    wrong = [
        f"{mod} imports {dep}"
        for room in GROUND_FLOOR
        for mod, deps in _graph().items()
        if _within(mod, room)
        for dep in deps
        if not _within(dep, room)
    ]
    assert not wrong, "\n".join(wrong)


# The client library and its programs (chat, loadtest) run on a user's machine
# against any gateway: they may stand on the protocol and on leaf modules, never
# on a server room (upstream, sessions, edge, store, sim, the node's assembly, nor
# a plain module of gateway/ such as config or metrics): what both sides need lives
# in gateway/common/, the ground floor.
CLIENT_MAY_IMPORT = ("protocol", "gateway.client", "gateway.common")


@pytest.mark.timeout(30)
def test_the_client_imports_no_server_room() -> None:
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in _graph().items()
        if _within(mod, "gateway.client")
        for dep in deps
        if not any(_within(dep, room) for room in CLIENT_MAY_IMPORT)
    ]
    assert not wrong, "\n".join(wrong)


# The edge reaches the node through its port (``gateway.sessions.port``) and the
# seam of connections (``subscriber``): the vocabulary of commands, limits, policy,
# setup refusals and control messages, never the node, a runtime, a follower or a
# store class; of the store, only the interfaces (``gateway.store.base``). The phone
# room drives sessions too: the edge reaches it through ``gateway.edge.media_streams``.
EDGE_MAY_IMPORT_OF_SESSIONS = (
    "gateway.sessions.port",
    "gateway.sessions.subscriber",
    "gateway.sessions.commands",
    "gateway.sessions.limits",
    "gateway.sessions.policy",
    "gateway.sessions.setup",
    "gateway.sessions.control",
    "gateway.store.base",
)


@pytest.mark.timeout(30)
def test_the_edge_reaches_the_node_through_its_port() -> None:
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in _graph().items()
        if _within(mod, "gateway.edge")
        for dep in deps
        if dep.startswith(("gateway.sessions", "gateway.store", "gateway.phone"))
        and not any(_within(dep, room) for room in EDGE_MAY_IMPORT_OF_SESSIONS)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(30)
def test_few_plain_modules_in_gateway() -> None:
    plain = sorted(p.name for p in (ROOT / "gateway").glob("*.py") if p.name != "__init__.py")
    assert len(plain) <= 14, f"{len(plain)} plain modules in gateway/: {plain}"


def _room(mod: str) -> str:
    """A module's room: ``protocol`` and ``tools`` whole, in ``gateway`` a folder or a plain module."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if parts[0] == "gateway" else parts[0]


def _rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        rooms.setdefault(_room(mod), set()).update(_room(d) for d in deps if _room(d) != _room(mod))
    return rooms


@pytest.mark.timeout(30)
def test_rooms_stand_in_floors_with_no_arrow_up() -> None:
    """Rooms (folders and plain modules) import one way: no room imports one that stands on it.

    Two modules can avoid a cycle while their rooms make one (config.py reading a
    settings module in phone/, whose calls stand on sessions/, which reads config):
    the reader then cannot tell which room is the lower.
    """
    cycle = _cycle(_rooms(_graph()))
    assert cycle is None, "rooms import in a circle (an arrow up): " + " -> ".join(cycle or [])


@pytest.mark.timeout(30)
def test_the_checker_sees_an_arrow_up_between_rooms() -> None:
    graph = {"gateway.config": {"gateway.phone.settings"}, "gateway.phone.settings": set()}
    graph |= {"gateway.phone.call": {"gateway.sessions.node"}}
    graph |= {"gateway.sessions.node": {"gateway.config"}}
    assert _cycle(graph) is None
    assert _cycle(_rooms(graph)) == [
        "gateway.config",
        "gateway.phone",
        "gateway.sessions",
        "gateway.config",
    ]


@pytest.mark.timeout(30)
def test_the_checker_sees_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
