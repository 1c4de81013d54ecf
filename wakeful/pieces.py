"""The long-lived pieces of the `wakeful` command: `up`, `activator`, `node`, `ingress`,
`idle-monitor`. Each turns its arguments and WAKEFUL_* variables into settings, hands them to
`wakeful.bootstrap`, and runs it until it stops; what ends a piece early becomes one line
naming the address, file or store, with exit status 1 (`serve`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal, cast

import anyio
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.activator.settings import ActivatorSettings
from wakeful.deploy.appdir import AppDir, AppDirError, load_app_dir
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.errors import DeployError
from wakeful.domain.artifacts import ArtifactError
from wakeful.idle_monitor.monitor import IdleMonitorSettings
from wakeful.node.jail import IsolationUnavailable
from wakeful.node.settings import NodeSettings
from wakeful.store import StoreError, sqlite_url
from wakeful.store.backup import BackupError, Summary, backup, read_backup, restore
from wakeful.store.base import StoreBase
from wakeful.store.etcd import EtcdStore
from wakeful.store.etcd_auth import ROOT, common_name, enable_auth
from wakeful.store.settings import StoreSettings

from . import commands
from .bootstrap import run_activator, run_idle_monitor, run_ingress, run_node, run_up
from .commands import RUNTIME, USAGE, CliError
from .datadir import private_data_dir
from .process import signals_caught
from .remote import CliSettings, Endpoint
from .serving import AddressInUse, split_address


def _check_address(value: str, flag: str) -> str:
    try:
        split_address(value, flag)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return value


def load_apps(paths: Sequence[str]) -> list[AppDir]:
    """Every app directory is validated before anything starts or is written."""
    found = []
    for raw in paths:
        try:
            found.append(load_app_dir(Path(raw)))
        except AppDirError as exc:
            raise CliError(str(exc)) from None
    names = [a.definition.name for a in found]
    if len(set(names)) != len(names):
        raise CliError(f"two app directories name the same app: {sorted(names)}")
    return found


def _idle_settings(
    args: argparse.Namespace, default_interval: float | None = None
) -> IdleMonitorSettings:
    """The idle monitor's settings (WAKEFUL_IDLE_INTERVAL, WAKEFUL_RETIRED_RETENTION), with
    --idle-interval over them when given, and the command's own default tick otherwise."""
    settings = IdleMonitorSettings()
    if args.idle_interval is not None:
        return settings.model_copy(update={"idle_interval": args.idle_interval})
    if default_interval is not None and "idle_interval" not in settings.model_fields_set:
        return settings.model_copy(update={"idle_interval": default_interval})
    return settings


# -- up and the pieces on their own: settings, then bootstrap ------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    apps = load_apps(args.app_dirs)
    listen = _check_address(args.listen, "--listen")
    api = _check_address(args.api_listen, "--api-listen")
    admin = _check_address(args.admin_listen, "--admin-listen")
    idle = _idle_settings(args, default_interval=5.0)
    data_dir = Path(args.data_dir).absolute()
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(
            f"--data-dir {data_dir}: cannot create it: {exc.strerror}", RUNTIME
        ) from None
    _serve(
        lambda: run_up(
            data_dir=data_dir,
            api=api,
            listen=listen,
            admin=admin,
            app_dirs=apps,
            idle=idle,
            announce=commands.say,
            isolation=args.isolation,
        ),
        store=f"the store in {data_dir}",
        uvloop=True,
    )
    return 0


def _serve(main: Callable[[], Awaitable[None]], *, store: str, uvloop: bool = False) -> None:
    """Run a long-lived piece until it stops. What ends it early (a taken port, a file it may
    not write, a store it cannot open) becomes one line naming the address, file or store,
    however deep in its task groups it was raised, and exit status 1."""

    async def caught() -> None:
        with signals_caught():  # before anything starts (`signals_caught`)
            await main()

    try:
        anyio.run(caught, backend_options={"use_uvloop": uvloop})
    except (OSError, StoreError, IsolationUnavailable, DeployError, BaseExceptionGroup) as raised:
        cause = _single_cause(raised)
        if isinstance(cause, AddressInUse):  # bind() names the flag and the address
            raise CliError(str(cause), RUNTIME) from None
        if isinstance(cause, DeployError):  # an app `wakeful up` was given is refused
            raise CliError(f"deploy refused: {cause}", USAGE) from None
        if isinstance(cause, IsolationUnavailable):  # says how to install bubblewrap
            raise CliError(str(cause), RUNTIME) from None
        if isinstance(cause, StoreError):
            raise CliError(f"{store} cannot be used: {cause}", RUNTIME) from None
        if isinstance(cause, OSError):
            where = f"{cause.filename}: " if cause.filename else ""
            raise CliError(f"{where}{cause.strerror or cause}", RUNTIME) from None
        raise


