"""The leading activator's certificate manager: orders, renews and drops certificates for the
apps' names (`wakeful.domain.certs` decides which and when), one order per name at a time.

Theory of operation:
- It runs only while this activator leads (inside the control plane's task group), so one
  manager orders at a time; its writes go through the control plane's store, fenced by the
  leader's term. A record left `ordering` or `renewing` by a deposed leader is due at once:
  the next leader orders that name again with the same account (a CA keeps the account's
  authorizations that validated, so what the old leader finished is not done twice).
- Apps are mirrored from `apps/`; every change, and every `interval`, the wanted names are
  computed again, records of names no app routes are deleted, and each due name not being
  ordered gets an order, `concurrency` at most at once.
- An order's HTTP-01 challenges are written to `acme/challenges/{token}` for every ingress to
  answer, and deleted when the order ends, however it ends.
- The ACME account's key and every issued key are sealed (`Sealer`: the secrets' keys) before
  they are written; `served` opens them for the ingresses, each once per certificate.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.from_thread
import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter, Gauge

from wakeful.aio import failpoints
from wakeful.domain import certs as rules
from wakeful.domain import keys
from wakeful.domain.models import (
    ACCOUNT_PURPOSE,
    AcmeAccount,
    AcmeChallenge,
    App,
    CertKey,
    CertRecord,
    CertState,
    Issued,
    cert_key_purpose,
)
from wakeful.store import Item, Put, Store, StoreError
from wakeful.store.errors import CorruptValue, Deposed
from wakeful.store.reflector import reflect

from .acme_client import AcmeFailure, Conversation, new_key_pem

log = logging.getLogger(__name__)


class Sealer(Protocol):
    """What the manager needs of the secrets' keys (`wakeful.secrets.PurposeSealer`)."""

    async def seal(self, purpose: str, value: str) -> str: ...

    def open(self, purpose: str, sealed: str) -> str: ...


@dataclass(frozen=True)
class AcmeSettings:
    email: str
    directory: str
    ca: str | None = None
    """A PEM bundle trusting a private ACME server's TLS."""
    base_domain: str | None = None
    interval: float = 60.0
    """Seconds between checks when nothing changes."""
    order_timeout: float = 120.0
    concurrency: int = 4
    orders_per_window: int = 250
    """New orders in any 3 hours (`wakeful.domain.certs.order_wait`)."""
    files: Path | None = None
    """The ingresses' certificate files (`WAKEFUL_TLS_DIR`): names they cover are not ordered."""


def file_names(directory: Path | None) -> frozenset[str]:
    """The names the certificate files in `directory` serve (`shop.example.com.crt`,
    `*.example.com.crt`; not `default.crt`), as `ingress.tls` reads them (blocking)."""
    if directory is None:
        return frozenset()
    try:
        found = [entry.name for entry in os.scandir(directory) if entry.name.endswith(".crt")]
    except OSError as exc:
        log.warning("certificates: cannot read %s: %s", directory, exc)
        return frozenset()
    return frozenset(n.removesuffix(".crt").lower() for n in found if n != "default.crt")


@dataclass(frozen=True)
class Served:
    name: str
    chain: str
    key: str
    serial: str


