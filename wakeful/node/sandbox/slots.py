"""Warm slots: sandboxes started ahead of time, already in their cgroups, namespaces and mounts,
waiting to become an app, so a cold start pays neither the cgroup join nor bwrap's set-up.

Joining a cgroup v1 hierarchy waits for an RCU grace period (measured here: 5-17 ms per
hierarchy, two hierarchies per sandbox) while creating, renaming and limiting one costs
~0.1 ms; bwrap's namespaces and mounts and the `setpriv` exec after them cost ~3.5 ms more. So
the agent keeps `warm_slots` sandboxes (`Jail.slot_command`: the whole isolation chain over a
tmpfs of its own, with `jail/slot_main.py`, ~8 MB, where the app would be) that wait on stdin as
root inside. A start takes one: its cgroups are renamed to the sandbox's and given the app's
limits, its tmpfs is resized to the app's `disk` and filled with the app (`sandbox.local`), and it
gets the start message: the app's command, environment, rlimits and uid. It drops to that uid
(checking /proc that nothing of root's is left) and execs the app, keeping its pid, its cgroups
and its output pipe. The pool refills in the background once every start that took a slot has
settled (its first probe answered, or it ended), and `REFILL_DELAY` later: a refill is a fork
of the agent and a Python boot, and run beside a start it cost that start ~7 ms of the agent's
loop and a share of the CPU the app boots on; run the moment the ready record was written, its
fork (~1 ms of the loop) came before the activator could grant the first request its lease.
When the pool is empty a start takes the whole chain.

Slots die with the agent (parent-death signal); a slot's cgroups and tmpfs left by a crash are
swept like any sandbox's. A slot that dies while idle is noticed when a start takes it (that
start goes the slow way, and the pool refills).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
from pathlib import Path

import anyio

from wakeful.aio.spawn import PIPE, STDOUT, Child, spawn
from wakeful.aio.tasks import Background
from wakeful.domain.models import Resources
from wakeful.node.jail.bwrap import CHAIN_ENV, Jail, slot_main
from wakeful.node.jail.cgroups import Cgroups, SandboxCgroup
from wakeful.node.jail.jailed import memfile
from wakeful.node.jail.tmpfs import mount_sandbox_fs, unmount

log = logging.getLogger(__name__)

IDLE_LIMITS = Resources(memory=64 << 20, processes=16, disk=16 << 20)
JOIN_TIMEOUT = 5.0
EMPTY_POLLS = 1000
REFILL_DELAY = 0.02
"""Seconds a refill waits once starts have settled: the woken request's lease and answer
(~3 ms after the ready record) go first."""
"""2 ms apart: how long a discarded slot's namespace may take to die."""


class Slot:
    def __init__(self, process: Child, cgroup: SandboxCgroup, home: Path, ready: int) -> None:
        self.process = process
        self.cgroup = cgroup
        self.home = home
        """The slot's own directory: `tree` in it, removed with it."""
        self._ready = ready
        """The read end of the pipe `slot_main` writes one byte to once it waits; -1 after."""

    @property
    def tree(self) -> Path:
        """Its tmpfs (`mount_sandbox_fs`): `app/` is the sandbox's /app."""
        return self.home / "fs"

    def joined(self) -> bool:
        """Its process lives, sits in both cgroups (it joins `pids` last) and waits inside."""
        if self.process.returncode is not None:
            return False
        if self._ready >= 0:
            try:
                said = os.read(self._ready, 1)
            except BlockingIOError:
                return False
            self._close_ready()
            if not said:
                return False  # it ended before it got to wait
        try:
            members = (self.cgroup.pids / "cgroup.procs").read_text().split()
        except OSError:
            return False
        return str(self.process.pid) in members

    def _close_ready(self) -> None:
        if self._ready >= 0:
            os.close(self._ready)
            self._ready = -1

    def bind(self, sandbox_id: str, limits: Resources, cgroups: Cgroups) -> SandboxCgroup:
        """Rename the slot's cgroups to the sandbox's and give them its limits. An empty
        cgroup of that name (a kernel refuses the first rmdir after a sandbox ends) goes first;
        one with members stays, and the rename fails."""
        target = cgroups.sandbox(sandbox_id)
        for leftover in (target.memory, target.pids):
            with contextlib.suppress(FileNotFoundError):
                leftover.rmdir()
        self.cgroup.memory.rename(target.memory)
        self.cgroup = SandboxCgroup(target.memory, self.cgroup.pids)
        self.cgroup.pids.rename(target.pids)
        self.cgroup = target
        target.create(limits)
        return target

    async def launch(
        self,
        argv: list[str],
        env: dict[str, str],
        rlimits: list[tuple[str, int]],
        uid: int,
        scope: bool,
    ) -> Child:
        """Send the start message; the slot sets `rlimits`, drops to `uid`, enters a Landlock
        scope of its own when `scope`, and becomes `argv` with exactly `env` (`jail.slot_main`). Its
        parent-death signal was set when it started."""
        message = {"argv": argv, "env": env, "rlimits": rlimits, "uid": uid, "scope": scope}
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps(message).encode())
        stdin.close()
        # Once written, the slot becomes the sandbox whatever happens here: the caller must
        # get it back (to stop and release it), so the drain is not cut short by a cancel.
        with anyio.CancelScope(shield=True), contextlib.suppress(ConnectionError):
            await stdin.drain()
        return self.process

    async def discard(self) -> None:
        """Kill it (bwrap and everything in its namespace, found by its cgroups), reap it,
        wait until its cgroups are empty and remove them and its tree; not cut short by a
        cancel. A namespace's processes die after bwrap does, not with it."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        if self.process.stdin is not None:
            self.process.stdin.close()
        self._close_ready()
        with anyio.CancelScope(shield=True):
            await self.process.wait()
            for _ in range(EMPTY_POLLS):
                if not self.cgroup.pids_in():
                    break
                self.cgroup.remove()  # kills what is left; removes nothing while it lives
                await asyncio.sleep(0.002)
        self.cgroup.remove()
        remove_home(self.home)


def remove_home(home: Path) -> None:
    """A slot's directory and the tmpfs in it (what it held as a sandbox, too)."""
    unmount(home / "fs")
    shutil.rmtree(home, ignore_errors=True)