def _single_cause(raised: BaseException) -> BaseException:
    """The one exception inside nested task-group exception groups (or the group itself)."""
    while isinstance(raised, BaseExceptionGroup) and len(raised.exceptions) == 1:
        raised = raised.exceptions[0]
    return raised


class RoleTokens(BaseSettings):
    """The token a node or an ingress on another machine calls the control API with."""

    model_config = SettingsConfigDict(env_prefix="WAKEFUL_", extra="ignore")
    node_token: SecretStr | None = None
    ingress_token: SecretStr | None = None


def _control_for(role: Literal["node", "ingress"], why: str) -> Endpoint:
    """A piece on another machine finds the control API through WAKEFUL_API, and calls it with
    its role's token (WAKEFUL_NODE_TOKEN, WAKEFUL_INGRESS_TOKEN). WAKEFUL_TOKEN, the admin
    token, is still taken in its place, with a warning: it can do everything."""
    settings = CliSettings()
    variable = f"WAKEFUL_{role.upper()}_TOKEN"
    own = getattr(RoleTokens(), f"{role}_token")
    if settings.api is None:
        raise CliError(f"WAKEFUL_API must be set: {why}")
    for url in Endpoint(settings.api, "").apis:  # one URL, or every activator's
        if cleartext_to_another_machine(url):
            commands.note(
                f"warning: WAKEFUL_API {url} is plain HTTP to another machine: this {role}'s "
                "token crosses the network readable; put a TLS proxy in front of the control "
                "API and use an https:// URL"
            )
    if own is not None:
        if settings.token is not None:
            commands.note(
                f"warning: WAKEFUL_TOKEN (the admin token) is set beside {variable}; it is not "
                f"used, but whoever takes over this {role} can read it: unset it here"
            )
        return Endpoint(settings.api, own.get_secret_value())
    if settings.token is None:
        raise CliError(
            f"{variable} must be set: {why} (make one with `wakeful tokens create --role "
            f"{role} --name NAME` against the control plane)"
        )
    commands.note(
        f"warning: {variable} is not set, so this {role} uses WAKEFUL_TOKEN, the admin token: "
        f"whoever takes over this machine can deploy, delete apps and make tokens with it. "
        f"Make a {role} token (`wakeful tokens create --role {role} --name NAME`), set "
        f"{variable} to it and unset WAKEFUL_TOKEN here; this fallback will go."
    )
    return Endpoint(settings.api, settings.token.get_secret_value())


def cmd_activator(args: argparse.Namespace) -> int:
    settings = ActivatorSettings()
    if settings.token is None:
        raise CliError("WAKEFUL_TOKEN must be set: it bootstraps the control API's admin token")
    host = split_address(settings.listen, "WAKEFUL_LISTEN")[0].strip("[]")
    if settings.advertise_url is None and host in ("0.0.0.0", "::", ""):
        raise CliError(
            f"WAKEFUL_LISTEN={settings.listen} listens on every address: set "
            "WAKEFUL_ADVERTISE_URL to the URL ingresses and nodes reach this activator at "
            "(the one their WAKEFUL_API names)"
        )
    idle = None if args.no_idle_monitor else _idle_settings(args)
    data_dir = Path(args.data_dir).absolute()
    _serve(
        lambda: run_activator(
            settings,
            data_dir,
            idle=idle,
            announce=commands.say,
            reset_admin=args.reset_admin_token,
        ),
        store=f"the store at {settings.store_url}",
    )
    return 0


def isolation_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--isolation",
        choices=["bwrap", "none"],
        default=None,
        help="bwrap (default, WAKEFUL_ISOLATION): each app in its own namespaces, uid and "
        "limits; none: apps run as this user and can read its files (trusted code only)",
    )


def cmd_node(args: argparse.Namespace) -> int:
    settings = NodeSettings()
    if args.isolation is not None:  # the flag beats WAKEFUL_ISOLATION
        settings = settings.model_copy(update={"isolation": args.isolation})
    control = _control_for("node", "nodes fetch artifacts from it and push logs to it")
    _serve(  # uvloop, as under `wakeful up`: a tunnel's every message crosses this loop
        lambda: run_node(settings, control, announce=commands.say),
        store=f"the store at {settings.store_url}",
        uvloop=True,
    )
    return 0


def cmd_ingress(args: argparse.Namespace) -> int:
    from wakeful.ingress import IngressSettings  # httptools and uvloop: only when it runs

    settings = IngressSettings()
    control = _control_for("ingress", "the ingress takes its leases from the activator")
    _serve(
        lambda: run_ingress(settings, control, announce=commands.say),
        store=f"the store at {settings.store_url}",
        uvloop=True,
    )
    return 0


def cmd_idle_monitor(args: argparse.Namespace) -> int:
    settings = IdleMonitorSettings()
    _serve(
        lambda: run_idle_monitor(settings, announce=commands.say),
        store=f"the store at {settings.store_url}",
    )
    return 0


