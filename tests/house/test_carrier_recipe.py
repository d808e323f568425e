"""The recipe "Add a carrier" (docs/architecture.md), tried on a copy of the code.

A carrier whose media stream is Twilio's with other field names is its
``Naming`` in protocol/media_stream.py, its row in gateway/phone/carriers.py
``CARRIERS`` and its line in docs/phone.md's table. Its endpoint must then
answer a call that the carrier simulator makes with the same ``Naming``:
the ``start`` read in the carrier's names (the call's id), the answer's
audio sent in them, the simulator's mark echoes counted as talk time and its
``stop`` read as a hang-up. If a new carrier needs another edit, this fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.house.recipe_copy import copy_rooms, edit, passed, run_tests

NAMING = '''


ACMETEL: Final = Naming(
    "acmetel",
    "camel",
    {"stream_sid": "streamId", "call_sid": "callId", "account_sid": "accountId", "from_": "from"},
)
"""Acmetel's media stream (the recipe's example): Twilio's, with ids spelt ``…Id``."""'''

ROW = (
    '    Carrier("acmetel", "Acmetel media streams", ACMETEL, signature="none", control="none"),\n'
)

DOC_LINE = (
    "| Acmetel media streams | `/v1/phone/acmetel` | camelCase, ids as `streamId`, `callId` "
    "| none known: stream token | not wired |\n"
)

# The check, a test module run on the copy: a call through a real gateway.
CALL = """
import asyncio
import urllib.request
from pathlib import Path

import msgspec

from gateway.client.carrier import CallSetup, SimulatedCall
from protocol.events import PhoneCall, decode_event
from protocol.media_stream import ACMETEL
from tests.support.carrier import phone_gateway


def http(method: str, url: str, body: object = None) -> dict:
    data = None if body is None else msgspec.json.encode(body)
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return msgspec.json.decode(response.read())


async def test_acmetel_answers_a_call(tmp_path: Path) -> None:
    numbers = tmp_path / "numbers.toml"
    numbers.write_text('[defaults]\\ngreeting = "Hello."\\n')  # the model speaks first
    async with phone_gateway(tmp_path, phone_numbers_file=str(numbers)) as gw:
        minted = await asyncio.to_thread(http, "POST", f"{gw.api_url}/v1/phone/tokens", {})
        url = f"ws://127.0.0.1:{gw.gateway.port}/v1/phone/acmetel"
        setup = CallSetup(url, naming=ACMETEL, parameters={"token": minted["stream_token"]})
        call = SimulatedCall(setup)
        await call.dial()
        await call.wait_for(lambda: call.marks_echoed > 0)
        await call.heard_all(timeout=20)
        [sid] = gw.gateway.phone.control.calls
        await call.hang_up()
        async with asyncio.timeout(10):
            while True:  # the call's end is logged once the gateway read the stop
                page = await asyncio.to_thread(
                    http, "GET", f"{gw.api_url}/v1/sessions/{sid}/events?limit=1000"
                )
                events = [decode_event(msgspec.json.encode(e)) for e in page["events"]]
                calls = [e for e in events if isinstance(e, PhoneCall)]
                if calls and calls[-1].status == "ended":
                    break
                await asyncio.sleep(0.05)
    started, ended = calls
    assert (started.carrier, started.call) == ("acmetel", setup.call_sid)
    assert ended.reason == "hangup"
    assert call.media_received > 0 and call.marks_echoed == call.media_received
    assert not isinstance(ended.metrics, msgspec.UnsetType) and ended.metrics.talk_ms > 0
"""


@pytest.mark.timeout(90)
def test_a_carrier_is_its_naming_its_row_and_its_line_in_the_doc(tmp_path: Path) -> None:
    rooms = ("docs/phone.md", "tests/phone/__init__.py", "tests/phone/test_carriers.py")
    root = copy_rooms(tmp_path, rooms)

    # The recipe: a Naming, the row, the doc's line.
    wire = root / "protocol/media_stream.py"
    edit(
        wire,
        '__all__ = [\n    "MAX_MEDIA_PAYLOAD",',
        '__all__ = [\n    "ACMETEL",\n    "MAX_MEDIA_PAYLOAD",',
    )
    edit(wire, "\n\n\nText = str | int", NAMING + "\n\n\nText = str | int")
    carriers = root / "gateway/phone/carriers.py"
    edit(
        carriers,
        "from protocol.media_stream import TELNYX, TWILIO,",
        "from protocol.media_stream import ACMETEL, TELNYX, TWILIO,",
    )
    telnyx_row = 'TELNYX, signature="none", control="none"),\n'
    edit(carriers, telnyx_row, telnyx_row + ROW)
    doc = root / "docs/phone.md"
    telnyx_line = next(
        line for line in doc.read_text().splitlines() if "`/v1/phone/telnyx`" in line
    )
    edit(doc, telnyx_line + "\n", telnyx_line + "\n" + DOC_LINE)

    (root / "tests/phone/test_acmetel_call.py").write_text(CALL)
    report = run_tests(root, "tests/phone/test_carriers.py", "tests/phone/test_acmetel_call.py")
    assert passed(report) == 2, report[-2000:]
