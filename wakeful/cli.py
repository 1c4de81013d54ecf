"""The `wakeful` command.

    wakeful up [APP_DIR ...]     every piece in one process on the embedded store
    wakeful deploy APP_DIR       deploy to a running control plane
    wakeful status [APP]         pools: desired, live, ready, leased, waiters
    wakeful apps | versions APP | logs APP | rollback APP | delete APP
    wakeful activator | node | ingress | idle-monitor
                                 run one piece against a shared store (etcd)

Errors name the flag, file or field and the value, and exit with status 2 (usage) or 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.deploy.appdir import AppDir, AppDirError, load_app_dir
from wakeful.domain.models import describe_validation_error
from wakeful.store import StoreError

from .bootstrap import CONTROL_FILE, AddressInUse, split_address

log = logging.getLogger("wakeful")


USAGE = 2
"""Exit status for a command line or configuration that cannot work (a flag, a file, a
variable): nothing was tried."""
RUNTIME = 1
"""Exit status for a failure while doing the work (nothing to talk to, a refusal, a port)."""


class CliError(Exception):
    """A failure the user can act on: printed as one line, exit USAGE or RUNTIME."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


class CliSettings(BaseSettings):
    """How CLI commands find a control plane: flags, then WAKEFUL_API/WAKEFUL_TOKEN, then the
    control file `wakeful up` writes in its data directory."""

    model_config = SettingsConfigDict(env_prefix="WAKEFUL_", extra="ignore")
    api: str | None = None
    token: SecretStr | None = None


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _check_address(value: str, flag: str) -> str:
    try:
        split_address(value, flag)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return value


def _load_apps(paths: Sequence[str]) -> list[AppDir]:
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


def _idle_settings(args: argparse.Namespace, default_interval: float | None = None) -> Any:
    """The idle monitor's settings (WAKEFUL_IDLE_INTERVAL, WAKEFUL_RETIRED_RETENTION), with
    --idle-interval over them when given, and the command's own default tick otherwise."""
    from wakeful.idle_monitor.monitor import IdleMonitorSettings

    settings = IdleMonitorSettings()
    if args.idle_interval is not None:
        return settings.model_copy(update={"idle_interval": args.idle_interval})
    if default_interval is not None and "idle_interval" not in settings.model_fields_set:
        return settings.model_copy(update={"idle_interval": default_interval})
    return settings


# -- up ---------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from .bootstrap import run_up

    apps = _load_apps(args.app_dirs)
    listen = _check_address(args.listen, "--listen")
    api = _check_address(args.api_listen, "--api-listen")
    admin = _check_address(args.admin_listen, "--admin-listen")
    data_dir = Path(args.data_dir).absolute()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(
            f"--data-dir {data_dir}: cannot create it: {exc.strerror}", RUNTIME
        ) from None

    def announce(line: str) -> None:
        print(line, flush=True)

    try:
        anyio.run(
            lambda: run_up(
                data_dir=data_dir,
                api=api,
                listen=listen,
                admin=admin,
                app_dirs=apps,
                idle=_idle_settings(args, default_interval=5.0),
                announce=announce,
            ),
            backend_options={"use_uvloop": True},
        )
    except AddressInUse as exc:  # bind() names the flag and the address
        raise CliError(str(exc), RUNTIME) from None
    except StoreError as exc:
        raise CliError(f"the store in {data_dir} cannot be used: {exc}", RUNTIME) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise CliError(f"{where}{exc.strerror or exc}", RUNTIME) from None
    return 0


# -- talking to a running control plane ---------------------------------------------------


def _control(args: argparse.Namespace) -> httpx.Client:
    settings = CliSettings()
    api = args.api or settings.api
    token = settings.token.get_secret_value() if settings.token else None
    control = Path(args.data_dir) / CONTROL_FILE
    if (api is None or token is None) and control.exists():
        recorded = json.loads(control.read_text())
        api = api or recorded["api"]
        token = token or recorded["token"]
    if api is None or token is None:
        raise CliError(
            f"no running control plane found: {control} does not exist; start `wakeful up`, "
            "or pass --api and set WAKEFUL_TOKEN",
            RUNTIME,
        )
    return httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _checked(answer: httpx.Response) -> Any:
    if answer.is_success:
        return answer.json() if answer.content else None
    try:
        body = answer.json()
        reason = f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        reason = answer.text[:300]
    raise CliError(f"the control plane answered {answer.status_code}: {reason}", RUNTIME)


