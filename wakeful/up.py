"""What `wakeful up` is, apart from its wiring (`wakeful.together.run_up`): the settings of
every piece on one data directory, where a rotated admin token goes, where it says each
app answers, and how its node agent gets a sandbox's secrets (`BookSecrets`).

Everything runs in one process on the embedded store (`store.db` in the data directory): the
control plane with its API on `api`, one node agent named `local`, and the ingress on
`listen` with its admin (metrics) address on `admin`. With WAKEFUL_INGRESS_WORKERS above 1
the ingress is that many worker processes instead (`ingress_workers`): each a `wakeful
ingress` on the same store file (SQLite; each process looks for the others' writes every
`SHARED_LOOK`), taking its leases over the control API's lease channel with an ingress token
made at each start (`UP_INGRESS_TOKEN`), which in-process leases did without.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from wakeful.activator.credentials import install_token
from wakeful.activator.settings import ActivatorSettings
from wakeful.datadir import write_control_file, write_token
from wakeful.domain import keys
from wakeful.domain.models import UP_INGRESS_TOKEN, App, Role
from wakeful.node.secrets import SecretsRefused
from wakeful.node.settings import NodeSettings
from wakeful.secrets.book import SecretBook
from wakeful.secrets.errors import NotYours, SecretsError, UnknownSandbox
from wakeful.store import Delete, Require, Store, sqlite_url
from wakeful.store.errors import StoreError
from wakeful.store.tokenbook import TokenBook

if TYPE_CHECKING:  # the ingress (httptools, uvloop) is imported only by what runs one
    from wakeful.ingress.settings import IngressSettings

log = logging.getLogger(__name__)


LOOPBACK_NAMES = ("127.0.0.1", "0.0.0.0", "localhost")
"""Listen hosts an app's address is announced under `localhost` for."""


@dataclass(frozen=True)
class UpSettings:
    activator: ActivatorSettings
    node: NodeSettings
    ingress: IngressSettings


def up_settings(
    data_dir: Path,
    token: str,
    *,
    api: str,
    listen: str,
    admin: str,
    isolation: Literal["bwrap", "none"] | None,
) -> UpSettings:
    """Every piece on the store in `data_dir`, WAKEFUL_* variables for the rest."""
    from wakeful.ingress.settings import IngressSettings

    store_url = sqlite_url(data_dir / "store.db")
    activator = ActivatorSettings(store_url=store_url, token=token, listen=api)
    # The in-process ingress has stopped before the node agent does: nothing left to drain.
    node = NodeSettings(
        store_url=store_url,
        node_name="local",
        data_dir=data_dir,
        shutdown_drain=0,
    )
    if isolation is not None:  # the flag beats WAKEFUL_ISOLATION
        node = node.model_copy(update={"isolation": isolation})
    # Shown in 503 answers only while the ingress listens on loopback (boot_log_shown).
    ingress = IngressSettings(
        store_url=store_url,
        listen=listen,
        admin_listen=admin,
        show_boot_log=True,
        server_timing=True,
        access_log=True,
    )
    return UpSettings(activator, node, ingress)


def admin_writer(data_dir: Path, api: str, listen: str) -> Callable[[str], str]:
    """Where a rotated admin token goes (`tokens_router`'s `write_admin`)."""

    def write_admin(secret: str) -> str:
        """A rotated admin token goes where this process's user finds it: the token file,
        and the control file the other commands read."""
        write_control_file(data_dir, f"http://{api}", secret, f"http://{listen}")
        return str(write_token(data_dir, secret))

    return write_admin


def app_address(name: str, listen: str, tls_port: int) -> str:
    """Where app `name` answers, as announced: its default host under the ingress's listen
    host (`localhost` for a loopback or wildcard one), and over HTTPS too when the ingress
    serves TLS (`tls_port`, 0 when it does not)."""
    host, _, port = listen.rpartition(":")
    shown = "localhost" if host in LOOPBACK_NAMES else host
    https = f" and https://{name}.{shown}:{tls_port}/" if tls_port else ""
    return f"http://{name}.{shown}:{port}/{https}"


class SecretsUnavailable(OSError):
    """The book could not open an app's values now (a key missing, a record unreadable): the
    start fails and is tried again, as for an artifact that cannot be fetched."""


class BookSecrets:
    """The node agent's `SecretSource` in the control plane's process (`wakeful up`): the
    book itself, for one node. The book's refusals become the node's (`SecretsRefused`);
    `wakeful.secrets` and `wakeful.node` do not import each other."""

    def __init__(self, book: SecretBook, node: str) -> None:
        self._node = book.for_node(node)

    async def env_for(self, sandbox_id: str) -> dict[str, str]:
        try:
            return await self._node.env_for(sandbox_id)
        except (NotYours, UnknownSandbox) as exc:
            raise SecretsRefused(str(exc)) from None
        except SecretsError as exc:  # its message names app, name and key id: never a value
            raise SecretsUnavailable(str(exc)) from None


