"""A piece apart checks its token at its start, before it takes sandboxes or requests it could
not serve (`wakeful node`, `wakeful ingress`): the control API takes it (`GET /v1/whoami`), it
is of the piece's role (or the admin's), a node token is that node's own (the control API gives
a node its sandboxes' secrets and takes their logs only under the name its token is made
for), and the store the piece uses holds it (so that store is the control plane's: a piece
started without `WAKEFUL_STORE_URL` runs on a SQLite file of its own, which no control plane
sees). Each failure ends the start with one line saying what to set (`TokenRefused`).

The control API unreachable, the store alone is asked; a store that refuses the piece
`tokens/` (a node's etcd role under `wakeful etcd-auth`), the control API alone; a store
that is unavailable only delays the start (invariant 19).
"""

from __future__ import annotations

import logging
from typing import Protocol

import anyio

from wakeful.domain import keys
from wakeful.domain.models import Role, Token
from wakeful.store import Store, Unavailable
from wakeful.store.errors import Forbidden
from wakeful.store.tokenbook import TokenBook

log = logging.getLogger(__name__)

RETRY_FIRST, RETRY_MAX = 1.0, 30.0
"""Seconds between reads of a store that is unavailable at the start: doubling to the most."""


class TokenRefused(RuntimeError):
    """A piece apart cannot start with its token (the message says why and what to do)."""


class AsksWho(Protocol):
    async def whoami(self) -> tuple[str, str] | str | None: ...


async def check_token(
    api: AsksWho, store: Store, secret: str, role: Role, name: str, where: str
) -> None:
    """The checks of the module's notes for a piece of `role` called `name` (a node's name,
    an ingress's address), whose token is `secret`, on the store shown as `where`."""
    said = await api.whoami()
    if isinstance(said, str):
        own = name if role is Role.NODE else "NAME"
        raise TokenRefused(
            f"{role} {name}: {said}; give it the token `wakeful tokens create --role {role} "
            f"--name {own}` printed (WAKEFUL_{role.upper()}_TOKEN)"
        )
    if said is not None and said[1] in set(Role):
        why = token_misplaced((said[0], Role(said[1])), role, name, where)
        if why is not None:
            raise TokenRefused(f"{role} {name}: {why}")
    try:
        found = await stored(store, secret, f"{role} {name}")
    except Forbidden:  # a node under `wakeful etcd-auth`: its role reads no tokens/
        log.info("%s %s: its store role reads no tokens: checked by the control API", role, name)
        return
    why = token_misplaced(found, role, name, where)
    if why is not None:
        raise TokenRefused(f"{role} {name}: {why}")


async def stored(store: Store, secret: str, who: str) -> tuple[str, Role] | None:
    """The (name, role) of the token `secret` in `store`, None when it is not there;
    `Forbidden` when the store does not let `who` read tokens/, and any `StoreError` but
    `Unavailable` (waited out) as it comes."""
    pause = RETRY_FIRST
    while True:
        try:
            listing = await store.list(keys.TOKENS, Token)
        except Unavailable as exc:
            if pause in (RETRY_FIRST, RETRY_MAX):
                log.warning("%s: cannot read the tokens yet, waiting: %s", who, exc)
            await anyio.sleep(pause)
            pause = min(RETRY_MAX, pause * 2)
            continue
        book = TokenBook()
        book.replace(listing.items, listing.revision)
        found = book.verify(secret)
        return None if found is None else (found.name, found.role)


def token_misplaced(
    found: tuple[str, Role] | None, role: Role, name: str, store: str
) -> str | None:
    """Why a piece of `role` called `name` must not start with a token that is `found`
    (its name and role; None: not in the store the piece uses, shown as `store`). None: it
    may start."""
    if found is None:
        return (
            f"its token is not in the store it uses ({store}): that store is not the control "
            "plane's, or the token was revoked; set WAKEFUL_STORE_URL (and "
            "WAKEFUL_STORE_NAMESPACE) to the activator's"
        )
    made_for, its_role = found
    own = name if role is Role.NODE else "NAME"
    if its_role not in (role, Role.ADMIN):
        return (
            f"its token is {_a(its_role)} token ({made_for!r}); give it {_a(role)} token "
            f"(`wakeful tokens create --role {role} --name {own}`)"
        )
    if role is Role.NODE and its_role is Role.NODE and made_for != name:
        return (
            f"its token was made for node {made_for!r}, and it runs as {name!r} "
            "(WAKEFUL_NODE_NAME): the control API would give it neither its sandboxes' "
            f"secrets nor their logs; set WAKEFUL_NODE_NAME={made_for}, or give it a token of "
            f"its own (`wakeful tokens create --role node --name {name}`)"
        )
    return None


def _a(role: Role) -> str:
    return f"{'an' if role[0] in 'aeiou' else 'a'} {role}"
