"""`wakeful up`: every piece in one process, on the embedded store. `run_up` holds the data
directory and the node's name, opens the store, runs the control plane
(`wakeful.bootstrap.control_plane`), then a node agent and the ingress beside it, deploys the
app directories it was given, and waits for a stop signal; shutdown stops taking traffic, lets
the requests in flight finish, stops the sandboxes, then closes the store.

Its settings and what it announces are `wakeful.up`'s; `wakeful.apart` runs each piece on
its own against a shared store instead.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Literal

import anyio
from prometheus_client import CollectorRegistry

from wakeful.bootstrap import ControlPlane, control_plane
from wakeful.certs import CertManager
from wakeful.datadir import (
    load_or_create_token,
    private_data_dir,
    private_umask,
    remove_control_file,
    write_control_file,
)
from wakeful.deploy.appdir import AppDir
from wakeful.deploy.local import deploy_dir
from wakeful.idle_monitor.monitor import IdleMonitorSettings
from wakeful.ingress.acme import ServedPair
from wakeful.node.agent import NodeAgent
from wakeful.node.registration import claim, held_data_dir
from wakeful.node.sandbox.local import runtime_for
from wakeful.node.settings import NodeSettings
from wakeful.process import settle_heap, wait_for_signal
from wakeful.store import Store, open_store
from wakeful.up import (
    BookSecrets,
    Front,
    UpSettings,
    admin_writer,
    app_address,
    ingress_workers,
    up_settings,
)


class PlaneCerts:
    """The ingress's `CertSource` in the control plane's own process: the manager itself."""

    def __init__(self, manager: CertManager) -> None:
        self._manager = manager

    async def served(self) -> list[ServedPair]:
        return [ServedPair(s.name, s.chain, s.key, s.serial) for s in await self._manager.served()]


@contextlib.asynccontextmanager
async def _in_process_ingress(
    up: UpSettings, plane: ControlPlane, store: Store, token: str
) -> AsyncIterator[Front]:
    """`wakeful up`'s ingress in its own process, taking leases from the activator directly."""
    from wakeful.activator.client import InProcessLeases
    from wakeful.ingress.server import Ingress

    ingress = Ingress(
        up.ingress,
        InProcessLeases(plane.activator, plane.routes_seen),
        store,
        CollectorRegistry(),
        relay_token=token,
        certs=None if plane.certs is None else PlaneCerts(plane.certs),
    )
    async with ingress.running():
        yield Front(ingress.tls_address[1], ingress.routes.wait_for)


async def claimed_unless_stopped(store: Store, settings: NodeSettings, agent: str) -> bool:
    """`claim` (`wakeful.node.registration`), or False when a stop signal (SIGINT, SIGTERM)
    comes first: a Ctrl-C while it waits out another agent's record ends `wakeful up` at
    once, not the TTL later."""
    claimed = False
    async with anyio.create_task_group() as tasks:

        async def claim_it() -> None:
            nonlocal claimed
            await claim(store, settings, agent)
            claimed = True
            tasks.cancel_scope.cancel()

        tasks.start_soon(claim_it)
        await wait_for_signal()
        tasks.cancel_scope.cancel()
    return claimed


async def run_up(
    *,
    data_dir: Path,
    api: str,
    listen: str,
    admin: str,
    app_dirs: Sequence[AppDir],
    idle: IdleMonitorSettings,
    announce: Callable[[str], None],
    isolation: Literal["bwrap", "none"] | None = None,
) -> None:
    """Everything in one process (the ingress as worker processes when asked). Shutdown: the
    ingress stops taking requests and finishes the ones in flight, hands its leases back;
    then the sandboxes stop; then the control plane."""

    if not data_dir.is_absolute():  # every path below is derived from it: resolve it once
        raise ValueError(f"data_dir must be absolute, got {data_dir}")
    # One `wakeful up` a directory, and one agent of its node: before anything in it changes.
    private_umask()  # before the lock's files: none of them made readable to others
    with held_data_dir(data_dir) as agent_id:
        private_data_dir(data_dir)
        token = load_or_create_token(data_dir)
        up = up_settings(data_dir, token, api=api, listen=listen, admin=admin, isolation=isolation)
        assert up.node.data_dir == data_dir
        write_admin = admin_writer(data_dir, api, listen)
        # The token file is the admin token at every start: it is as private as the store
        # beside it, and `wakeful tokens rotate-admin` rewrites it.
        # Ingress workers are other processes on the store file: it is looked at for their
        # writes then; alone, this process is its only user.
        async with open_store(up.activator.store_url, shared=up.ingress.workers > 1) as store:
            if not await claimed_unless_stopped(store, up.node, agent_id):  # before the plane
                remove_control_file(data_dir)  # a crashed run's, if any: nothing is up
                return  # stopped while it waited for another agent's record to go
            async with control_plane(
                store,
                up.activator,
                data_dir,
                idle=idle,
                replace_admin=True,
                write_admin=write_admin,
            ) as plane:
                # The same LogSink a node elsewhere reaches over HTTP, handed over directly; the
                # image blobs, from the control plane's store.
                agent = NodeAgent(
                    store,
                    up.node,
                    plane.artifacts,
                    plane.keeper.for_node(up.node.node_name),
                    BookSecrets(plane.secrets, up.node.node_name),
                    logs=plane.logbook,
                    runtime=runtime_for(up.node, blobs=plane.images.store),
                    agent=agent_id,
                )
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(agent.run)
                    with anyio.fail_after(30):
                        await agent.wait_registered()
                    if up.ingress.workers > 1:
                        front = ingress_workers(up, api, store, plane.tokens)
                    else:
                        front = _in_process_ingress(up, plane, store, token)
                    async with front as ingress:
                        where = data_dir / "token"
                        announce(f"wakeful is up: control API http://{api} (token in {where})")
                        announce(f"  dashboard: http://{api}/ui")
                        for app_dir in app_dirs:
                            announce(
                                await deploy_dir(
                                    plane.deployer,
                                    plane.artifacts,
                                    plane.tasks,
                                    app_dir,
                                    plane.images,
                                )
                            )
                            name = app_dir.definition.name  # WAKEFUL_TLS_LISTEN: over HTTPS too
                            announce(f"  {name}: {app_address(name, listen, ingress.tls_port)}")
                        # Written once the apps named on the command line are deployed and in the
                        # ingress's routes: whoever waits for the control file (a script, a test)
                        # finds them routable.
                        with anyio.move_on_after(10):
                            for app_dir in app_dirs:
                                await ingress.wait_for(app_dir.definition.name)
                        write_control_file(data_dir, f"http://{api}", token, f"http://{listen}")
                        settle_heap()
                        signum = await wait_for_signal()
                        announce(
                            f"stopping ({signal.Signals(signum).name}): finishing requests, "
                            "stopping sandboxes"
                        )
                    tasks.cancel_scope.cancel()
        remove_control_file(data_dir)  # while the directory is still ours