def _request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    try:
        with _control(args) as client:
            return _checked(client.request(method, path, **kwargs))
    except httpx.TransportError as exc:
        raise CliError(f"cannot reach the control plane: {exc}", RUNTIME) from None


def cmd_deploy(args: argparse.Namespace) -> int:
    from wakeful.domain.artifacts import digest_of, pack

    (app_dir,) = _load_apps([args.app_dir])
    data = pack(app_dir.path)
    digest = digest_of(data)
    _request(args, "PUT", f"/v1/artifacts/{digest}", content=data)
    body = {"definition": app_dir.definition.model_dump(mode="json"), "artifact": digest}
    report = _request(args, "POST", "/v1/deploys", json=body)
    return _follow(args, report)


def _follow(args: argparse.Namespace, report: dict[str, Any]) -> int:
    print(report["message"], flush=True)
    last = report["message"]
    while report["phase"] == "rolling":
        time.sleep(0.5)
        report = _request(args, "GET", f"/v1/deploys/{report['app']}/{report['version']}")
        if report["message"] != last:
            print(report["message"], flush=True)
            last = report["message"]
    return 1 if report["phase"] == "failed" else 0


def cmd_rollback(args: argparse.Namespace) -> int:
    report = _request(args, "POST", f"/v1/apps/{args.app}/rollback")
    return _follow(args, report)


def cmd_delete(args: argparse.Namespace) -> int:
    report = _request(args, "DELETE", f"/v1/apps/{args.app}")
    pools = report["pools"]
    print(
        f"deleted {args.app}: {report['versions']} version(s), "
        f"{report['artifacts_removed']} artifact(s); its sandboxes finish their requests and stop",
        flush=True,
    )
    if args.no_wait:
        return 0
    while True:
        left = [p for p in _request(args, "GET", "/v1/pools") if p["pool"] in pools]
        if not left:
            print(f"{args.app} is gone", flush=True)
            return 0
        time.sleep(0.5)


