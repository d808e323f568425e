"""websockets' internals, here only: plain frames read and written without its parser.

A token is one ~60-byte frame from the provider and one to each client, and a
voice session sends 50 audio frames a second each way; websockets' generator
parser, ``Assembler``, send context and ``Frame.serialize`` were each a
measured share of the node's CPU per event (docs/performance.md). This
package is the gateway's one user of websockets' internals:

- ``read``: ``FastReader`` reads final unfragmented text/binary frames itself
  on both sides, into a ``MessageQueue`` (``messages``) that ``recv()`` reads;
- ``write``: ``write_text_now`` and ``write_texts_now`` (masked, to providers),
  ``write_now``, ``write_binary_now`` and ``send_batch`` (to clients, one write
  per batch);
- ``large``: a client's large frame unmasked as it arrives, and counted against
  a node-wide ``FrameBudget``;
- ``connections``: the classes ``connect``/``serve`` are given.

Each module's docstring carries its measurement and the internals it uses;
``tests/wsfast/test_canary.py`` fails when a websockets release changes one of
them. The package imports nothing of ours, so ``edge/`` and ``upstream/``
both stand on it (``tests/house/test_layers.py``).
"""

from gateway.wsfast.connections import BatchingConnection, FastReadClientConnection
from gateway.wsfast.large import FrameBudget
from gateway.wsfast.messages import MessageQueue
from gateway.wsfast.read import FastReader, at_frame_boundary
from gateway.wsfast.write import (
    BatchedWrites,
    can_write_now,
    send_batch,
    write_binary_now,
    write_now,
    write_text_now,
    write_texts_now,
)

__all__ = [
    "BatchedWrites",
    "BatchingConnection",
    "FastReadClientConnection",
    "FastReader",
    "FrameBudget",
    "MessageQueue",
    "at_frame_boundary",
    "can_write_now",
    "send_batch",
    "write_binary_now",
    "write_now",
    "write_text_now",
    "write_texts_now",
]
