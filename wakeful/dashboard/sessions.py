"""The dashboard's login sessions: signed cookies for the admin token.

The admin token, posted once to `/ui/login` (never in a URL), becomes a cookie signed with
HMAC-SHA256 under a key kept in the store (`ui/session-key`, made by the first control plane
that needs it), so a session survives a restart and a change of leader. The cookie names the
token and carries a keyed fingerprint of its digest: rotating or revoking the token ends every
session made with it. It expires after `SESSION_SECONDS`; how it is set (`HttpOnly`,
`SameSite=Strict`, scoped to `/ui`, `Secure` over HTTPS) is `server.py`'s.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

from wakeful.domain import keys
from wakeful.domain.models import Role, SessionKey, Token
from wakeful.store import AlreadyExists, Store, StoreError
from wakeful.store.tokenbook import TokenBook

COOKIE = "wakeful_session"
SESSION_SECONDS = 12 * 3600


async def session_key(store: Store) -> bytes:
    """The key sessions are signed with (`ui/session-key`): made once, by whichever control
    plane needs it first, and shared by every one after (restarts, new leaders)."""
    found = await store.get(keys.UI_SESSION_KEY, SessionKey)
    if found is None:
        made = SessionKey(key=secrets.token_hex(32), created_at=time.time())
        with contextlib.suppress(AlreadyExists):  # another control plane made it first
            await store.create(keys.UI_SESSION_KEY, made)
        found = await store.get(keys.UI_SESSION_KEY, SessionKey)
        if found is None:
            raise StoreError("the dashboard's session key vanished as it was made")
    return bytes.fromhex(found.value.key)


class Sessions:
    """Signed session cookies for admin tokens (see the module docstring)."""

    def __init__(
        self, key: bytes, tokens: TokenBook, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = key
        self._tokens = tokens
        self._clock = clock

    def _sign(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def _fingerprint(self, token: Token) -> str:
        return self._sign("token:" + token.sha256)[:32]

    def issue(self, token: Token) -> str:
        expires = int(self._clock() + SESSION_SECONDS)
        payload = f"{token.name}|{self._fingerprint(token)}|{expires}"
        encoded = base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")
        return f"{encoded}.{self._sign(payload)}"

    def check(self, cookie: str | None) -> Token | None:
        """The admin token a cookie was issued for, while it is valid, current and unexpired."""
        if not cookie or len(cookie) > 1024:
            return None
        encoded, _, signature = cookie.partition(".")
        try:
            payload = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        name, fingerprint, expires = [*payload.split("|"), "", "", ""][:3]
        if not expires.isdigit() or int(expires) < self._clock():
            return None
        token = self._tokens.by_name(name)
        if token is None or token.role is not Role.ADMIN:
            return None
        if not hmac.compare_digest(self._fingerprint(token), fingerprint):
            return None  # rotated since
        return token