def cmd_etcd_auth(args: argparse.Namespace) -> int:
    """etcd users and roles for the pieces, then authentication on (wakeful.store.etcd_auth)."""
    settings = StoreSettings()
    if not settings.store_url.startswith("etcd://"):
        raise CliError(f"etcd-auth needs WAKEFUL_STORE_URL=etcd://... (got {settings.store_url})")
    cert = settings.tls.cert
    if cert is None:
        raise CliError(
            "etcd-auth needs the root user's client certificate (common name root): set "
            "WAKEFUL_ETCD_CA, WAKEFUL_ETCD_CERT and WAKEFUL_ETCD_KEY"
        )
    name = common_name(cert)
    if name != ROOT:
        raise CliError(
            f"WAKEFUL_ETCD_CERT={cert} is for {name!r}, not {ROOT!r}: run etcd-auth with the "
            "root user's certificate, or turning authentication on would lock it out"
        )

    async def run() -> list[str]:
        async with settings.open_store() as store:
            assert isinstance(store, EtcdStore)
            return await enable_auth(store.client, settings.store_namespace)

    try:
        done = anyio.run(run)
    except StoreError as exc:
        raise CliError(f"etcd-auth: {exc}", RUNTIME) from None
    for line in done:
        commands.say(line)
    return 0


def _store_settings(data_dir: str) -> StoreSettings:
    """WAKEFUL_STORE_URL when set, else the store `wakeful up` keeps in the data directory."""
    settings = StoreSettings()
    if "WAKEFUL_STORE_URL" not in os.environ:
        where = Path(data_dir).absolute() / "store.db"
        settings = settings.model_copy(update={"store_url": sqlite_url(where)})
    return settings


def _store_path(settings: StoreSettings) -> Path | None:
    if not settings.store_url.startswith("sqlite:///"):
        return None
    return Path(settings.store_url.removeprefix("sqlite://"))


def cmd_backup(args: argparse.Namespace) -> int:
    settings = _store_settings(args.data_dir)
    path = _store_path(settings)
    if path is not None and not path.exists():
        raise CliError(f"no store at {path}: pass --data-dir, or set WAKEFUL_STORE_URL")
    target = Path(args.file).absolute()
    if not target.parent.is_dir():
        raise CliError(f"FILE {args.file}: its directory {target.parent} does not exist")

    artifacts = _artifacts(args.data_dir)

    async def read(digest: str) -> bytes | None:
        try:
            return await artifacts.fetch(digest)
        except ArtifactError:
            return None

    summary = _on_store(settings, "backup", lambda store: backup(store, target, read))
    commands.say(
        f"backed up {summary.records} records of {settings.store_url} (schema "
        f"{summary.schema}, revision {summary.revision}) and {summary.blobs} artifacts to "
        f"{target}"
    )
    return 0


def _artifacts(data_dir: str) -> LocalArtifacts:
    """WAKEFUL_ARTIFACT_DIR when set, else the data directory's, as the control plane has."""
    where = os.environ.get("WAKEFUL_ARTIFACT_DIR") or str(Path(data_dir) / "artifacts")
    return LocalArtifacts(Path(where).absolute())


def cmd_restore(args: argparse.Namespace) -> int:
    settings = _store_settings(args.data_dir)
    source = Path(args.file).absolute()
    try:
        read_backup(source)  # a bad file is refused before the store is touched
    except BackupError as exc:
        raise CliError(f"restore: {exc}") from None
    path = _store_path(settings)
    if path is not None:
        private_data_dir(path.parent)

    artifacts = _artifacts(args.data_dir)

    async def write(digest: str, data: bytes) -> None:
        await artifacts.put(data, expected=digest)

    summary = _on_store(settings, "restore", lambda store: restore(store, source, write))
    commands.say(
        f"restored {summary.records} records (schema {summary.schema}) and {summary.blobs} "
        f"artifacts into {settings.store_url}; start the control plane on it"
    )
    return 0


def _on_store(
    settings: StoreSettings, what: str, operation: Callable[[StoreBase], Awaitable[Summary]]
) -> Summary:
    """`operation` on the store `settings` name; its errors become one line naming it."""
    url = settings.store_url

    async def run() -> Summary:
        async with settings.open_store() as store:
            return await operation(cast(StoreBase, store))

    try:
        return anyio.run(run)
    except BackupError as exc:
        raise CliError(f"{what}: {exc}", RUNTIME) from None
    except StoreError as exc:
        raise CliError(f"{what}: the store at {url} cannot be used: {exc}", RUNTIME) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise CliError(f"{what}: {where}{exc.strerror or exc}", RUNTIME) from None


# -- commands that talk to a running control plane -----------------------------------------


def cleartext_to_another_machine(url: str) -> bool:
    """`http://` to a host that is not this machine's loopback."""
    scheme, _, rest = url.partition("://")
    if scheme != "http":
        return False
    host = rest.split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: another machine as far as we can tell