class CertMetrics:
    """Declared by every control plane, ACME on or not (a dashboard's queries find them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.expiry = Gauge(
            "wakeful_cert_expiry_timestamp_seconds",
            "When the certificate from ACME held for a name expires (Unix time).",
            ["name"],
            registry=registry,
        )
        self.orders = Counter(
            "wakeful_acme_orders",
            "ACME orders this control plane made, by result (issued, failed).",
            ["result"],
            registry=registry,
        )


class _Apps:
    """`apps/` as the manager reads it; `changed` is set on every change."""

    def __init__(self) -> None:
        self.apps: dict[str, App] = {}
        self.changed = anyio.Event()
        self.listed = anyio.Event()
        """Set once `apps/` was listed: before, no app is known, and no name may be dropped."""

    def replace(self, items: list[Item[App]], revision: int) -> None:
        self.apps = {item.value.name: item.value for item in items}
        self.listed.set()
        self.changed.set()

    def put(self, item: Item[App]) -> None:
        self.apps[item.value.name] = item.value
        self.changed.set()

    def delete(self, key: str, revision: int) -> None:
        self.apps.pop(keys.name_in(key, keys.APPS), None)
        self.changed.set()


class CertManager:
    def __init__(
        self,
        store: Store,
        sealer: Sealer,
        settings: AcmeSettings,
        metrics: CertMetrics,
        *,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._sealer = sealer
        self.settings = settings
        self._clock = clock
        self._apps = _Apps()
        self._ordering: set[str] = set()
        self._account_gone = False
        """An order found the CA no longer knows the account: the next pass makes it again."""
        self._told: set[str] = set()
        """Wildcard hosts already logged as needing a file."""
        self._started: list[float] = []
        """When this leader's orders of the last 3 hours started."""
        self._slots = anyio.Semaphore(settings.concurrency)
        self._opened: dict[str, Served] = {}
        """Opened keys by name, kept while the serial is the one served."""
        self._expiry = metrics.expiry
        self._orders = metrics.orders

    async def run(self) -> None:
        """Order and renew until cancelled (this activator stopped leading)."""
        async with anyio.create_task_group() as tasks:
            mirror = functools.partial(reflect, what="certificates' apps")
            tasks.start_soon(mirror, self._store, keys.APPS, App, self._apps)
            conversation: Conversation | None = None
            await self._clear_challenges()
            await self._apps.listed.wait()  # else every name would look routed by no app
            while True:
                self._apps.changed = anyio.Event()
                wait = self.settings.interval
                try:
                    if conversation is None or self._account_gone:
                        self._account_gone = False
                        conversation = await self._account()
                    wait = await self._pass(conversation, tasks)
                except (StoreError, AcmeFailure) as exc:
                    log.warning("certificates: %s", exc)
                    wait = min(wait, 30.0)
                except Exception:  # a certificate is never worth the control plane
                    log.exception("certificates: the manager's pass failed")
                    wait = min(wait, 30.0)
                with anyio.move_on_after(wait):
                    await self._apps.changed.wait()

    async def _clear_challenges(self) -> None:
        """Challenges a deposed leader's orders left: none of them is answered any more (the
        orders they belonged to are ordered again)."""
        try:
            for item in (await self._store.list(keys.CHALLENGES, AcmeChallenge)).items:
                await self._store.delete(item.key)
        except StoreError as exc:
            log.warning("could not clear old ACME challenges: %s", exc)

    async def _account(self) -> Conversation:
        """The account's conversation: the one in the store for this directory, else a new
        account, recorded."""
        try:
            found = await self._store.get(keys.ACME_ACCOUNT, AcmeAccount)
        except CorruptValue as exc:
            log.warning("%s: a new ACME account replaces it", exc)
            found = None
        settings = self.settings
        uri: str | None = None
        key_pem = ""
        if found is not None and found.value.directory == settings.directory:
            try:
                key_pem, uri = self._sealer.open(ACCOUNT_PURPOSE, found.value.key), found.value.uri
            except Exception as exc:  # SealError: a key that does not open is no account
                log.warning("the ACME account's key does not open (%s): a new account", exc)
        if not key_pem:  # an RSA key takes ~100 ms: off the loop (`wakeful up` serves on it)
            key_pem = await anyio.to_thread.run_sync(new_key_pem, "rsa")
        conversation = await anyio.to_thread.run_sync(
            lambda: Conversation(settings.directory, key_pem, ca=settings.ca)
        )
        made = await anyio.to_thread.run_sync(conversation.register, settings.email, uri)
        if made != uri:
            sealed = await self._sealer.seal(ACCOUNT_PURPOSE, key_pem)
            account = AcmeAccount(
                directory=settings.directory, email=settings.email, uri=made, key=sealed
            )
            await self._store.put(keys.ACME_ACCOUNT, account)
            log.info("ACME account %s at %s", made, settings.directory)
        return conversation

    async def _pass(self, conversation: Conversation, tasks: anyio.abc.TaskGroup) -> float:
        """Drop, then start what is due; the seconds until the next pass is needed."""
        now = self._clock()
        routed = [
            rules.Routed(app.name, tuple(app.hosts), app.default_host, tuple(sorted(app.tags)))
            for app in self._apps.apps.values()
            if app.active_version is not None
        ]
        files = await anyio.to_thread.run_sync(file_names, self.settings.files)
        wanted = rules.wanted_names(routed, self.settings.base_domain, files)
        for host in {h for r in routed for h in r.hosts if h.startswith("*.")} - self._told:
            self._told.add(host)
            log.warning(
                "%s is a wildcard host: its certificate needs DNS-01, which wakeful does not "
                "do; serve it from a file in WAKEFUL_TLS_DIR",
                host,
            )
        records = {
            r.value.name: r.value for r in (await self._store.list(keys.CERTS, CertRecord)).items
        }
        plan = rules.plan_pass(
            wanted,
            records,
            self._ordering,
            self._started,
            now,
            directory=self.settings.directory,
            limit=self.settings.orders_per_window,
            ceiling=self.settings.interval,
        )
        for name in plan.drop:
            await self._store.delete(keys.cert(name))
            await self._store.delete(keys.cert_key(name))
            with contextlib.suppress(KeyError):  # never served
                self._expiry.remove(name)
            self._opened.pop(name, None)
            log.info("certificate for %s dropped: no app routes it", name)
        self._started = [at for at in self._started if at > now - rules.ORDER_WINDOW]
        for name, app in plan.start:
            self._started.append(now)
            self._ordering.add(name)
            tasks.start_soon(self._order, conversation, name, app, records.get(name))
        if len(self._started) >= self.settings.orders_per_window and plan.wait > 0:
            log.warning("certificates: %d orders in 3 hours, the next waits", len(self._started))
        for name in wanted:
            record = records.get(name)
            if record is not None and record.issued is not None:
                self._expiry.labels(name=name).set(record.issued.not_after)
        return plan.wait

    async def _order(
        self, conversation: Conversation, name: str, app: str, record: CertRecord | None
    ) -> None:
        try:
            async with self._slots:
                try:  # a record this name cannot make is this order's failure, nobody else's
                    start = rules.ordering(record, name, app, self._clock())
                except ValueError:
                    log.exception("certificate for %s: cannot record its order", name)
                    return
                await self._store.put(keys.cert(name), start)
                try:
                    made = await anyio.to_thread.run_sync(
                        lambda: conversation.order(
                            name,
                            publish=lambda token, value: anyio.from_thread.run(
                                self._publish, token, value, name
                            ),
                            withdraw=lambda token: anyio.from_thread.run(self._withdraw, token),
                            timeout=self.settings.order_timeout,
                        ),
                        abandon_on_cancel=True,
                    )
                    sealed = await self._sealer.seal(cert_key_purpose(name), made.key_pem)
                    held = CertKey(name=name, serial=made.serial, key=sealed)
                    issued = Issued(  # a chain over its bound is refused here
                        chain=made.chain,
                        not_before=made.not_before,
                        not_after=made.not_after,
                        issuer=made.issuer,
                        serial=made.serial,
                        directory=self.settings.directory,
                    )
                except StoreError:
                    raise
                except Exception as exc:  # AcmeFailure; a key that does not seal; any surprise
                    if not isinstance(exc, AcmeFailure):
                        log.exception("certificate for %s: the order failed", name)
                    elif exc.account_gone:
                        self._account_gone = True
                    self._orders.labels(result="failed").inc()
                    after = rules.failed(start, str(exc), self._clock())
                    await self._store.put(keys.cert(name), after)
                    log.warning(
                        "certificate for %s: %s (next attempt in %.0f s)",
                        name,
                        exc,
                        after.next_attempt - self._clock(),
                    )
                    return
                valid = start.model_copy(
                    update={
                        "state": CertState.VALID,
                        "issued": issued,
                        "failures": 0,
                        "last_error": "",
                        "next_attempt": 0.0,
                        "updated_at": self._clock(),
                    }
                )
                # One write: an ingress that sees the new serial finds its key with it.
                await self._store.txn(
                    [], [Put(keys.cert_key(name), held), Put(keys.cert(name), valid)]
                )
                self._orders.labels(result="issued").inc()
                self._expiry.labels(name=name).set(made.not_after)
                log.info(
                    "certificate for %s issued by %s, until %s", name, made.issuer, made.not_after
                )
        except Deposed:
            return  # the next leader carries it on
        except StoreError as exc:
            log.warning("certificate for %s: the store failed: %s", name, exc)
        finally:
            self._ordering.discard(name)
            self._apps.changed.set()  # a pass looks again (a failure's wait, the next name)

    async def _publish(self, token: str, value: str, name: str) -> None:
        challenge = AcmeChallenge(token=token, key_authorization=value, name=name)
        await self._store.put(keys.challenge(token), challenge)
        failpoints.reach("acme-after-publish")

    async def _withdraw(self, token: str) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._store.delete(keys.challenge(token))
            except StoreError as exc:
                log.warning("could not delete ACME challenge %s: %s", token, exc)

    async def listing(self) -> list[CertRecord]:
        return sorted(
            (item.value for item in (await self._store.list(keys.CERTS, CertRecord)).items),
            key=lambda r: r.name,
        )

    async def served(self) -> list[Served]:
        """Every unexpired certificate with its key opened: what ingresses serve."""
        now = self._clock()
        found = []
        held = {
            item.value.name: item.value
            for item in (await self._store.list(keys.ACME_KEYS, CertKey)).items
        }
        for record in await self.listing():
            issued = record.issued
            if issued is None or issued.not_after <= now:
                continue
            known = self._opened.get(record.name)
            if known is None or known.serial != issued.serial:
                sealed = held.get(record.name)
                if sealed is None or sealed.serial != issued.serial:
                    log.error("certificate for %s not served: its key is not stored", record.name)
                    continue
                try:
                    key = self._sealer.open(cert_key_purpose(record.name), sealed.key)
                except Exception as exc:  # SealError: one record is never worth the others
                    log.error("certificate for %s not served: its key %s", record.name, exc)
                    continue
                known = self._opened[record.name] = Served(
                    record.name, issued.chain, key, issued.serial
                )
            found.append(known)
        return found