@dataclass(frozen=True)
class Front:
    """The ingress as `wakeful up` sees it, in-process or as workers: the port its HTTPS
    listener took (0: none), and how to wait until it routes an app just deployed."""

    tls_port: int
    wait_for: Callable[[str], Awaitable[None]]


class WorkersFailed(RuntimeError):
    """An ingress worker exited before it was ever ready (its error is in the output)."""


def worker_environment(
    up: UpSettings, api: str, token: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """What each ingress worker runs with: this process's variables without the admin token
    (a worker needs none), and the settings `up_settings` gives the in-process ingress, the
    store file, and the control API (on loopback when it listens on every address) with the
    workers' ingress token."""
    env = {name: value for name, value in environ.items() if name != "WAKEFUL_TOKEN"}
    host, _, port = api.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}.get(host, host)
    ingress = up.ingress
    env.update(
        WAKEFUL_STORE_URL=ingress.store_url,
        WAKEFUL_API=f"http://{host}:{port}",
        WAKEFUL_INGRESS_TOKEN=token,
        WAKEFUL_SHOW_BOOT_LOG=str(ingress.show_boot_log).lower(),
        WAKEFUL_SERVER_TIMING=str(ingress.server_timing).lower(),
        WAKEFUL_ACCESS_LOG=str(ingress.access_log).lower(),
    )
    return env


def routes_caught_up(metrics: str, workers: int, revision: int) -> bool:
    """Whether each of `workers` workers, by the supervisor's /metrics, has followed the
    store's apps to `revision` (`wakeful_ingress_routes_revision`)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name == "wakeful_ingress_routes_revision":
            for sample in family.samples:
                found[sample.labels.get("worker", "")] = sample.value
    return len(found) == workers and min(found.values()) >= revision


@contextlib.asynccontextmanager
async def ingress_workers(
    up: UpSettings,
    api: str,
    store: Store,
    tokens: TokenBook,
    command: Sequence[str] | None = None,
) -> AsyncIterator[Front]:
    """`up.ingress.workers` ingress processes (`wakeful.ingress.workers.supervise`; `command`
    in place of `wakeful ingress`), ready, for as long as the block runs; then each drains and
    stops, whatever ended the block, and only then does their token go. Raises
    `WorkersFailed` when one exits before it was ready, and what stopped their supervisor
    before they were (a client port taken: `OSError` naming it) as it is."""
    from wakeful.ingress.workers import supervise

    started, stop, ended = anyio.Event(), anyio.Event(), anyio.Event()
    bound: dict[str, tuple[str, int] | None] = {}
    failed: list[str] = []
    early: list[Exception] = []
    installed: int | None = None

    async def run(env: dict[str, str]) -> None:
        try:
            why = await supervise(
                up.ingress,
                announce=lambda line: started.set(),
                wait_for_stop=stop.wait,
                command=command,
                env=env,
                bound=lambda listen, tls, admin: bound.update(tls=tls, admin=admin),
            )
            if why is not None:
                failed.append(why)
        except Exception as exc:  # before they listen (a port taken): said alone, as it is
            if started.is_set():
                raise
            early.append(exc)
        finally:
            started.set()
            ended.set()

    async def wait_for(app: str) -> None:
        """Until the app's record is in the store (a rollout writes it after the deploy
        returns) and every worker's routes hold it as the store has it then."""
        while (record := await store.get(keys.app(app), App)) is None:  # noqa: ASYNC110 - another process writes it
            await anyio.sleep(0.05)
        revision = record.revision
        admin = bound["admin"]
        assert admin is not None
        url = f"http://{admin[0]}:{admin[1]}/metrics"
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:  # loopback
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    answer = await client.get(url)
                    if routes_caught_up(answer.text, up.ingress.workers, revision):
                        return
                await anyio.sleep(0.05)

    try:
        secret, installed = await install_token(store, UP_INGRESS_TOKEN, Role.INGRESS, time.time())
        await tokens.caught_up(installed)  # the lease channel takes it from the first worker on
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(run, worker_environment(up, api, secret, os.environ))
            try:
                await started.wait()
                if early:
                    raise early[0]
                if failed or ended.is_set():
                    raise WorkersFailed(failed[0] if failed else "the ingress workers stopped")
                tls = bound["tls"]
                yield Front(0 if tls is None else tls[1], wait_for)
            finally:
                stop.set()
                with anyio.CancelScope(shield=True):
                    await ended.wait()  # drained and stopped, before anything else stops
    finally:
        if installed is not None:  # this start's token, unless someone replaced it since
            key = keys.token(UP_INGRESS_TOKEN)
            with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                await store.txn([Require(key, installed)], [Delete(key)])
