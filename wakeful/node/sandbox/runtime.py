"""Running a sandbox as a local process: its own process group, a bounded log, prompt exit.

`Runtime` is the narrow interface the node agent needs; `ProcessRuntime` is the real one.
A sandbox's stdout and stderr go through a pipe into a log file that never grows past
`max_log_bytes` (it is rotated once to `<name>.1`), and the last lines stay in memory so a
crash can be reported with them. `pump` also hands every chunk it reads to a `forward`
callable (the node agent's log shipper), which must not block. Exit is noticed the moment
the process ends (we await it), not by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from wakeful.domain.models import Resources
from wakeful.node.jail.bwrap import CHAIN_ENV, Jail, env_script, slot_main
from wakeful.node.jail.jailed import Jailed, sealed, stop_tree
from wakeful.node.jail.tmpfs import (
    chown_tree,
    fill_app_dir,
    mount_sandbox_fs,
    resize_sandbox_fs,
)
from wakeful.node.jail.uids import UidTable

from .ports import listeners
from .slots import Slot, SlotPool
from .spawn import Child, spawn
from .workdir import Packed, fill_workdir

log = logging.getLogger(__name__)
MAX_LOG_BYTES = 1024 * 1024
TAIL_LINES = 20
RECENT_BYTES = 16 * 1024


class SandboxProcess(Protocol):
    @property
    def pid(self) -> int: ...

    async def pump(self, forward: Callable[[bytes], None]) -> None: ...

    async def wait(self) -> int: ...

    async def stop(self, grace: float) -> int: ...

    def tail(self) -> str: ...

    def reason(self) -> str | None:
        """Why it ended, when the runtime knows better than its exit code (out of memory)."""

    def owns_port(self, port: int) -> bool:
        """Whatever listens on `port` is this sandbox (not another app squatting it)."""

    def settled(self) -> None:
        """Its start is over (the first probe answered or gave up): work the runtime held
        back so as not to slow the start may run. Idempotent; `wait` implies it."""

    @property
    def app_dir(self) -> Path:
        """Where the app's tree is on this node. For a stateful sandbox (`Identity.stateful`)
        it stays there after the process ends, until `dispose`, so its state can be archived."""

    def dispose(self) -> None:
        """Let go of the app's tree (idempotent; only a stateful sandbox's is still held)."""

    async def freeze(self) -> int:
        """Stop every process of the sandbox where it is (the suspended tier); returns the
        bytes it holds. Does nothing once a stop began."""

    async def thaw(self) -> None:
        """Let a frozen sandbox run again (at once: this is a wake's fast path)."""


@dataclass(frozen=True)
class Identity:
    """Which sandbox of which app a process is, and what it may use."""

    sandbox_id: str = "sandbox"
    app: str = "app"
    limits: Resources = field(default_factory=Resources)
    stateful: bool = False
    """Its tree outlives its process (until `SandboxProcess.dispose`): it never takes a warm
    slot, whose tree a restarted agent could not find again."""


UNNAMED = Identity()
"""For a process started outside any sandbox record (tests, tools): default limits."""


class Runtime(Protocol):
    async def start(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        workdir: Path,
        log_path: Path,
        identity: Identity = ...,
        packed: Packed | None = None,
    ) -> SandboxProcess:
        """Start `command` with the app's files in `workdir`; with `packed`, the runtime
        unpacks them first (into `workdir`, or straight into the sandbox's own filesystem when
        it gives it one, where `workdir` is then never written). Raises `ArtifactError` for
        bytes that are not the artifact, `OSError` for a start that failed."""


def tail_of(recent: bytes | bytearray) -> str:
    """What a crash is reported with: the last `TAIL_LINES` lines, each cut to its last 1000
    characters."""
    lines = recent.decode(errors="replace").splitlines()
    return "\n".join(line[-1000:] for line in lines[-TAIL_LINES:])


def _guarded(command: Sequence[str]) -> list[str]:
    """Wrap the command so the sandbox gets SIGKILL if the node agent dies (Linux's parent-death
    signal, set by util-linux's `setpriv`, survives exec). Without it, shutdown still stops
    every sandbox; only a crashed agent could leave one behind."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return list(command)
    return [setpriv, "--pdeathsig", "KILL", "--", *command]


class LocalProcess:
    def __init__(
        self,
        process: Child,
        log_path: Path,
        max_log_bytes: int,
        jailed: Jailed | None = None,
        on_settled: Callable[[], None] | None = None,
        *,
        app_dir: Path | None = None,
        keep_tree: bool = False,
    ):
        self._process = process
        self._on_settled = on_settled
        self._jailed = jailed
        self._app_dir = app_dir if app_dir is not None else log_path.with_name("app")
        self._keep_tree = keep_tree
        self._log_path = log_path
        self._max = max_log_bytes
        self._recent = bytearray()
        self._freezing = asyncio.Lock()
        self._frozen: list[int] | None = None
        """While frozen: the pids SIGSTOP stopped ([] when the cgroup freezer holds it)."""
        self._freeze_work: asyncio.Future[int] | None = None
        self._stopping = False
        self._log: BinaryIO | None = None
        self._written = 0
        self.dropped = 0
        """Output bytes the log file could not take (a full disk); the pipe was drained."""

    @property
    def pid(self) -> int:
        return self._process.pid

    async def pump(self, forward: Callable[[bytes], None] | None = None) -> None:
        """Copy output into the bounded log file, and to `forward`, until the process closes
        its output.

        Reads in chunks, not lines: a line of any length (a minified blob, a binary dump)
        must not break the copy, nor the sandbox. Neither may a log file that cannot be
        written (a full disk): the pipe is still drained, so the app never blocks on it,
        `forward` still gets everything, and what the file missed is counted in `dropped`.
        """
        stream = self._process.stdout
        assert stream is not None
        try:
            while chunk := await stream.read(65536):
                self._recent += chunk
                del self._recent[: max(0, len(self._recent) - RECENT_BYTES)]
                self._append(chunk)
                if forward is not None:
                    forward(chunk)
        finally:
            self._close_log()

    def _append(self, chunk: bytes) -> None:
        try:
            if self._log is None:
                self._log = self._log_path.open("ab")
                self._written = self._log.tell()
            if self._written + len(chunk) > self._max:
                self._close_log()
                self._log_path.replace(self._log_path.with_name(self._log_path.name + ".1"))
                self._log = self._log_path.open("ab")
                self._written = 0
            self._log.write(chunk)
            self._log.flush()
            self._written += len(chunk)
        except OSError as exc:
            if not self.dropped:
                log.warning("cannot write %s, dropping output: %s", self._log_path, exc)
            self.dropped += len(chunk)
            self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def settled(self) -> None:
        on_settled, self._on_settled = self._on_settled, None
        if on_settled is not None:
            on_settled()

    async def wait(self) -> int:
        code = await self._process.wait()
        self.settled()
        if self._jailed is not None:  # a few file operations: cheap enough for the loop
            self._jailed.release(keep_tree=self._keep_tree)
        return code

    @property
    def app_dir(self) -> Path:
        return self._app_dir

    def dispose(self) -> None:
        if self._jailed is not None:
            self._jailed.release_tree()

    async def freeze(self) -> int:
        """The cgroup freezer where the sandbox has cgroups and the node a freezer hierarchy;
        else SIGSTOP to each of its processes (every process of its PID namespace; the
        process group when unisolated). Returns the bytes it holds: its memory cgroup's
        charge, else the resident size of what was stopped."""
        async with self._freezing:
            if self._stopping or self._frozen is not None or self._process.returncode is not None:
                return 0
            # In a thread that a cancelled caller does not cut short: it would go on and
            # freeze the sandbox unseen. A stop waits for it first (`_freeze_work`).
            work = asyncio.ensure_future(asyncio.to_thread(self._freeze_now))
            self._freeze_work = work
            return await asyncio.shield(work)

    def _freeze_now(self) -> int:
        jailed = self._jailed
        cgroup = None if jailed is None else jailed.cgroup
        if cgroup is not None and cgroup.freeze():
            self._frozen = []
            return cgroup.memory_held()
        pid = self._process.pid
        stopped = _stop_group(pid) if jailed is None else jailed.stop_all(pid)
        self._frozen = stopped
        return cgroup.memory_held() if cgroup is not None else resident_bytes(stopped)

    async def thaw(self) -> None:
        async with self._freezing:
            self._thaw()

    def _thaw(self) -> None:
        """Undo whatever a freeze did (idempotent): once any freeze began, the freezer cgroup
        is thawed whatever this process believes (a cut-short wait may not have seen it
        freeze); SIGCONT goes to every pid SIGSTOP stopped (no /proc walk on a wake), and to
        the process group of an unisolated sandbox. A sandbox never frozen is left alone."""
        frozen, self._frozen = self._frozen, None
        cgroup = None if self._jailed is None else self._jailed.cgroup
        if cgroup is not None and self._freeze_work is not None:  # a freeze ever began
            cgroup.thaw()
        for pid in frozen or ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        if frozen and self._jailed is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGCONT)

    async def stop(self, grace: float) -> int:
        """SIGTERM to the sandbox's processes, SIGKILL to all of them after `grace` seconds
        (thawed first, once a freeze under way has ended: a frozen process takes no signal)."""
        self._stopping = True
        if self._freeze_work is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._freeze_work)
        async with self._freezing:
            self._thaw()
        await self._signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                return await self.wait()
        except TimeoutError:
            self._thaw()
            await self._signal(signal.SIGKILL)
            return await self.wait()

    async def _signal(self, signum: int) -> None:
        if self._process.returncode is not None:
            return  # reaped: its pid may already be another process's
        if self._jailed is not None:
            # Finding an isolated sandbox's processes reads /proc: not on the event loop.
            await asyncio.to_thread(self._jailed.signal, self._process.pid, signum)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    def tail(self) -> str:
        return tail_of(self._recent)

    def reason(self) -> str | None:
        return None if self._jailed is None else self._jailed.reason()

    def owns_port(self, port: int) -> bool:
        """Only an isolated sandbox has a uid of its own to tell it by: every socket listening
        on `port` must be its."""
        if self._jailed is None or self._jailed.uid is None:
            return True
        owners = listeners(port)
        return bool(owners) and all(owner == self._jailed.uid for owner in owners)


def _stop_group(pid: int) -> list[int]:
    """SIGSTOP to an unisolated sandbox's process group, then to every process under it (one
    in a session of its own too); the pids stopped, for SIGCONT (a thaw SIGCONTs the group
    as well)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGSTOP)
    return stop_tree(pid)


def resident_bytes(pids: Sequence[int]) -> int:
    """The resident memory of `pids` (shared pages counted once per process)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/statm", "rb") as statm,
        ):
            total += int(statm.read().split()[1]) * page
    return total


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
    ) -> None:
        """`slot_homes`: where warm slots keep their directories (the node's sandbox
        directories); needed for `warm_slots`."""
        self._max_log_bytes = max_log_bytes
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
    ) -> LocalProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
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
            env_fd = sealed(log_path.with_name("env"), env_script(dict(env)))
            if jailed.uid is not None:  # read by the chain's last step, as the app's uid
                os.fchown(env_fd, jailed.uid, jailed.uid)
            fds = (env_fd,)
            seccomp_fd = None
            if self._jail.seccomp is not None:
                seccomp_fd = sealed(log_path.with_name("seccomp"), self._jail.seccomp)
                fds += (seccomp_fd,)
            slot_fd = None
            if self._jail.scope:  # the scope step runs the slot program
                slot_fd = sealed(log_path.with_name("slot_main"), slot_main())
                fds += (slot_fd,)
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
