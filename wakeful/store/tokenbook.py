"""A process's copy of the control API's token digests (`tokens/`), kept by the store's watch.

`TokenBook` answers "whose secret is this?" with one sha256 and one dict lookup, never a store
round trip. The control plane checks every request against one (`wakeful.activator`), and an
ingress replica checks the credentials of the tunnels that dial-out nodes open to it and of
the peers that relay to it (`wakeful.ingress.nodestreams`). The store keeps only the sha256 of
each secret (`wakeful.domain.models.Token`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import anyio

from wakeful.domain import keys
from wakeful.domain.models import Role, Token
from wakeful.store.base import Item


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

    def by_name(self, name: str) -> Token | None:
        """The token named `name`, while it exists."""
        return self._by_key.get(keys.token(name))

    def by_digest(self, digest: str) -> Token | None:
        """The token whose secret hashes to `digest`, while it is current."""
        return self._by_digest.get(digest)

    async def caught_up(self, revision: int) -> None:
        """Until the book has applied the store's changes up to `revision` (and been listed)."""
        while not self._listed or self._revision < revision:
            if self._moved is None:
                self._moved = anyio.Event()
            await self._moved.wait()
