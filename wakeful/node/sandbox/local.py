"""The real `Runtime`: sandboxes as local processes, each in its own process group, isolated
in a `jail.bwrap.Jail` when the runtime has one.

A start takes one of three paths: unisolated (the app's files unpacked into its directory, the
command run there); isolated from a warm slot (`sandbox.slots`: a sandbox started ahead of
time, its tree sized and filled for the app, then told what to run); or isolated cold (the
app's uid, cgroup and bounded tmpfs made now, then the bubblewrap chain spawned, the app's
environment handed to it in a file in memory (`memfile`), never on a command line or a disk).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from wakeful.aio.spawn import spawn
from wakeful.domain.models import ImageRecord
from wakeful.node.images import BlobSource, ImageCache
from wakeful.node.jail.bwrap import CHAIN_ENV, Jail, env_script, slot_main
from wakeful.node.jail.detect import detect_jail
from wakeful.node.jail.jailed import Jailed, memfile
from wakeful.node.jail.network import control_endpoints
from wakeful.node.jail.tmpfs import (
    chown_tree,
    fill_app_dir,
    mount_sandbox_fs,
    resize_sandbox_fs,
)
from wakeful.node.jail.uids import UidTable
from wakeful.node.settings import NodeSettings

from .image_start import ImageStarts
from .output import MAX_LOG_BYTES
from .process import LocalProcess
from .runtime import UNNAMED, Identity, ImageRun, ImageTrees, Runtime
from .slots import Slot, SlotPool
from .workdir import Packed, fill_workdir, sandbox_dir

log = logging.getLogger(__name__)


def _guarded(command: Sequence[str]) -> list[str]:
    """Wrap the command so the sandbox gets SIGKILL if the node agent dies (Linux's parent-death
    signal, set by util-linux's `setpriv`, survives exec). Without it, shutdown still stops
    every sandbox; only a crashed agent could leave one behind."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return list(command)
    return [setpriv, "--pdeathsig", "KILL", "--", *command]


class ProcessRuntime:
    """Sandboxes as local processes; isolated when given a `Jail` (wakeful.node.jail.bwrap)."""

    def __init__(
        self,
        max_log_bytes: int = MAX_LOG_BYTES,
        *,
        jail: Jail | None = None,
        uids: UidTable | None = None,
        warm_slots: int = 0,
        slot_homes: Path | None = None,
        images: ImageTrees | None = None,
    ) -> None:
        """`slot_homes`: where warm slots keep their directories (the node's sandbox
        directories); needed for `warm_slots`. `images`: the node's image cache, for apps
        that run an image."""
        self._max_log_bytes = max_log_bytes
        self.images = images
        self._images = ImageStarts(jail, uids, images)
        self._jail = jail
        self._uids = uids
        if jail is not None and jail.as_root and uids is None:
            raise ValueError("an isolating runtime run as root needs a UidTable")
        self.slots: SlotPool | None = None
        """Sandboxes started ahead of time (wakeful.node.sandbox.slots); only as root, with
        cgroups and a Python visible inside."""
        if (
            jail is not None
            and jail.as_root
            and jail.cgroups is not None
            and jail.slot_python is not None
            and warm_slots > 0
        ):
            if slot_homes is None:
                raise ValueError("warm slots need a directory for their trees (slot_homes)")
            self.slots = SlotPool(jail, jail.cgroups, warm_slots, slot_homes)

    @property
    def freezer(self) -> Path | None:
        """The freezer hierarchy's `wakeful/` where a cgroup freezes sandboxes, else None
        (SIGSTOP stops nothing SIGKILL cannot end: no thaw guard is needed then)."""
        if self._jail is None or self._jail.cgroups is None:
            return None
        return self._jail.cgroups.freezer

    async def keep_warm(self) -> None:
        """Keep the warm slots filled until cancelled (returns at once without slots)."""
        if self.slots is not None:
            await self.slots.run()

    @property
    def jail(self) -> Jail | None:
        return self._jail

    async def start(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        workdir: Path,
        log_path: Path,
        identity: Identity = UNNAMED,
        packed: Packed | None = None,
        image: ImageRun | None = None,
    ) -> LocalProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if image is not None:
            started = await self._images.start(command, env, workdir, identity, image)
            await self._save_uids()
            return LocalProcess(
                started.process,
                log_path,
                self._max_log_bytes,
                started.jailed,
                app_dir=started.root,
                keep_tree=identity.stateful,
            )
        jailed: Jailed | None = None
        argv, chain_env, cwd = _guarded(command), dict(env), workdir
        fds: tuple[int, ...] = ()
        if self._jail is None and packed is not None:
            await asyncio.to_thread(fill_workdir, workdir, packed)
        if self._jail is not None:
            pool, slot = self.slots, None
            if pool is not None and not identity.stateful:
                slot = await pool.take(identity.sandbox_id, identity.limits)
            if pool is not None and slot is not None:
                return await self._launch(
                    pool, slot, command, env, _placer(workdir, packed), log_path, identity
                )
            jailed = await asyncio.to_thread(self._enter, workdir, identity, packed)
            made: list[int] = []
            try:  # each made is closed, and the tree released, whatever fails before the start
                env_fd = memfile("env", env_script(dict(env)))
                made.append(env_fd)
                if jailed.uid is not None:  # read by the chain's last step, as the app's uid
                    os.fchown(env_fd, jailed.uid, jailed.uid)
                seccomp_fd = None
                if self._jail.seccomp is not None:
                    seccomp_fd = memfile("seccomp", self._jail.seccomp)
                    made.append(seccomp_fd)
                slot_fd = None
                if self._jail.scope:  # the scope step runs the slot program
                    slot_fd = memfile("slot_main", slot_main())
                    made.append(slot_fd)
                argv = self._jail.command(
                    list(command),
                    workdir if jailed.mounted is None else jailed.mounted,
                    identity.limits,
                    jailed.uid,
                    jailed.cgroup,
                    env_fd,
                    seccomp_fd,
                    slot_fd,
                )
            except BaseException:
                for fd in made:
                    os.close(fd)
                jailed.release()
                raise
            fds = tuple(made)
            chain_env, cwd = dict(CHAIN_ENV), Path("/")
        try:
            process = await spawn(argv, cwd=cwd, env=chain_env, pass_fds=fds)
        except BaseException:
            if jailed is not None:
                jailed.release()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        await self._save_uids()
        mounted = None if jailed is None else jailed.mounted
        return LocalProcess(
            process,
            log_path,
            self._max_log_bytes,
            jailed,
            app_dir=workdir if mounted is None else mounted / "app",
            keep_tree=identity.stateful,
        )

    def image_refusal(self) -> str | None:
        """Why this node cannot run an image app (None: it can)."""
        return self._images.refusal()

    async def warm(self, image: ImageRecord, app: str) -> None:
        """Unpack `app`'s image into the cache ahead of its first start (`Warming`)."""
        await self._images.warm(image, app)
        await self._save_uids()  # the uid it gave the app, claimed machine-wide

    async def _launch(
        self,
        pool: SlotPool,
        slot: Slot,
        command: Sequence[str],
        env: Mapping[str, str],
        place: Callable[[Path, int], None],
        log_path: Path,
        identity: Identity,
    ) -> LocalProcess:
        """Start from a warm slot: its tree sized and filled for the app, then the message."""
        jail, uids = self._jail, self._uids
        assert jail is not None and uids is not None
        jailed: Jailed | None = None
        try:
            jailed = await asyncio.to_thread(self._enter_slot, slot, place, identity)
            assert jailed.uid is not None
            rlimits = jail.rlimits(identity.limits, jailed.uid)
            process = await slot.launch(list(command), dict(env), rlimits, jailed.uid, jail.scope)
        except BaseException:
            pool.settle()
            await slot.discard()
            if jailed is not None:
                jailed.release()
            raise
        await self._save_uids()
        return LocalProcess(
            process, log_path, self._max_log_bytes, jailed, pool.settle, app_dir=slot.tree / "app"
        )

    async def _save_uids(self) -> None:
        """After the exec, off the start's critical path (`UidTable`); a table that cannot be
        written only costs the uid's stability across an agent restart."""
        if self._uids is not None:
            try:
                await asyncio.to_thread(self._uids.save)
            except OSError as exc:
                log.warning("cannot record sandbox uids: %s", exc)

    def _enter_slot(
        self, slot: Slot, place: Callable[[Path, int], None], identity: Identity
    ) -> Jailed:
        assert self._uids is not None
        uid = self._uids.uid(identity.app)
        jailed = Jailed(identity.limits, uid)
        jailed.cgroup = slot.cgroup
        jailed.home = slot.home
        jailed.mounted = slot.tree
        resize_sandbox_fs(slot.tree, identity.limits.disk)
        fill_app_dir(slot.tree, uid, place)
        return jailed

    def _enter(self, workdir: Path, identity: Identity, packed: Packed | None) -> Jailed:
        """The sandbox's uid, cgroup and bounded writable copy of its directory."""
        jail = self._jail
        assert jail is not None
        uid = self._uids.uid(identity.app) if jail.as_root and self._uids else None
        jailed = Jailed(identity.limits, uid)
        try:
            if uid is None and packed is not None:
                fill_workdir(workdir, packed)  # the sandbox runs in it
            if uid is not None:
                tree = workdir.with_name("fs")
                # Charged to the sandbox's memory cgroup when there is one; without, it is
                # charged to nothing, so it may not exceed the memory limit either.
                limits = identity.limits
                size = limits.disk if jail.cgroups else min(limits.disk, limits.memory)
                mount_sandbox_fs(tree, size)
                jailed.mounted = tree
                fill_app_dir(tree, uid, _placer(workdir, packed))
            if jail.cgroups is not None:
                jail.cgroups.sweep()
                made = jail.cgroups.sandbox(identity.sandbox_id)
                jailed.cgroup = made
                made.create(identity.limits)
        except BaseException:
            jailed.release()
            raise
        return jailed


def _placer(workdir: Path, packed: Packed | None) -> Callable[[Path, int], None]:
    """What fills a sandbox's own `app/` directory for a uid: the artifact unpacked, or a copy
    of `workdir`."""
    if packed is not None:
        return packed.unpack_into

    def copy(app: Path, uid: int) -> None:
        shutil.copytree(workdir, app, symlinks=True, dirs_exist_ok=True)
        chown_tree(app, uid)

    return copy


def runtime_for(
    settings: NodeSettings, control_plane: Sequence[str] = (), blobs: BlobSource | None = None
) -> ProcessRuntime:
    """The runtime the settings ask for; IsolationUnavailable when this machine cannot.
    `control_plane`: URLs of the control API and the store, which sandboxes must not reach.
    `blobs`: where image apps' blobs come from (the control plane); None: no image apps."""
    if settings.isolation == "none":
        log.warning(
            "isolation is off (--isolation=none): apps run as this user and can read the "
            "control plane's files and tokens; run only code you trust"
        )
        return ProcessRuntime()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    urls = (settings.store_url, *control_plane)
    refused = control_endpoints(urls)
    networks = settings.refused_networks()
    jail = detect_jail(
        settings.data_dir,
        settings.sandbox_paths,
        refused,
        networks,
        probe_uid=settings.sandbox_uids[0],
    )
    jail = dataclasses.replace(jail, control_urls=urls)
    log.info("sandboxes are isolated: %s", jail.describe())
    uids = (
        UidTable(settings.data_dir / "uids.json", uids=settings.sandbox_uids)
        if jail.as_root
        else None
    )
    homes = sandbox_dir(settings.data_dir, "-").parent
    images = None
    if blobs is not None:
        images = ImageCache(
            settings.data_dir / "images",
            blobs,
            max_bytes=settings.image_max_bytes,
            max_unpacked=settings.image_max_unpacked,
            max_files=settings.image_max_files,
            max_cache_bytes=settings.image_cache,
        )
    return ProcessRuntime(
        jail=jail,
        uids=uids,
        warm_slots=settings.warm_slots,
        slot_homes=homes,
        images=images,
    )


def isolation_of(runtime: Runtime) -> str:
    if not isinstance(runtime, ProcessRuntime):
        return f"{type(runtime).__name__} (not a process runtime)"
    jail = runtime.jail
    return "none: apps run unisolated (--isolation=none)" if jail is None else jail.describe()
