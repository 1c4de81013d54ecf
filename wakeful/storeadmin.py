"""The commands that work on a store directly, with no control plane running: `etcd-auth`,
`backup` and `restore`.

Each reads its store from WAKEFUL_STORE_URL (`StoreSettings`; `backup` and `restore` fall back
on the store `wakeful up` keeps in --data-dir) and turns what fails into one line naming the
store or the file, with exit status 1.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import anyio

from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.domain.artifacts import ArtifactError
from wakeful.store import StoreError, sqlite_url
from wakeful.store.backup import BackupError, Summary, backup, read_backup, restore
from wakeful.store.base import StoreBase
from wakeful.store.etcd import EtcdStore
from wakeful.store.etcd_auth import ROOT, common_name, enable_auth
from wakeful.store.settings import StoreSettings

from . import commands
from .commands import RUNTIME, CliError
from .datadir import private_data_dir
from .failures import os_error_text, single_cause


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

    # An artifact not found names the directory looked in (WAKEFUL_ARTIFACT_DIR unset?).
    what = f"backup (artifacts from {_artifact_dir(args.data_dir)})"
    summary = _on_store(settings, what, lambda store: backup(store, target, read))
    commands.say(
        f"backed up {summary.records} records of {settings.store_url} (schema "
        f"{summary.schema}, revision {summary.revision}) and {summary.blobs} artifacts to "
        f"{target}"
    )
    return 0


def _artifact_dir(data_dir: str) -> Path:
    """WAKEFUL_ARTIFACT_DIR when set, else the data directory's, as the control plane has."""
    where = os.environ.get("WAKEFUL_ARTIFACT_DIR") or str(Path(data_dir) / "artifacts")
    return Path(where).absolute()


def _artifacts(data_dir: str) -> LocalArtifacts:
    return LocalArtifacts(_artifact_dir(data_dir))


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
    except (BackupError, StoreError, OSError, BaseExceptionGroup) as raised:
        exc = single_cause(raised)  # raised inside the store's task group, it comes in one
        if isinstance(exc, BackupError):
            raise CliError(f"{what}: {exc}", RUNTIME) from None
        if isinstance(exc, StoreError):
            raise CliError(f"{what}: the store at {url} cannot be used: {exc}", RUNTIME) from None
        if isinstance(exc, OSError):
            raise CliError(f"{what}: {os_error_text(exc)}", RUNTIME) from None
        raise
