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

import hmac
import logging
import secrets
import time

from wakeful.domain import keys
from wakeful.domain.models import ADMIN_TOKEN, Role, Token
from wakeful.store import AlreadyExists, Store
from wakeful.store.tokenbook import digest, new_id

log = logging.getLogger(__name__)


def new_secret() -> str:
    """32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


async def install_token(store: Store, name: str, role: Role, now: float) -> tuple[str, int]:
    """A new secret for the token `name` of `role`, made, or replacing the one of that name
    (its old secret stops working): the secret and the revision written."""
    secret = new_secret()
    record = Token(name=name, role=role, id=new_id(), sha256=digest(secret), created_at=now)
    return secret, await store.put(keys.token(name), record)


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
