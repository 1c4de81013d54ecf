"""What every ingress replica does for certificates from ACME (`wakeful.certs` orders them):

- `Challenges` mirrors `acme/challenges/` and answers `GET /.well-known/acme-challenge/TOKEN`
  on the plain listener, before routing: the CA's validation may reach any replica. A token
  the mirror has not heard of yet is read from the store: the CA may ask before the watch
  brings the challenge.
- `IssuedFeed` mirrors `certs/` (sealed keys it cannot open) to learn when a certificate was
  issued or dropped, and then asks the control plane (`CertSource`, with this ingress's
  credential) for every certificate with its key, which it hands to `Certificates`: in
  memory only, served to the next handshake, no restart.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from wakeful.domain import keys
from wakeful.domain.models import AcmeChallenge, CertRecord
from wakeful.domain.models.certs import TOKEN_PATTERN
from wakeful.store import Item, Store, StoreError

log = logging.getLogger(__name__)

CHALLENGE_PREFIX = b"/.well-known/acme-challenge/"
RETRY = 2.0
"""Seconds before asking the control plane again after it failed to answer."""
LOOKUP_GAP = 0.1
"""Seconds between the starts of two listings: at most ten a second, whatever comes."""
LOOKUP_SECONDS = 2.0
"""How long a listing may take before the requests waiting for it go on to routing."""
_TOKEN = re.compile(TOKEN_PATTERN.encode())


@dataclass(frozen=True)
class ServedPair:
    name: str
    chain: str
    key: str
    serial: str


class CertSource(Protocol):
    """Every unexpired certificate with its key, from the leading control plane."""

    async def served(self) -> list[ServedPair]: ...


class Challenges:
    """`acme/challenges/` by token (a `wakeful.store.reflector.View`); `store`: where to read
    the tokens the mirror does not hold yet (None: nowhere)."""

    def __init__(self, store: Store | None = None) -> None:
        self._answers: dict[bytes, bytes] = {}
        self._store = store
        self._next: _Listing | None = None
        """The listing the requests that come now wait for (it has not started)."""
        self._last_start = -LOOKUP_GAP
        self.reading = 0
        """Requests waiting for a listing (as many as the client connections, at most)."""

    def replace(self, items: list[Item[AcmeChallenge]], revision: int) -> None:
        self._answers = {
            item.value.token.encode(): item.value.key_authorization.encode() for item in items
        }

    def put(self, item: Item[AcmeChallenge]) -> None:
        self._answers[item.value.token.encode()] = item.value.key_authorization.encode()

    def delete(self, key: str, revision: int) -> None:
        self._answers.pop(keys.name_in(key, keys.CHALLENGES).encode(), None)

    def __contains__(self, token: bytes) -> bool:
        return token in self._answers

    async def answer(self, target: bytes) -> bytes | None:
        """The key authorization for a request target under the challenge path, else None
        (an unknown token goes on to routing like any request).

        The control plane writes a challenge, then tells the CA to validate it: the CA's
        request can come before the watch brings the challenge here (a busy replica, a
        slow link), and a failed validation costs the order a retry minutes later. So for a
        well-formed token the mirror does not hold, the challenges are listed from the
        store, which has them once the write returned: one listing for every request that
        comes before it starts (a CA's several vantage points, a flood of made-up tokens
        alike), at most one every `LOOKUP_GAP`, within `LOOKUP_SECONDS`. No bound on the
        requests that wait beyond the connections': one that turned some away would let a
        flood of made-up tokens turn the CA's away too."""
        if not target.startswith(CHALLENGE_PREFIX):
            return None
        token = target[len(CHALLENGE_PREFIX) :]
        known = self._answers.get(token)
        if known is not None or self._store is None:
            return known
        if not _TOKEN.fullmatch(token):
            return None
        self.reading += 1
        try:
            return (await self._listed(self._store)).get(token)
        finally:
            self.reading -= 1

    async def _listed(self, store: Store) -> dict[bytes, bytes]:
        """The challenges as a listing that starts after this call sees them."""
        listing = self._next
        if listing is not None:  # not started yet: it will see what is there now
            await listing.done.wait()
            return listing.answers
        listing = self._next = _Listing()
        try:  # its waiters' listing: done even if this request's client leaves meanwhile
            with anyio.CancelScope(shield=True), anyio.move_on_after(LOOKUP_SECONDS):
                await anyio.sleep(max(0.0, self._last_start + LOOKUP_GAP - anyio.current_time()))
                self._next = None  # who comes now needs a listing that starts after it came
                self._last_start = anyio.current_time()
                found = await store.list(keys.CHALLENGES, AcmeChallenge)
                listing.answers = {
                    item.value.token.encode(): item.value.key_authorization.encode()
                    for item in found.items
                }
        except StoreError as exc:
            log.debug("could not list the ACME challenges: %s", exc)
        except Exception:  # any surprise of a store: the requests go on to routing
            log.exception("could not list the ACME challenges")
        finally:
            if self._next is listing:
                self._next = None
            listing.done.set()
        return listing.answers


class _Listing:
    """One listing of the challenges, shared by the requests that wait for it."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.answers: dict[bytes, bytes] = {}


class IssuedFeed:
    """`certs/` as serials by name (a `View`); `run` fetches whenever they change."""

    def __init__(
        self, source: CertSource, install: Callable[[list[ServedPair]], Awaitable[None]]
    ) -> None:
        self._source = source
        self._install = install
        self._serials: dict[str, str] = {}
        self._changed = anyio.Event()
        self.installed: dict[str, str] = {}
        """Serials by name as last installed."""

    def replace(self, items: list[Item[CertRecord]], revision: int) -> None:
        self._serials = {
            item.value.name: item.value.issued.serial for item in items if item.value.issued
        }
        self._changed.set()

    def put(self, item: Item[CertRecord]) -> None:
        record = item.value
        if record.issued is None:
            return
        if self._serials.get(record.name) != record.issued.serial:
            self._serials[record.name] = record.issued.serial
            self._changed.set()

    def delete(self, key: str, revision: int) -> None:
        if self._serials.pop(keys.name_in(key, keys.CERTS), None) is not None:
            self._changed.set()

    async def run(self) -> None:
        """Fetch and install on every change, until cancelled."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            wanted = dict(self._serials)
            if wanted == self.installed:
                continue
            try:
                pairs = await self._source.served()
            except Exception as exc:  # the control plane away, a takeover: ask again
                log.warning("could not fetch certificates from the control plane: %s", exc)
                self._changed.set()
                await anyio.sleep(RETRY)
                continue
            await self._install(pairs)
            self.installed = {pair.name: pair.serial for pair in pairs}