def cmd_status(args: argparse.Namespace) -> int:
    pools = _request(args, "GET", "/v1/pools")
    if args.app:
        pools = [p for p in pools if p["app"] == args.app]
    if args.json:
        print(json.dumps(pools, indent=2))
        return 0
    columns = [
        "pool",
        "app",
        "version",
        "state",
        "desired_instances",
        "live",
        "ready",
        "leased",
        "overflow",
        "waiters",
    ]
    headers = [
        "POOL",
        "APP",
        "VERSION",
        "STATE",
        "DESIRED",
        "LIVE",
        "READY",
        "LEASED",
        "OVERFLOW",
        "WAITERS",
    ]
    # A retired pool's size is nobody's target: show its state, not a number.
    rows = [
        ["-" if c == "desired_instances" and p["state"] != "active" else str(p[c]) for c in columns]
        for p in pools
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    return 0


def cmd_apps(args: argparse.Namespace) -> int:
    for app in _request(args, "GET", "/v1/apps"):
        print(
            f"{app['name']}  active={app['active_version']}  versions={','.join(app['versions'])}"
        )
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    for app in _request(args, "GET", "/v1/apps"):
        if app["name"] == args.app:
            for version in app["versions"]:
                marker = "*" if version == app["active_version"] else " "
                print(f"{marker} {version}")
            return 0
    raise CliError(f"no app named {args.app!r}", RUNTIME)


def cmd_nodes(args: argparse.Namespace) -> int:
    for node in _request(args, "GET", "/v1/nodes"):
        state = "evacuating" if node["evacuating"] else "cordoned" if node["cordoned"] else "ready"
        if not node["registered"]:
            state += " (not registered)"
        print(f"{node['name']}  {state}  sandboxes={node['sandboxes']}")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    if args.undo:
        _request(args, "DELETE", f"/v1/nodes/{args.node}/drain")
        print(f"{args.node} takes new sandboxes again")
        return 0
    _request(
        args,
        "POST",
        f"/v1/nodes/{args.node}/drain",
        params={"evacuate": args.evacuate, "force": args.force},
    )
    if not args.evacuate:
        print(f"{args.node} is cordoned: no new sandboxes; the ones there keep running")
        return 0
    print(f"evacuating {args.node}: replacing its sandboxes elsewhere, then draining them")
    last = None
    while True:
        found = [n for n in _request(args, "GET", "/v1/nodes") if n["name"] == args.node]
        left = found[0]["sandboxes"] if found else 0
        if left != last:
            print(f"  {left} sandbox(es) left on {args.node}", flush=True)
            last = left
        if left == 0:
            return 0
        time.sleep(0.5)


def cmd_logs(args: argparse.Namespace) -> int:
    """The output nodes pushed to the control plane. When some of it has not arrived (a node
    not heard from lately, output still buffered or lost there), a note says so on stderr."""
    try:
        with _control(args) as client:
            seen: list[str] = []
            noted = ""
            while True:
                answer = client.get(
                    f"/v1/apps/{quote(args.app, safe='')}/logs", params={"tail": args.tail}
                )
                text = answer.text if answer.is_success else ""
                if not answer.is_success:
                    _checked(answer)
                note = answer.headers.get("Wakeful-Logs-Behind", "")
                if note and note != noted:
                    print(f"wakeful: note: logs behind: {note}", file=sys.stderr, flush=True)
                noted = note
                lines = text.splitlines()
                fresh = lines[len(seen) :] if lines[: len(seen)] == seen else lines
                for line in fresh:
                    print(line, flush=True)
                seen = lines
                if not args.follow:
                    return 0
                time.sleep(1)
    except httpx.TransportError as exc:
        raise CliError(f"cannot reach the control plane: {exc}", RUNTIME) from None


# -- pieces on their own --------------------------------------------------------------------


def _control_credentials(why: str) -> tuple[str, str]:
    cli = CliSettings()
    if cli.api is None or cli.token is None:
        raise CliError(f"WAKEFUL_API and WAKEFUL_TOKEN must be set: {why}")
    return cli.api, cli.token.get_secret_value()


def cmd_activator(args: argparse.Namespace) -> int:
    from wakeful.activator.settings import ActivatorSettings

    from .bootstrap import control_plane, wait_for_signal

    settings = ActivatorSettings()
    if settings.token is None:
        raise CliError("WAKEFUL_TOKEN must be set: the control API refuses to run without a token")
    data_dir = Path(args.data_dir).absolute()

    async def main() -> None:
        async with (
            settings.open_store() as store,
            control_plane(
                store,
                settings,
                data_dir,
                idle=None if args.no_idle_monitor else _idle_settings(args),
                drain_grace=settings.lease_ttl,
            ),
        ):
            print(f"activator listening on http://{settings.listen}", flush=True)
            await wait_for_signal()

    anyio.run(main)
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    from wakeful.node.agent import NodeAgent
    from wakeful.node.settings import NodeSettings

    from .bootstrap import wait_for_signal
    from .remote import HttpArtifacts, HttpLogSink

    settings = NodeSettings()
    api, token = _control_credentials("nodes fetch artifacts from it and push logs to it")

    async def main() -> None:
        async with (
            settings.open_store() as store,
            HttpArtifacts(api, token) as artifacts,
            HttpLogSink(api, token) as logs,
        ):
            agent = NodeAgent(store, settings, artifacts, logs=logs)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(agent.run)
                print(f"node {settings.node_name} running", flush=True)
                await wait_for_signal()
                tasks.cancel_scope.cancel()

    anyio.run(main)
    return 0


def cmd_ingress(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from wakeful.activator.client import HttpLeases
    from wakeful.ingress import IngressSettings, serve

    settings = IngressSettings()
    api, token = _control_credentials("the ingress asks the activator")

    async def main() -> None:
        async with (
            settings.open_store() as store,
            HttpLeases(api, token) as leases,
        ):
            print(f"ingress listening on http://{settings.listen}", flush=True)
            await serve(settings, leases, store, CollectorRegistry())

    anyio.run(main, backend_options={"use_uvloop": True})
    return 0


def cmd_idle_monitor(args: argparse.Namespace) -> int:
    from wakeful.idle_monitor.monitor import IdleMonitor, IdleMonitorSettings

    from .bootstrap import wait_for_signal

    settings = IdleMonitorSettings()

    async def main() -> None:
        async with (
            settings.open_store() as store,
            anyio.create_task_group() as tasks,
        ):
            monitor = IdleMonitor(
                store, interval=settings.idle_interval, retention=settings.retired_retention
            )
            tasks.start_soon(monitor.run)
            print(f"idle monitor: every {settings.idle_interval:g} s", flush=True)
            await wait_for_signal()
            tasks.cancel_scope.cancel()

    anyio.run(main)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wakeful", description=__doc__.split("\n\n")[0])
    parser.set_defaults(data_dir=".wakeful", api=None, verbose=False)
    # The global flags, accepted before or after the subcommand (`wakeful up --data-dir D`).
    # SUPPRESS: a subcommand sets them only when given there, so it never resets them.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for flags in (parser, common):
        flags.add_argument("--data-dir", help="state directory (default ./.wakeful)")
        flags.add_argument("--api", help="control API URL (default: from --data-dir)")
        flags.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser
    sub.add_parser = functools.partial(add_parser, parents=[common])  # type: ignore[method-assign]

    up = sub.add_parser("up", help="run everything in one process on the embedded store")
    up.add_argument("app_dirs", nargs="*", metavar="APP_DIR")
    up.add_argument("--listen", default="127.0.0.1:8080", help="ingress address")
    up.add_argument(
        "--api-listen", default="127.0.0.1:8082", help="control API address (host:port)"
    )
    up.add_argument(
        "--admin-listen", default="127.0.0.1:8081", help="ingress admin address (metrics)"
    )
    up.add_argument(
        "--idle-interval",
        type=float,
        default=None,
        help="idle monitor tick, seconds (default WAKEFUL_IDLE_INTERVAL, else 5)",
    )
    up.set_defaults(func=cmd_up)

    deploy = sub.add_parser("deploy", help="deploy an app directory")
    deploy.add_argument("app_dir", metavar="APP_DIR")
    deploy.set_defaults(func=cmd_deploy)

    status = sub.add_parser("status", help="pool sizes and load")
    status.add_argument("app", nargs="?")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    sub.add_parser("apps", help="list apps").set_defaults(func=cmd_apps)
    versions = sub.add_parser("versions", help="list an app's versions")
    versions.add_argument("app")
    versions.set_defaults(func=cmd_versions)
    logs = sub.add_parser("logs", help="an app's sandbox logs")
    logs.add_argument("app")
    logs.add_argument("--follow", "-f", action="store_true")
    logs.add_argument("--tail", type=int, default=200)
    logs.set_defaults(func=cmd_logs)
    sub.add_parser("nodes", help="nodes and their drain state").set_defaults(func=cmd_nodes)
    drain = sub.add_parser("drain", help="move every sandbox off a node (--undo to uncordon)")
    drain.add_argument("node")
    drain.add_argument(
        "--no-evacuate",
        dest="evacuate",
        action="store_false",
        help="only cordon: take no new sandboxes, keep the ones there",
    )
    drain.add_argument("--undo", action="store_true", help="uncordon the node")
    drain.add_argument(
        "--force", action="store_true", help="cordon a name no node has registered under yet"
    )
    drain.set_defaults(func=cmd_drain)
    delete = sub.add_parser("delete", help="delete an app: its route, versions and sandboxes")
    delete.add_argument("app")
    delete.add_argument(
        "--no-wait", action="store_true", help="return at once; sandboxes stop in the background"
    )
    delete.set_defaults(func=cmd_delete)
    rollback = sub.add_parser("rollback", help="go back to the previous version")
    rollback.add_argument("app")
    rollback.set_defaults(func=cmd_rollback)

    activator = sub.add_parser("activator", help="the activator and control API (WAKEFUL_*)")
    activator.add_argument(
        "--idle-interval",
        type=float,
        default=None,
        help="idle monitor tick, seconds (default WAKEFUL_IDLE_INTERVAL, else 30)",
    )
    activator.set_defaults(func=cmd_activator)
    activator.add_argument(
        "--no-idle-monitor", action="store_true", help="run `wakeful idle-monitor` apart instead"
    )
    sub.add_parser("node", help="a node agent (WAKEFUL_*)").set_defaults(func=cmd_node)
    sub.add_parser("ingress", help="the ingress (WAKEFUL_*)").set_defaults(func=cmd_ingress)
    sub.add_parser("idle-monitor", help="the idle monitor (WAKEFUL_*)").set_defaults(
        func=cmd_idle_monitor
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        code: int = args.func(args)
    except CliError as exc:
        print(f"wakeful: error: {exc}", file=sys.stderr)
        return exc.code
    except ValidationError as exc:  # settings from WAKEFUL_* variables
        print(f"wakeful: error: {describe_validation_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
