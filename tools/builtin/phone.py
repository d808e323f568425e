"""The call tools: ``end_call``, ``transfer_call``, ``send_dtmf``.

Ordinary tools (an approval can wrap them like any other), offered when the
operator turns them on (``--phone-tools``). They act on the phone call of
the session they run for through ``CallControl``, which the gateway's phone
edge implements (``gateway.phone.control``): this package knows nothing of
carriers. A session with no call on the node that runs the tool gets a
failure that says so.

Each acts in the world once per call (``journaled``): a node taking the
session over after the first run finished returns that run's result, so a
rerun never hangs up, transfers or dials keys on the call a second time (or
on the call back that took the first one's place).
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

import msgspec

from tools.base import Tool, ToolContext

__all__ = [
    "CallControl",
    "EndCallTool",
    "SendDtmfTool",
    "TransferCallTool",
    "phone_tools",
]


class CallControl(Protocol):
    """What the call tools ask of the phone edge; each raises ``ToolFailure`` when it
    cannot (no call, a number not allowed, the carrier's API refused), and
    returns what happened, for the model."""

    async def end_call(self, session_id: str) -> str: ...

    async def transfer_call(self, session_id: str, to: str) -> str: ...

    async def send_dtmf(self, session_id: str, digits: str) -> str: ...


class EndCallArgs(msgspec.Struct, forbid_unknown_fields=True):
    """No arguments."""


class TransferCallArgs(msgspec.Struct, forbid_unknown_fields=True):
    to: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^\+[1-9][0-9]{6,14}$",
            description="the number to transfer the caller to, in E.164 form (+15551234567)",
        ),
    ]


class SendDtmfArgs(msgspec.Struct, forbid_unknown_fields=True):
    digits: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^[0-9*#A-Dw]{1,32}$",
            description="the keys to press: 0-9, *, #, A-D; w waits half a second",
        ),
    ]


class EndCallTool(Tool[EndCallArgs]):
    name = "end_call"
    description = (
        "Hang up the phone call. Say goodbye first: the call ends once the caller has "
        "heard what you said."
    )
    args_type = EndCallArgs
    journaled = True

    def __init__(self, control: CallControl) -> None:
        self.control = control

    async def run(self, args: EndCallArgs, ctx: ToolContext) -> Any:
        return await self.control.end_call(ctx.session_id)


class TransferCallTool(Tool[TransferCallArgs]):
    name = "transfer_call"
    description = (
        "Transfer the phone call to another number (the caller leaves this conversation). "
        "Tell the caller first: the transfer starts once they have heard it."
    )
    args_type = TransferCallArgs
    journaled = True

    def __init__(self, control: CallControl) -> None:
        self.control = control

    async def run(self, args: TransferCallArgs, ctx: ToolContext) -> Any:
        return await self.control.transfer_call(ctx.session_id, args.to)


class SendDtmfTool(Tool[SendDtmfArgs]):
    name = "send_dtmf"
    description = (
        "Press telephone keys on the call (touch tones), e.g. to answer an automated menu."
    )
    args_type = SendDtmfArgs
    journaled = True

    def __init__(self, control: CallControl) -> None:
        self.control = control

    async def run(self, args: SendDtmfArgs, ctx: ToolContext) -> Any:
        return await self.control.send_dtmf(ctx.session_id, args.digits)


def phone_tools(control: CallControl) -> list[Tool[Any]]:
    """The three call tools, acting through ``control``."""
    return [EndCallTool(control), TransferCallTool(control), SendDtmfTool(control)]
