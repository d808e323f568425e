"""The node's client-token keys: which secrets sign and verify (``gateway.edge.tokens``).

Every node must agree on the secret, or a token minted on node A is refused
on node B. Where it comes from, first that applies:

- ``token_secret`` (environment only), comma-separated for rotation: the
  first signs, every one verifies;
- the store: the first node stores a random secret (``SET NX``) and every
  node reads that one, so a Redis-backed cluster needs no setup; with the
  memory store that is a random secret of this process.

The store is asked once (then cached); if it is down then, it is asked
again at the next mint or verify.

A token names the API key that minted it (``kd``): the key id handed to
``mint`` carries it when an API key proved it (``gateway.edge.auth.KeyId``).
Whether that key is still issued is the edge's question, asked where the
token opens a connection (``gateway.edge.rights``), not here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.config import Config
from gateway.edge.auth import KeyId
from gateway.edge.tokens import ClientToken, TokenRefused, mint_token, new_secret, verify_token
from gateway.store.base import Secrets

__all__ = ["ClientTokens"]

_STORE_NAME = "client-tokens"


class ClientTokens:
    """Mints and verifies client tokens with the secrets every node shares.

    Raises ``StoreUnavailable`` while the secret has to come from a store
    that does not answer.
    """

    def __init__(
        self, config: Config, store: Secrets, clock: Callable[[], float] = time.time
    ) -> None:
        self.ttl = config.token_ttl
        self._store = store
        self._clock = clock
        configured = tuple(s.strip().encode() for s in config.token_secret.split(",") if s.strip())
        self._secrets: tuple[bytes, ...] | None = configured or None
        self._lock = asyncio.Lock()

    async def secrets(self) -> tuple[bytes, ...]:
        if self._secrets is not None:
            return self._secrets
        async with self._lock:
            if self._secrets is None:
                shared = await self._store.shared_secret(_STORE_NAME, new_secret().hex().encode())
                self._secrets = (shared,)
        return self._secrets

    async def mint(
        self,
        sid: str,
        key_id: str,
        ttl: float | None = None,
        *,
        approve: bool = False,
        configure: bool = False,
    ) -> tuple[str, float]:
        """A token for ``sid`` owned by ``key_id`` and when it expires (unix seconds);
        ``approve``: it may decide on calls that wait for approval; ``configure``: it may
        change the session's configuration (an OpenAI door ephemeral key's).

        A ``KeyId`` (an API key proved it) makes a token that dies with that key;
        a plain id (auth is off) one that names no key.
        """
        expires_at = round(self._clock() + (self.ttl if ttl is None else ttl), 3)
        secrets = await self.secrets()
        digest = key_id.digest if isinstance(key_id, KeyId) else ""
        token = mint_token(
            secrets[0], sid, str(key_id), expires_at, digest, approve=approve, configure=configure
        )
        return token, expires_at

    async def verify(self, token: str) -> ClientToken | TokenRefused:
        return verify_token(await self.secrets(), token, self._clock())