class SlotPool:
    """Keeps `size` joined slots; `take` hands one out (or None) and asks for a new one."""

    def __init__(self, jail: Jail, cgroups: Cgroups, size: int, homes: Path) -> None:
        """`homes`: where the slots' directories go (the node's sandbox directories)."""
        self._jail = jail
        self._cgroups = cgroups
        self._size = size
        self._homes = homes
        self._idle: collections.deque[Slot] = collections.deque()
        self._wanted = asyncio.Event()
        self._full = asyncio.Event()
        self._reaping = Background(_log_failure)
        self._booting = 0
        self.taken = 0
        self.missed = 0
        self.spawned = 0

    @property
    def idle(self) -> tuple[Slot, ...]:
        return tuple(self._idle)

    async def filled(self) -> None:
        """Return once the pool holds `size` slots (the next `run` pass may have to make them)."""
        while len(self._idle) < self._size:
            self._full.clear()
            await self._full.wait()

    async def take(self, sandbox_id: str, limits: Resources) -> Slot | None:
        """A slot bound to `sandbox_id` (cgroups renamed, limits set), or None. A slot taken
        holds the refill back until `settle` is called for it."""
        while self._idle:
            slot = self._idle.popleft()
            if not slot.joined():
                self._reap(slot)
                continue
            try:
                slot.bind(sandbox_id, limits, self._cgroups)
            except OSError as exc:
                log.warning("a warm slot could not take sandbox %s: %s", sandbox_id, exc)
                # Half renamed, its cgroups may carry the sandbox's name: gone before the
                # start falls back to making them, or their removal would kill the sandbox.
                await slot.discard()
                break
            self.taken += 1
            self._booting += 1
            return slot
        self.missed += 1
        self._refill_when_quiet()
        return None

    def settle(self) -> None:
        """A start that took a slot is over (ready, failed or ended): once none is left
        booting, the pool refills."""
        self._booting -= 1
        self._refill_when_quiet()

    def _refill_when_quiet(self) -> None:
        if self._booting == 0:
            self._wanted.set()

    def _reap(self, slot: Slot) -> None:
        self._reaping.spawn(slot.discard())

    async def run(self) -> None:
        """Fill the pool and keep it full until cancelled; then end every idle slot."""
        try:
            while True:
                while len(self._idle) < self._size:
                    slot = await self._spawn()
                    if slot is None:
                        await asyncio.sleep(5)  # a machine refusing slots: starts go slow
                        break
                    self._idle.append(slot)
                self._wanted.clear()
                if len(self._idle) >= self._size:
                    self._full.set()
                    await self._wanted.wait()
                    await asyncio.sleep(REFILL_DELAY)
        finally:
            idle, self._idle = list(self._idle), collections.deque()
            with anyio.CancelScope(shield=True):
                await self._close(idle)

    async def _close(self, idle: list[Slot]) -> None:
        await asyncio.gather(*(slot.discard() for slot in idle), self._reaping.wait())

    async def _spawn(self) -> Slot | None:
        self.spawned += 1
        name = f"slot-{secrets.token_hex(6)}"
        cgroup, home = self._cgroups.sandbox(name), self._homes / name
        seccomp = self._jail.seccomp
        fds: list[int] = []
        slot: Slot | None = None
        ready: int | None = None
        try:
            cgroup.create(IDLE_LIMITS)
            mount_sandbox_fs(home / "fs", IDLE_LIMITS.disk)
            ready, ready_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            fds += [ready_w]
            slot_fd = memfile("slot_main", slot_main())
            fds.append(slot_fd)
            seccomp_fd = None
            if seccomp is not None:
                seccomp_fd = memfile("seccomp", seccomp)
                fds.append(seccomp_fd)
            argv = self._jail.slot_command(home / "fs", cgroup, seccomp_fd, ready_w, slot_fd)
            # Not cut short: a process half made by a cancel could join the cgroup unseen.
            with anyio.CancelScope(shield=True):
                process = await spawn(
                    argv, cwd="/", env=CHAIN_ENV, stdin=PIPE, stderr=STDOUT, pass_fds=fds
                )
            slot = Slot(process, cgroup, home, ready)
        except OSError as exc:
            log.warning("cannot start a warm slot: %s", exc)
        except BaseException:
            cgroup.remove()
            remove_home(home)
            raise
        finally:
            for fd in fds:
                os.close(fd)
            if slot is None and ready is not None:  # the slot's once it is made, not before
                os.close(ready)
        if slot is None:
            cgroup.remove()
            remove_home(home)
            return None
        deadline = asyncio.get_running_loop().time() + JOIN_TIMEOUT
        try:
            while not slot.joined():
                if process.returncode is not None or asyncio.get_running_loop().time() > deadline:
                    log.warning(
                        "a warm slot did not join its cgroups (exit %s)", process.returncode
                    )
                    await slot.discard()
                    return None
                await asyncio.sleep(0.002)
        except BaseException:
            # Stopped while it joined: nothing of it may stay, so its discard is not cut short
            # by the same cancel (its tmpfs stayed mounted when it was).
            with anyio.CancelScope(shield=True):
                await slot.discard()
            raise
        return slot


def _log_failure(exc: BaseException) -> None:
    log.warning("discarding a warm slot failed: %s", exc)
