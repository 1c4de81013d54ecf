"""The control plane's wiring, for `wakeful up` and `wakeful activator` alike.

`control_plane` runs the activator, its API (leases + deploys), the pool controller and the
idle monitor. `wakeful.together` (`run_up`) adds a node agent and the ingress in the same
process, on the embedded store; `wakeful.apart` runs one piece on its own against a shared
store. Shutdown follows one order: stop taking traffic, let in-flight requests finish, stop the
sandboxes, close the store.

Nothing here decides anything: what `wakeful up` runs with and announces is `wakeful.up`'s,
who is elected and what a term runs is `wakeful.terms`'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from wakeful.activator.api import create_app
from wakeful.activator.core import Activator
from wakeful.activator.credentials import install_admin
from wakeful.activator.pool_metrics import PoolCollector
from wakeful.activator.settings import ActivatorSettings
from wakeful.activator.tokens_api import tokens_router
from wakeful.aio.marks import SETTLE, Marks
from wakeful.certs import AcmeSettings, CertManager, CertMetrics, certs_router
from wakeful.controller.api import node_router
from wakeful.controller.health import StoreProbe, leading_gauge
from wakeful.controller.reconciler import Reconciler
from wakeful.dashboard.live import Dashboard
from wakeful.dashboard.server import dashboard_router
from wakeful.dashboard.sessions import Sessions, session_key
from wakeful.deploy.api import deploy_router
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.collect import ArtifactCollector
from wakeful.deploy.images import Images, images_router
from wakeful.deploy.local import resume_rollouts
from wakeful.deploy.logbook import LogBook
from wakeful.deploy.logdir import LogDir
from wakeful.deploy.logs_api import logs_router
from wakeful.deploy.service import Deployer
from wakeful.deploy.states import Bounds, StateKeeper
from wakeful.domain import keys
from wakeful.domain.models import Token
from wakeful.idle_monitor.monitor import IdleMonitor, IdleMonitorSettings
from wakeful.oci import ImageStore, RegistryAccess
from wakeful.secrets.api import secrets_router
from wakeful.secrets.book import SecretBook
from wakeful.secrets.purposes import PurposeSealer
from wakeful.secrets.registries import RegistryBook
from wakeful.secrets.registry_api import registries_router
from wakeful.serving import serve_asgi
from wakeful.store import Store
from wakeful.store.backup import check_schema
from wakeful.store.base import StoreBase
from wakeful.store.reflector import reflect
from wakeful.store.tokenbook import TokenBook

log = logging.getLogger(__name__)


@dataclass
class ControlPlane:
    store: Store
    activator: Activator
    deployer: Deployer
    artifacts: LocalArtifacts
    keeper: StateKeeper
    """Stateful apps' archives and releases, from the nodes holding them."""
    registry: CollectorRegistry
    tasks: anyio.abc.TaskGroup
    logbook: LogBook
    """Sandbox output pushed by node agents: through `POST /v1/logs`, or directly in-process."""
    tokens: TokenBook
    """The control API's credentials, following `tokens/` in the store."""
    api: FastAPI
    secrets: SecretBook
    """Apps' secrets, sealed under the keys in `WAKEFUL_SECRETS_KEYS`."""
    images: Images
    """Images pulled at deploy, their blobs served to nodes (`wakeful.deploy.images`)."""
    registries: RegistryBook
    """Registries' logins, their passwords sealed under the secrets' keys; opened at deploy."""
    certs: CertManager | None
    """Certificates from ACME for the apps' names, when `WAKEFUL_ACME_EMAIL` turns them on."""
    routes_seen: Marks
    """How far each ingress's routes have come (`Leases.routes`), which deploys wait on."""


