"""Control API credentials: secrets, their digests, and the control plane's view of them.

A secret is 32 random bytes (`new_secret`); the store keeps only its sha256 (`digest`) under
`tokens/{name}` (`wakeful.domain.models.Token`). A plain hash is enough because the secrets
are not passwords: with 256 bits of entropy there is nothing to guess, so a salt or a slow
hash would add cost on every request and no safety.

`TokenBook` is the control plane's copy of every digest, kept current by the store reflector
(`reflect` on `tokens/`), so checking a request's token costs one sha256 and one dict lookup,
never a store round trip. A revoked or rotated secret stops working once the watch delivers
the change: at once in the process that wrote it (the token routes wait for their own write,
`caught_up`), within the watch latency anywhere else.

The admin token is a record too (`tokens/admin`, `ADMIN_TOKEN`); the token file of `wakeful
up` or WAKEFUL_TOKEN only bootstraps it (`install_admin`), so rotating it retires the old
secret for good.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time

import anyio

from wakeful.domain import keys
from wakeful.domain.models import ADMIN_TOKEN, Role, Token
from wakeful.store import AlreadyExists, Item, Store

log = logging.getLogger(__name__)


def new_secret() -> str:
    """32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def new_id() -> str:
    return secrets.token_hex(4)


def digest(secret: str) -> str:
    """What the store keeps of a secret: its sha256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenBook:
    """Every token record, by digest; a reflector `View[Token]` of `tokens/`. Called by one
    task (the reflector) for changes; `verify` from any request."""

    def __init__(self) -> None:
        self._by_key: dict[str, Token] = {}
        self._by_digest: dict[str, Token] = {}
        self._revision = 0
        self._listed = False
        self._moved: anyio.Event | None = None

    @classmethod
    def of(cls, tokens: dict[str, Role]) -> TokenBook:
        """A book of fixed secrets, fed by no store: for a control API built by hand."""
        book = cls()
        records = [
            Token(name=f"t{i}", role=role, id=new_id(), sha256=digest(secret))
            for i, (secret, role) in enumerate(tokens.items())
        ]
        book.replace([Item(keys.token(t.name), t, 1) for t in records], 1)
        return book

    # -- the reflector's view ---------------------------------------------------------------

    def replace(self, items: list[Item[Token]], revision: int) -> None:
        self._by_key = {item.key: item.value for item in items}
        self._reindex()
        self._listed = True
        self._moved_to(revision)

    def put(self, item: Item[Token]) -> None:
        self._by_key[item.key] = item.value
        self._reindex()
        self._moved_to(item.revision)

    def delete(self, key: str, revision: int) -> None:
        self._by_key.pop(key, None)
        self._reindex()
        self._moved_to(revision)

    def _reindex(self) -> None:
        self._by_digest = {token.sha256: token for token in self._by_key.values()}

    def _moved_to(self, revision: int) -> None:
        self._revision = max(self._revision, revision)
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    # -- what requests and the token routes ask -----------------------------------------------

    def verify(self, secret: str) -> Token | None:
        """The token whose secret this is, or None. Only digests are compared: a lookup's
        timing can tell something about the digest, which tells nothing about the secret;
        `compare_digest` makes the final comparison constant-time all the same."""
        presented = digest(secret)
        found = self._by_digest.get(presented)
        if found is None or not hmac.compare_digest(found.sha256, presented):
            return None
        return found

    async def caught_up(self, revision: int) -> None:
        """Until the book has applied the store's changes up to `revision` (and been listed)."""
        while not self._listed or self._revision < revision:
            if self._moved is None:
                self._moved = anyio.Event()
            await self._moved.wait()


async def install_admin(store: Store, secret: str, *, replace: bool) -> bool:
    """Make `secret` the admin token when the store has none (`replace`: even when it has
    another). True when `secret` is the admin token afterwards. Logs the record's id, never
    the secret."""
    now = time.time()
    wanted = digest(secret)
    key = keys.token(ADMIN_TOKEN)
    record = Token(name=ADMIN_TOKEN, role=Role.ADMIN, id=new_id(), sha256=wanted, created_at=now)
    current = await store.get(key, Token)
    if current is None:
        try:
            await store.create(key, record)
            return True
        except AlreadyExists:
            current = await store.get(key, Token)
    if current is not None and hmac.compare_digest(current.value.sha256, wanted):
        return True
    if not replace:
        return False
    rotated = record.model_copy(
        update={"created_at": current.value.created_at if current else now, "rotated_at": now}
    )
    if current is None:
        await store.create(key, rotated)
    else:
        await store.update(key, rotated, current.revision)
    log.warning("the admin token was replaced by the bootstrap token (id %s)", rotated.id)
    return True
