"""The pieces apart, each on its own against a shared store (etcd): `wakeful activator`,
`wakeful node`, `wakeful ingress`, `wakeful idle-monitor`. Each runs what
`wakeful.together` wires for `wakeful up`, with what crosses machines over the control API
(a node's artifacts, blobs, logs, state and secrets; an ingress's leases) instead of in
process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

from wakeful import terms
from wakeful.activator.settings import ActivatorSettings
from wakeful.datadir import (
    private_data_dir,
    private_umask,
)
from wakeful.domain.models import Role
from wakeful.idle_monitor.monitor import IdleMonitor, IdleMonitorSettings
from wakeful.leadership import Standby, leader_locator
from wakeful.node.agent import NodeAgent
from wakeful.node.registration import claim, held_data_dir
from wakeful.node.sandbox.local import runtime_for
from wakeful.node.settings import NodeSettings
from wakeful.process import settle_heap, wait_for_signal
from wakeful.remote import Endpoint, HttpArtifacts, HttpBlobs, HttpKeeper, HttpLogSink, HttpSecrets
from wakeful.secrets.keys import KeyRing
from wakeful.startcheck import check_token
from wakeful.store import Store
from wakeful.store.base import StoreBase
from wakeful.store.election import FencedStore, Term

if TYPE_CHECKING:  # the ingress (httptools, uvloop) is imported only by what runs one
    from wakeful.ingress.settings import IngressSettings

from wakeful.bootstrap import ControlPlane, control_plane

log = logging.getLogger(__name__)


async def run_activator(
    settings: ActivatorSettings,
    data_dir: Path,
    *,
    idle: IdleMonitorSettings | None,
    announce: Callable[[str], None],
    reset_admin: bool = False,
) -> None:
    """The control plane (activator, control API, pool controller, and the idle monitor unless
    `idle` is None) until a signal, while this activator leads (invariant 20; `Terms`). Ingresses
    are other processes: lease counts are rebuilt from what they report for `adopt_window`
    seconds after a takeover, and the pool controller trusts them only after one lease TTL.
    WAKEFUL_TOKEN bootstraps the admin token (`reset_admin`: it replaces the one in the store)."""
    private_data_dir(data_dir)
    async with settings.open_store() as store, anyio.create_task_group() as tasks:
        # Before standing by: an activator that could not open what the store holds would
        # take over only to refuse then (KeysUnusable ends the process with one line).
        await KeyRing(store, settings.secrets_dir(data_dir)).start(leading=False)
        election = terms.activator_election(store, settings)
        standby = Standby(election, store, settings.listen, announce)

        def plane_for(term: Term, first: bool) -> AbstractAsyncContextManager[ControlPlane]:
            return control_plane(
                FencedStore(cast(StoreBase, store), term),
                settings,
                data_dir,
                idle=idle,
                drain_grace=settings.lease_ttl,
                replace_admin=reset_admin and first,
                adopt_for=settings.adopt_window,
                leading=election.leading,
                writer=f"t{term.revision}",
            )

        each = terms.Terms(plane_for, standby, announce, settings.listen)
        tasks.start_soon(partial(election.lead, each.lead, campaign=standby.campaign))
        await wait_for_signal()
        tasks.cancel_scope.cancel()


async def run_node(
    settings: NodeSettings, control: Endpoint, *, announce: Callable[[str], None]
) -> None:
    """A node agent that fetches artifacts and its sandboxes' secrets from, and pushes logs
    to, the control API."""
    private_umask()  # before the lock's files: none of them made readable to others
    with held_data_dir(settings.data_dir) as agent_id:  # before anything touches the machine
        private_data_dir(settings.data_dir)  # or the directory: another agent's, maybe
        async with settings.open_store() as store, anyio.create_task_group() as tasks:

            async def node() -> None:
                locate = leader_locator(store, control.apis)
                async with HttpArtifacts(control.apis[0], control.token, locate=locate) as api:
                    name, where = settings.node_name, settings.store_url
                    await check_token(api, store, control.token, Role.NODE, name, where)
                await claim(store, settings, agent_id)
                await _run_node(settings, control, store, agent_id, announce)

            tasks.start_soon(node)  # a signal ends it at any point, the claim's wait included
            await wait_for_signal()
            tasks.cancel_scope.cancel()


async def _run_node(
    settings: NodeSettings,
    control: Endpoint,
    store: Store,
    agent_id: str,
    announce: Callable[[str], None],
) -> None:
    locate = leader_locator(store, control.apis)
    async with (
        HttpArtifacts(control.apis[0], control.token, locate=locate) as artifacts,
        HttpBlobs(control.apis[0], control.token, locate=locate) as blobs,
        HttpLogSink(control.apis[0], control.token, locate=locate) as logs,
        HttpKeeper(control.apis[0], control.token, settings.node_name, locate=locate) as keeper,
        HttpSecrets(control.apis[0], control.token, settings.node_name, locate=locate) as secrets,
    ):
        # Sandboxes must not reach the control API or the store, wherever they run.
        runtime = runtime_for(settings, control_plane=control.apis, blobs=blobs)
        agent = NodeAgent(
            store,
            settings,
            artifacts,
            keeper,
            secrets,
            logs=logs,
            runtime=runtime,
            tunnel_token=control.token,
            agent=agent_id,
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run)
            await agent.wait_registered()
            announce(f"node {settings.node_name} running")
            settle_heap()  # then serves until `run_node` is told to stop


async def run_ingress(
    settings: IngressSettings, control: Endpoint, *, announce: Callable[[str], None]
) -> None:
    """An ingress taking its leases over the activator's lease channel (one WebSocket, many
    calls in flight); `serve` races its start (the token's check first) against the
    process's signal receiver. Run it on uvloop."""
    from wakeful.activator.client import ChannelLeases
    from wakeful.ingress import serve
    from wakeful.remote.ingress import HttpCerts

    async with settings.open_store() as store:
        locate = leader_locator(store, control.apis)
        async with (
            ChannelLeases(control.apis[0], control.token, locate=locate) as leases,
            HttpCerts(control.apis[0], control.token, 30.0, locate) as certs,
        ):
            name, where = settings.listen, settings.store_url

            async def checked() -> None:
                await check_token(certs, store, control.token, Role.INGRESS, name, where)

            def ready() -> None:
                announce(settings.listening(settings.listen, settings.tls_listen))
                settle_heap()

            registry = CollectorRegistry()
            await serve(  # a signal ends it at any point, the token's check included
                settings,
                leases,
                store,
                registry,
                relay_token=control.token,
                certs=certs,
                ready=ready,
                before=checked,
                wait_for_stop=wait_for_signal,
            )


async def run_idle_monitor(
    settings: IdleMonitorSettings, *, announce: Callable[[str], None]
) -> None:
    """An idle monitor apart from the activators (which then run with --no-idle-monitor). Any
    number may run: one is elected (`leaders/idle-monitor`) and acts, its writes fenced by
    its term; the others wait to take over."""
    async with settings.open_store() as store, anyio.create_task_group() as tasks:
        election = terms.idle_monitor_election(store)
        announce(await terms.idle_monitor_greeting(election, settings.idle_interval))

        async def act(term: Term) -> None:
            monitor = IdleMonitor(
                FencedStore(cast(StoreBase, store), term),
                interval=settings.idle_interval,
                retention=settings.retired_retention,
            )
            await monitor.run()

        tasks.start_soon(election.lead, act)
        await wait_for_signal()
        tasks.cancel_scope.cancel()