@contextlib.asynccontextmanager
async def control_plane(
    store: Store,
    settings: ActivatorSettings,
    data_dir: Path,
    *,
    idle: IdleMonitorSettings | None,
    reconcile_interval: float = 1.0,
    drain_grace: float = 0.0,
    artifact_clock: Callable[[], float] = time.time,
    replace_admin: bool = False,
    write_admin: Callable[[str], str] | None = None,
    adopt_for: float = 0.0,
    leading: Callable[[], bool] = lambda: True,
    writer: str | None = None,
) -> AsyncIterator[ControlPlane]:
    """`idle`: the idle monitor's settings, None to run it elsewhere. `drain_grace`: how long
    after start lease counts are not trusted (see Reconciler); one lease TTL when ingresses run
    in other processes, 0 when every holder is in this one. `artifact_clock`: when artifacts
    were uploaded, for their collection (tests drive it). `settings.token` bootstraps the
    admin token: it becomes the admin token when the store has none, or with `replace_admin`
    (`wakeful up`, whose token file is as private as its store). `write_admin`: where a
    rotated admin secret goes (see `tokens_router`). `adopt_for`: the activator's adoption
    window after a takeover, counted from when the API listens (`Activator.running`).
    `leading`: whether this control plane's term is still certainly current (the activator
    grants nothing once it is not). `writer`: the name its log segments bear (its term's;
    one of its own for each start by default: `wakeful.domain.logfiles`)."""
    if isinstance(store, StoreBase):  # every store but a test's own
        await check_schema(store)  # SchemaError: a newer wakeful's, or a restore half done
    book = await SecretBook.opened(store, settings.secrets_dir(data_dir))  # or KeysUnusable
    registry = CollectorRegistry()
    activator = Activator(store, settings, registry, leading=leading)
    probe = StoreProbe(store)  # wakeful_store_up, wakeful_node_registered
    for metrics in (PoolCollector(activator.snapshot), probe):
        registry.register(metrics)
    leading_gauge(registry).set(1)  # a standby's /metrics says 0 (`wakeful.leadership.Standby`)
    artifacts = LocalArtifacts(
        settings.artifact_dir or data_dir / "artifacts",
        state_max_bytes=settings.state_max_bytes,
        clock=artifact_clock,
    )
    collector = ArtifactCollector(
        store, artifacts, grace=settings.artifact_grace, clock=artifact_clock
    )
    logins = RegistryBook(store, book.ring)
    certs = None
    cert_metrics = CertMetrics(registry)  # declared with ACME off too: dashboards query them
    if settings.acme_email is not None:  # certificates from ACME: this control plane orders
        acme = AcmeSettings(
            email=settings.acme_email,
            directory=settings.acme_directory,
            ca=None if settings.acme_ca is None else str(settings.acme_ca),
            base_domain=settings.acme_base_domain,
            orders_per_window=settings.acme_orders_per_3h,
            files=settings.tls_dir,
        )
        sealer = PurposeSealer(book.ring)
        certs = CertManager(store, sealer, acme, cert_metrics, clock=time.time)
    images = images_of(settings, data_dir, artifact_clock, logins)
    collector.images = images.store
    deployer = Deployer(
        store,
        artifacts,
        collector=collector,
        hosts=settings.host_rules(),
        windows=activator.version_windows,
        registry=registry,
    )
    keeper = StateKeeper(
        store,
        artifacts,
        Bounds(settings.state_pending_node_bytes, settings.state_pending_bytes),
        grace=settings.artifact_grace,
        registry=registry,
        clock=artifact_clock,
    )
    logdir = LogDir(
        settings.logs_dir(data_dir),
        writer or f"u{time.time_ns():x}",
        settings.log_limits(),
        registry=registry,
    )
    await anyio.to_thread.run_sync(logdir.start)  # lists what earlier writers left
    logbook = LogBook(logdir)
    activator.access_sink = logbook.take_access
    token = settings.token.get_secret_value() if settings.token else ""
    if not token:
        raise ValueError("the control API needs a bootstrap admin token (WAKEFUL_TOKEN)")
    if not await install_admin(store, token, replace=replace_admin):
        log.warning(
            "WAKEFUL_TOKEN is not the admin token in the store (it was rotated with `wakeful "
            "tokens rotate-admin`): it grants nothing; `wakeful activator --reset-admin-token` "
            "makes it the admin token again"
        )
    tokens = TokenBook()
    closed = math.inf if adopt_for > 0 else 0.0  # opened below, once the API listens
    async with activator.running(adopt_for=closed), anyio.create_task_group() as tasks:
        tasks.start_soon(partial(reflect, store, keys.TOKENS, Token, tokens, what="tokens"))
        with anyio.fail_after(30):
            await tokens.caught_up(0)  # listed: no request is refused for want of a listing
        reconciler = Reconciler(
            store,
            activator.leased_on,
            interval=reconcile_interval,
            drain_grace=drain_grace,
            evacuate_concurrency=settings.evacuate_concurrency,
            evacuate_grace=settings.evacuate_grace,
            takeback_after=settings.state_takeback_after,
            registry=registry,
            placer=book.ring.place,
        )
        dashboard = Dashboard(activator, lambda: reconciler.mirror, store, seen=lambda: probe.seen)
        sessions = Sessions(await session_key(store), tokens)
        routes_seen = Marks()
        api = create_app(
            activator,
            tokens,
            registry,
            [
                deploy_router(store, deployer, artifacts, keeper, tasks, images, routes_seen),
                images_router(images),
                node_router(store),
                logs_router(store, logbook),
                tokens_router(store, tokens, write_admin=write_admin),
                secrets_router(book),
                registries_router(logins),
                certs_router(certs, settings.tls_dir),
                dashboard_router(dashboard, sessions, tokens, logdir.root),
            ],
            max_channels=settings.max_channels_per_token,
            routes_seen=routes_seen,
        )
        api_started = anyio.Event()
        tasks.start_soon(serve_asgi, api, settings.listen, "control API address", api_started)
        activator.last_lease_gone = reconciler.nudge
        tasks.start_soon(reconciler.run)
        tasks.start_soon(dashboard.run)
        tasks.start_soon(collector.run, settings.artifact_gc_interval)
        tasks.start_soon(probe.run)
        if certs is not None:
            tasks.start_soon(certs.run)
        if idle is not None:
            monitor = IdleMonitor(
                store, interval=idle.idle_interval, retention=idle.retired_retention
            )
            tasks.start_soon(monitor.run)
        tasks.start_soon(resume_rollouts, deployer, tasks)
        with anyio.fail_after(30):
            await api_started.wait()
        # Ingresses find the API from now: after a takeover, a deploy's wait for their
        # routes lasts until they could have (none is on its way where nothing took over).
        routes_seen.settle(SETTLE if adopt_for > 0 else 0.0)
        if adopt_for > 0:  # ingresses reconnect to the API now: their reports come from here
            tasks.start_soon(activator.open_admission_after, adopt_for)
        try:
            yield ControlPlane(
                store,
                activator,
                deployer,
                artifacts,
                keeper,
                registry,
                tasks,
                logbook,
                tokens,
                api,
                book,
                images,
                logins,
                certs,
                routes_seen,
            )
        finally:
            tasks.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(logdir.stop)


def images_of(
    settings: ActivatorSettings,
    data_dir: Path,
    clock: Callable[[], float],
    logins: RegistryBook | None = None,
) -> Images:
    """The image store beside the artifacts (`<artifact dir>/images`), and where archives
    uploaded for a deploy wait for it (`incoming/`, emptied at start); pulls use `logins`."""
    root = settings.artifact_dir or data_dir / "artifacts"
    store = ImageStore(
        root / "images",
        access=RegistryAccess(ca=settings.registry_ca),
        platform=settings.image_platform,
        max_image_bytes=settings.image_max_bytes,
        max_unpacked=settings.image_max_unpacked,
        max_files=settings.image_max_files,
        timeout=settings.image_pull_timeout,
        clock=clock,
    )
    images = Images(store, root / "incoming", settings.image_max_bytes, logins)
    images.sweep()
    return images
