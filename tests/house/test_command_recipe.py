"""The recipe "Add a client command" (docs/architecture.md), tried on a copy of the code.

The recipe's five files, each edited where it says: (1) the message (and the
new event that confirms it) in protocol/events.py, in ``TurnCommand``; (2) the
machine's handler in protocol/turn.py; (3) its row in protocol/turn_table.py;
(4) its spec in gateway/sessions/commands.py ``COMMANDS``; (5) docs/protocol.md.
The example is ``note``: a client writes a line into the session's log, which
the machine confirms with a ``noted`` event in any state, the turn untouched.
Then, on the copy: the command table's, the vocabulary's and the turn table's
tests pass; a real gateway takes the command from a client and confirms it
with its ``id``; and the JS client's generated codes have nothing to change.
If a new command needs another edit, this fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.house.recipe_copy import ROOT, copy_rooms, edit, passed, run, run_tests

EVENT = '''class Noted(_Base, tag="noted"):
    """A client's note, in the session's log (the recipe's example)."""

    text: str
    reply_to: str | msgspec.UnsetType = msgspec.UNSET


'''

MESSAGE = '''class Note(msgspec.Struct, tag_field="type", tag="note", frozen=True):
    """Write ``text`` into the session's log; the model does not see it."""

    text: str
    id: CommandId | msgspec.UnsetType = msgspec.UNSET


'''

HANDLER = """    def _note(self, given: Note) -> Sequence[Action]:
        return [Noted(text=given.text)]

"""

ROW = """    _row(Note, lambda m, i: m._note(i),
         idle=stays, streaming=stays, stopping=stays, ending=stays,
         tools=stays, backoff=stays, cancelling=stays),
"""

# Through a real gateway, on the copy: between turns and during one.
THROUGH_A_GATEWAY = """
import pytest

from protocol.events import Cancelled, End, Noted, User
from tests.edge.conftest import GatewayFactory
from tests.support.client import GatewayClient


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_note_reaches_the_machine_and_is_confirmed(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(sim_tokens_per_second=100) as gw:
        client = await GatewayClient.connect(gw.url)
        await client.send({"type": "note", "text": "between turns", "id": "n-1"})
        [noted] = (await client.until(lambda e: isinstance(e, Noted)))[-1:]
        assert isinstance(noted, Noted) and (noted.text, noted.reply_to) == ("between turns", "n-1")

        await client.send({"type": "user", "content": "/long 4"})  # seconds of answer
        await client.until(lambda e: isinstance(e, User))
        await client.send({"type": "note", "text": "during a turn", "id": "n-2"})
        events = await client.until(lambda e: isinstance(e, Noted))
        assert not any(isinstance(e, End | Cancelled) for e in events)  # the turn goes on
        during = events[-1]
        assert isinstance(during, Noted) and during.reply_to == "n-2"
        await client.send({"type": "cancel"})
        await client.until(lambda e: isinstance(e, Cancelled))

        # Logged: another client of the session reads both in its replay.
        reader = await GatewayClient.connect(gw.url, session_id=client.sid, after=0)
        replayed = await reader.until(lambda e: isinstance(e, Noted) and e.reply_to == "n-2")
        notes = [e.text for e in replayed if isinstance(e, Noted)]
        assert notes == ["between turns", "during a turn"]
        await reader.close()
        await client.close()
"""


def _recipe(root: Path) -> None:
    # (1) the message, in TurnCommand, and the event that confirms it, in Event.
    events = root / "protocol/events.py"
    edit(events, 'class Pong(_Base, tag="pong"):', EVENT + 'class Pong(_Base, tag="pong"):')
    edit(events, "    | Approval\n    | Pong\n", "    | Approval\n    | Noted\n    | Pong\n")
    configure = 'class Configure(ConfigChange, frozen=True, tag_field="type", tag="configure"):'
    edit(events, configure, MESSAGE + configure)
    edit(events, "| Commit | Played\n", "| Commit | Played | Note\n")
    edit(events, '    "Metric",\n', '    "Metric",\n    "Note",\n    "Noted",\n')
    # (2) the machine's handler.
    turn = root / "protocol/turn.py"
    edit(turn, "    def _native_call(", HANDLER + "    def _native_call(")
    edit(turn, "    Metric,\n", "    Metric,\n    Note,\n    Noted,\n")
    # (3) its row in the turn table.
    table = root / "protocol/turn_table.py"
    edit(
        table,
        "from protocol.events import Respond, Think",
        "from protocol.events import Note, Respond, Think",
    )
    played_row = "_row(Played, lambda m, i: m.spoken.played(i.ms),\n"
    played_end = "tools=stays, backoff=stays, cancelling=stays),\n"
    text = table.read_text()
    at = text.index(played_end, text.index(played_row)) + len(played_end)
    table.write_text(text[:at] + ROW + text[at:])
    # (4) its spec.
    commands = root / "gateway/sessions/commands.py"
    edit(commands, "    Error,\n    Event,\n", "    Error,\n    Event,\n    Note,\n    Noted,\n")
    approve = '    Approve: CommandSpec("approve", _as_is, who="approver", confirms=Approval),\n'
    edit(commands, approve, approve + '    Note: CommandSpec("note", _as_is, confirms=Noted),\n')
    # (5) docs/protocol.md: the event, the command, the types a client may send.
    doc = root / "docs/protocol.md"
    approval = next(
        line for line in doc.read_text().splitlines() if line.startswith("| `approval` |")
    )
    edit(
        doc,
        approval + "\n",
        approval + "\n| `noted` | `text`, `reply_to`? | a client's `note` (logged) |\n",
    )
    edit(
        doc,
        'reports playback (see "Voice").\n',
        'reports playback (see "Voice");\n`{"type": "note", "text": "…"}` writes a line into the '
        "session's log, confirmed by a `noted` event (the model does not see it).\n",
    )
    edit(
        doc,
        "`commit`, `played` | send one of those |",
        "`commit`, `played`, `note` | send one of those |",
    )


@pytest.mark.timeout(120)
def test_a_command_is_the_five_files_of_its_recipe(tmp_path: Path) -> None:
    rooms = (
        "docs/protocol.md",
        "docs/architecture.md",
        "tests/sessions/__init__.py",
        "tests/sessions/test_commands.py",
        "tests/protocol/__init__.py",
        "tests/protocol/conftest.py",
        "tests/protocol/test_turn_events.py",
        "tests/protocol/test_turn_table.py",
        "tests/gateway/__init__.py",
        "tests/gateway/conftest.py",
        "tests/edge/__init__.py",
        "tests/edge/conftest.py",
    )
    root = copy_rooms(tmp_path, rooms)
    _recipe(root)
    (root / "tests/edge/test_note_command.py").write_text(THROUGH_A_GATEWAY)

    report = run_tests(
        root,
        "tests/sessions/test_commands.py",
        "tests/protocol/test_turn_events.py",
        "tests/protocol/test_turn_table.py",
        "tests/edge/test_note_command.py",
    )
    assert "failed" not in report and passed(report) >= 15, report[-2000:]
    # Nothing generated from the code changes: the JS client's codes, the turn's diagram
    # (the note moves no turn).
    errors_js = "gateway/console/static/errors.js"
    assert run(root, "-m", "gateway.client.js_codes") == ""
    assert (root / errors_js).read_text() == (ROOT / errors_js).read_text()
    assert run(root, "-m", "protocol.turn_table") in (ROOT / "docs/architecture.md").read_text()
