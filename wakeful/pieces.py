"""The long-lived pieces of the `wakeful` command: `up`, `activator`, `node`, `ingress`,
`idle-monitor`. Each turns its arguments and WAKEFUL_* variables into settings, hands them to
`wakeful.together` or `wakeful.apart` (imported only then: the server stack is ~2 s of imports
that `wakeful deploy` or `wakeful status` would pay for nothing), and runs it until it stops;
what ends a piece early becomes one line naming the address, file or store, with exit status
1 (`_serve`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.activator.settings import ActivatorSettings
from wakeful.deploy.appdir import AppDir, AppDirError, load_app_dir
from wakeful.deploy.errors import DeployError
from wakeful.idle_monitor.monitor import IdleMonitorSettings
from wakeful.node.jail import IsolationUnavailable
from wakeful.node.registration import NodeTaken
from wakeful.node.settings import NodeSettings
from wakeful.oci import ImageError
from wakeful.secrets.errors import KeysUnusable
from wakeful.store import StoreError
from wakeful.store.held import HolderRunning

from . import build_commands, commands
from .commands import RUNTIME, USAGE, CliError
from .failures import os_error_text, single_cause
from .process import signals_caught, wait_for_signal
from .remote import CliSettings, Endpoint
from .serving import AddressInUse, split_address
from .startcheck import TokenRefused
from .up import WorkersFailed

if TYPE_CHECKING:  # the ingress (httptools, uvloop) is imported only by what runs one
    from wakeful.ingress.settings import IngressSettings


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


UP_IGNORES = {
    "WAKEFUL_LISTEN": "the ingress listens on --listen",
    "WAKEFUL_ADMIN_LISTEN": "its metrics on --admin-listen",
    "WAKEFUL_STORE_URL": "its store is the SQLite file in --data-dir",
}
"""Variables of the pieces run on their own that `wakeful up` sets itself, and what it does."""


def ignored_by_up(environ: Mapping[str, str]) -> list[str]:
    """A line for each of `UP_IGNORES` set in `environ`: it is not what `wakeful up` uses."""
    return [
        f"{name} is not read by wakeful up (it is a piece's own, run apart): {instead}"
        for name, instead in UP_IGNORES.items()
        if environ.get(name)
    ]


def cmd_up(args: argparse.Namespace) -> int:
    from .together import run_up  # here: the server stack is for pieces, not the CLI

    for line in ignored_by_up(os.environ):
        commands.note(line)
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
    apps = [build_commands.build_for_up(app) for app in apps]  # once the flags are known good
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
    not write, a store it cannot open, a secrets key the store needs and it lacks) becomes one
    line naming the address, file, store or key, however deep in its task groups it was
    raised, and exit status 1."""

    async def caught() -> None:
        with signals_caught():  # before anything starts (`signals_caught`)
            await main()

    try:
        anyio.run(caught, backend_options={"use_uvloop": uvloop})
    except (
        OSError,
        StoreError,
        IsolationUnavailable,
        NodeTaken,
        HolderRunning,
        TokenRefused,
        DeployError,
        KeysUnusable,
        ImageError,
        WorkersFailed,
        BaseExceptionGroup,
    ) as raised:
        cause = single_cause(raised)
        if isinstance(cause, KeysUnusable):  # names the key id and the key directory
            raise CliError(str(cause), RUNTIME) from None
        if isinstance(cause, AddressInUse):  # bind() names the flag and the address
            raise CliError(str(cause), RUNTIME) from None
        if isinstance(cause, DeployError):  # an app `wakeful up` was given is refused
            raise CliError(f"deploy refused: {cause}", USAGE) from None
        if isinstance(cause, ImageError):  # its image: refused, or not pulled
            raise CliError(f"deploy refused: {cause}", USAGE) from None
        if isinstance(
            cause, IsolationUnavailable | WorkersFailed | NodeTaken | HolderRunning | TokenRefused
        ):
            raise CliError(str(cause), RUNTIME) from None
        if isinstance(cause, StoreError):
            raise CliError(f"{store} cannot be used: {cause}", RUNTIME) from None
        if isinstance(cause, OSError):
            raise CliError(os_error_text(cause), RUNTIME) from None
        raise


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
    from .apart import run_activator  # here: the server stack is for pieces, not the CLI

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
    from .apart import run_node  # here: the server stack is for pieces, not the CLI

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

    from .apart import run_ingress  # here: the server stack is for pieces, not the CLI

    chosen = {} if args.workers is None else {"ingress_workers": args.workers}
    settings = IngressSettings(**chosen)  # a bad count is a ValidationError naming it
    control = _control_for("ingress", "the ingress takes its leases from the activator")
    if settings.workers > 1:
        _supervise_workers(settings)
        return 0
    # A worker's readiness is its supervisor's to announce, once all are ready.
    announce = commands.say if settings.ingress_worker is None else _silent
    _serve(
        lambda: run_ingress(settings, control, announce=announce),
        store=f"the store at {settings.store_url}",
        uvloop=True,
    )
    return 0


def _silent(line: str) -> None:
    pass


def _supervise_workers(settings: IngressSettings) -> None:
    """`wakeful ingress --workers N`: N ingress processes (`wakeful.ingress.workers`)."""
    from wakeful.ingress.workers import supervise

    failed: list[str] = []

    async def main() -> None:
        why = await supervise(settings, announce=commands.say, wait_for_stop=wait_for_signal)
        if why is not None:
            failed.append(why)

    _serve(main, store=f"the store at {settings.store_url}", uvloop=True)
    if failed:
        raise CliError(failed[0], RUNTIME)


def cmd_idle_monitor(args: argparse.Namespace) -> int:
    from .apart import run_idle_monitor  # here: the server stack is for pieces, not the CLI

    settings = IdleMonitorSettings()
    _serve(
        lambda: run_idle_monitor(settings, announce=commands.say),
        store=f"the store at {settings.store_url}",
    )
    return 0


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
