"""The HTTP API's bodies and answers (``gateway.edge.api``), one Struct each.

Bodies are decoded strictly (``forbid_unknown_fields``): a misspelt field is a
400 that names it, not a setting silently left at its default.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from protocol.configuration import ConfigChange, SessionConfig
from protocol.events import Usage

__all__ = [
    "CreateSession",
    "MintStreamToken",
    "MintToken",
    "Minted",
    "SessionInfo",
    "StreamTokenMinted",
    "create_decoder",
    "encode",
    "mint_decoder",
    "stream_token_decoder",
]

TokenTtl = Annotated[float, msgspec.Meta(ge=1, le=86400)]


TokenRights = Annotated[tuple[Literal["approve"], ...], msgspec.Meta(max_length=4)]
"""What a client token may do beyond opening its session: ``approve`` calls that wait
for a user's decision (without it only the API key approves)."""


class CreateSession(ConfigChange, frozen=True, forbid_unknown_fields=True):
    """``POST /v1/sessions``: the session's configuration, its client token's lifetime (s)
    and rights."""

    ttl: TokenTtl | msgspec.UnsetType = msgspec.UNSET
    rights: TokenRights = ()


class MintToken(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /v1/sessions/{id}/tokens``."""

    ttl: TokenTtl | msgspec.UnsetType = msgspec.UNSET
    rights: TokenRights = ()


class MintStreamToken(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /v1/phone/tokens``: the session the call resumes (none: a new one), the
    carrier's call id it is for (none: any), the token's lifetime (s)."""

    session_id: str | msgspec.UnsetType = msgspec.UNSET
    call: Annotated[str, msgspec.Meta(max_length=128)] | msgspec.UnsetType = msgspec.UNSET
    ttl: TokenTtl | msgspec.UnsetType = msgspec.UNSET


class StreamTokenMinted(msgspec.Struct, frozen=True):
    stream_token: str
    expires_at: float  # unix seconds
    session_id: str | None = None


class Minted(msgspec.Struct, frozen=True):
    session_id: str
    client_token: str
    expires_at: float  # unix seconds


class SessionInfo(msgspec.Struct, frozen=True):
    """``GET /v1/sessions/{id}``."""

    session_id: str
    status: Literal["active", "idle"]  # active: a node drives it now
    config: SessionConfig
    usage: Usage
    created: float  # unix seconds
    last_seq: int
    node: str | None = None  # the node driving it


encode: Final = msgspec.json.Encoder().encode
create_decoder: Final = msgspec.json.Decoder(CreateSession)
mint_decoder: Final = msgspec.json.Decoder(MintToken)
stream_token_decoder: Final = msgspec.json.Decoder(MintStreamToken)
