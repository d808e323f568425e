"""The pure (sans-I/O) core: event types, the streaming parser, context assembly.

Nothing here opens a socket, awaits, or reads a clock: it is fed text and
returns events, so it is tested without a network and reused by any I/O shell.
"""

from protocol.assembly import HistoryItem, Message, assemble, results_message
from protocol.calls import (
    ToolCall,
    ToolResult,
    decode_call,
    encode_call,
    encode_results,
    result_payload,
)
from protocol.client_frames import decode_client
from protocol.events import (
    Call,
    Cancel,
    Cancelled,
    ClientMessage,
    End,
    Error,
    Event,
    Execute,
    Interrupt,
    Metric,
    Ping,
    Pong,
    Respond,
    Result,
    ResultPayload,
    Session,
    Think,
    Usage,
    User,
    UserMessage,
    decode_event,
    encode,
)
from protocol.parser import Parser
from protocol.prompt import ToolSpec, system_prompt

__all__ = [
    "Call",
    "Cancel",
    "Cancelled",
    "ClientMessage",
    "End",
    "Error",
    "Event",
    "Execute",
    "HistoryItem",
    "Interrupt",
    "Message",
    "Metric",
    "Parser",
    "Ping",
    "Pong",
    "Respond",
    "Result",
    "ResultPayload",
    "Session",
    "Think",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "User",
    "UserMessage",
    "assemble",
    "decode_call",
    "decode_client",
    "decode_event",
    "encode",
    "encode_call",
    "encode_results",
    "result_payload",
    "results_message",
    "system_prompt",
]
