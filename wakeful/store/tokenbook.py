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
import logging
import secrets

import anyio

from wakeful.domain import keys
from wakeful.domain.models import Role, Token
from wakeful.store.base import Item, Store
from wakeful.store.errors import Forbidden, StoreError

log = logging.getLogger(__name__)


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


class TokenRefused(RuntimeError):
    """A piece apart (a node, an ingress) cannot start with its token: the control API
    refuses it, or the store the piece uses does not hold it as the piece's (`token_misplaced`)."""


async def check_own_token(store: Store, secret: str, role: Role, name: str, where: str) -> None:
    """At a piece's start, before it writes anything: `TokenRefused` when the store it uses
    (`where`, as shown) does not hold its token `secret` as `token_misplaced` wants it. A store
    that fails meanwhile only delays it (invariant 19); one that does not let it read tokens/
    (a node's etcd role, `wakeful etcd-auth`) leaves it unchecked."""
    while True:
        try:
            listing = await store.list(keys.TOKENS, Token)
        except Forbidden:  # a node under `wakeful etcd-auth`: its role reads no tokens/
            log.info("%s %s: its store role reads no tokens: its token is not checked", role, name)
            return
        except StoreError as exc:
            log.warning("%s %s: cannot read the tokens yet: %s", role, name, exc)
            await anyio.sleep(1)
            continue
        book = TokenBook()
        book.replace(listing.items, listing.revision)
        why = token_misplaced(book.verify(secret), role, name, where)
        if why is not None:
            raise TokenRefused(f"{role} {name}: {why}")
        return


def token_misplaced(found: Token | None, role: Role, name: str, store: str) -> str | None:
    """Why a piece apart must not start with its token, `found` in the store it uses (None:
    not there): the store is another than the control plane's, which took it (or the token was
    revoked); or it is another node's, and the control API answers a node's token only for the
    node it is named after (its sandboxes' secrets, their logs). None: it may start."""
    if found is None:
        return (
            f"its token is not in the store it uses ({store}): that store is not the control "
            "plane's, or the token was revoked; set WAKEFUL_STORE_URL (and "
            "WAKEFUL_STORE_NAMESPACE) to the activator's"
        )
    if role is Role.NODE and found.role is Role.NODE and found.name != name:
        return (
            f"its token is node {found.name!r}'s, and it runs as {name!r} (WAKEFUL_NODE_NAME): "
            "the control API would give it neither its sandboxes' secrets nor their logs; set "
            f"WAKEFUL_NODE_NAME={found.name}, or give it a token of its own (`wakeful tokens "
            f"create --role node --name {name}`)"
        )
    return None
