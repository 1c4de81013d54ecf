"""Sandboxes that cannot touch the control plane: bubblewrap namespaces, an unprivileged uid
per app, cgroup or rlimit limits, a bounded writable tree.

Theory of operation. `detect.detect_jail` runs once when the node agent starts and finds what
this machine allows; `Jail.command` turns an app's command into the chain that starts it:

    sh -c 'join the cgroups; exec "$@"'        (root, only when cgroups are writable)
      prlimit --nofile --nproc/--as            (the rlimits the cgroups do not cover)
        setpriv --pdeathsig KILL               (the sandbox dies with the agent)
          bwrap --unshare-pid,ipc,uts --die-with-parent --new-session
                --ro-bind /usr /etc ... --proc --dev --tmpfs /tmp --bind APP /app
            setpriv --reuid U --regid U --clear-groups --no-new-privs --bounding-set -all
              the app's command, in /app

bwrap runs as root when the agent does (it needs no user namespace then, and can bind the app
directory from inside the 0700 data directory); the last `setpriv` drops to the app's own uid
with no capabilities and no way back (no_new_privs makes set-uid programs in /usr inert).
When the agent is not root, bwrap makes a user namespace and the sandbox keeps the agent's
uid (`setpriv` is left out). The sandbox's PID namespace is the sandbox: when its first
process exits, or bwrap is killed, the kernel kills everything left in it, escaped `setsid`
grandchildren included.

Only the system directories (`SYSTEM_PATHS`, plus `sandbox_paths` from the node settings) are
visible, read-only; the data directory, other sandboxes, /root, /home, /run (and its sockets)
and the agent's /proc are not. The app's directory is the only writable tree besides /tmp
and /dev/shm; as root all three are directories of one tmpfs of the app's `disk` size
(`mount_sandbox_fs`), so a sandbox cannot fill the node's disk.

A warm slot (`sandbox/slots.py`) is this chain started ahead of time with `slot_main.py` in
place of the last `setpriv` and the app: it waits inside its namespaces and cgroups, and does the
uid drop itself once it is told which app it becomes (`slot_command`).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from wakeful.domain.models import Resources

from .cgroups import Cgroups, SandboxCgroup
from .slot_main import IMAGE_MARK, SCOPE_MARK
from .tmpfs import ACCOUNTS

log = logging.getLogger(__name__)

SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Read-only inside every sandbox (the ones that exist; merged-/usr symlinks stay symlinks)."""
APP_DIR = "/app"
SLOT_MAIN = Path(__file__).with_name("slot_main.py")
SLOT_HOME = "/.wakeful"
SLOT_PROGRAM = f"{SLOT_HOME}/{SLOT_MAIN.name}"
"""Where a sandbox sees `slot_main.py`: a read-only file bwrap makes from a descriptor the agent
hands it (`slot_main`), run by path. Never its source as `python -c`: bwrap keeps its argv for
the sandbox's life, and so does the init of its PID namespace, both in `ps`."""
IMAGE_ROOT = f"{SLOT_HOME}/root"
"""Where an image app's root filesystem is mounted inside its sandbox, until the chain's last
step chroots into it (`slot_main.image_exec`)."""
SLOT_MARK = "wakeful-warm-slot"
"""In an idle warm slot's command line (its first argument): what tells it from a sandbox."""


@dataclass(frozen=True)
class Jail:
    """What this machine allows (`detect.detect_jail`) and the command chains that start
    sandboxes under it."""

    bwrap: str
    setpriv: str
    prlimit: str
    sh: str
    as_root: bool
    cgroups: Cgroups | None
    visible: tuple[str, ...] = SYSTEM_PATHS
    hidden: tuple[str, ...] = ()
    seccomp: bytes | None = None
    """`userns_filter` for this machine; None where it is not known (and said in `notes`)."""
    slot_python: str | None = None
    """A Python 3 visible inside a sandbox, for warm slots; None: no warm slots (said in
    `notes`)."""
    fenced: bool = False
    """The network rules are installed (root, nftables): `PeerFence` can keep other nodes'
    addresses out of reach too."""
    scope: bool = False
    """Each sandbox in a Landlock domain of its own that scopes abstract UNIX sockets and
    signals (`slot_main.scope`): the kernel has it and `slot_python` can run it."""
    control_urls: tuple[str, ...] = ()
    """The control plane's URLs (the store's, the control API's), whose endpoints on other
    machines are fenced (`ControlFence` keeps them current)."""
    notes: tuple[str, ...] = field(default=())
    """What this machine does not enforce (shown by `wakeful status` and logged at start)."""

    def command(
        self,
        command: list[str],
        root: Path,
        limits: Resources,
        uid: int | None,
        cgroup: SandboxCgroup | None,
        env_fd: int | None = None,
        seccomp_fd: int | None = None,
        slot_fd: int | None = None,
    ) -> list[str]:
        """The argv that starts `command` in a sandbox: the cgroup join, `prlimit` and
        `setpriv --pdeathsig`, bwrap and the uid drop. `root`: with a `uid`, the sandbox's
        tmpfs (`mount_sandbox_fs`); without, the app's directory itself. `env_fd`: a file the
        app's uid may read, of `export` lines (`env_script`) that the chain's last step, a
        shell already running as the app's uid, inside its scope, sources before it execs the
        app: everything before it, root's steps and the scope step included, runs with
        `CHAIN_ENV` (an app's LD_PRELOAD must never reach setpriv, which still holds root's
        capabilities, nor run before the Landlock scope). `slot_fd`: with `scope`, a file
        holding `slot_main()` for bwrap to read, that the scope step runs."""
        argv = self._root_steps(limits, uid, cgroup)
        tree, workdir = (root, None) if uid is not None else (None, root)
        argv += [self.bwrap, *self.mounts(tree, workdir, limits.disk)]
        if self.scope:
            assert slot_fd is not None
            argv += _slot_mount(slot_fd)
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        argv.append("--")
        if uid is not None:
            argv += [
                self.setpriv,
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        if self.scope:
            argv += self._slot_main(SCOPE_MARK)
        if env_fd is not None:
            argv += [self.sh, "-c", f'. /dev/fd/{env_fd} && exec "$@"', ENV_STEP]
        return argv + command

    def image_command(
        self,
        command: list[str],
        tree: Path,
        workdir: str,
        limits: Resources,
        uid: int,
        cgroup: SandboxCgroup | None,
        env_fd: int,
        seccomp_fd: int | None,
        slot_fd: int,
        netns: list[str] | None = None,
        etc: dict[str, int] | None = None,
    ) -> list[str]:
        """The chain of `command` for an image app: as `command`'s up to bwrap (with `netns`,
        the argv that enters the sandbox's own network namespace, before bwrap), whose mounts
        put the image's root (an overlay on `tree/root`, `image_fs`) at `IMAGE_ROOT` with its
        own /proc, /dev, /tmp and /dev/shm, and the files of `etc` (name -> a file descriptor
        of its content: `hosts`, `resolv.conf`, as docker gives a container) read-only in its
        /etc; then, as root inside, the slot program chroots into it, drops to `uid` and execs
        the app with the environment of `env_fd` (`image_env_data`): the image has neither
        setpriv nor a shell we could trust. bwrap resolves every target after its pivot_root,
        where the node's root is `/oldroot`, and creates it first: the targets in the image's
        root (`tmpfs.IMAGE_MOUNTS`, `IMAGE_FILES`) were made real directories and regular
        files (or nothing) before, so no link of the image's can lead it onto the node."""
        argv = [*self._root_steps(limits, uid, cgroup), *(netns or [])]
        argv += [self.bwrap, *self.image_mounts(tree), *_slot_mount(slot_fd)]
        for name, fd in (etc or {}).items():
            argv += ["--perms", "0444", "--ro-bind-data", str(fd), f"{IMAGE_ROOT}/etc/{name}"]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        scoped = "1" if self.scope else "0"
        step = [IMAGE_MARK, IMAGE_ROOT, workdir, str(uid), str(env_fd), scoped]
        return [*argv, "--", *self._slot_main(*step), *command]

    def _root_steps(
        self, limits: Resources, uid: int | None, cgroup: SandboxCgroup | None
    ) -> list[str]:
        """What runs as root before bwrap: the cgroup join, `prlimit`, `setpriv --pdeathsig`."""
        argv = [] if cgroup is None else cgroup.join_prefix(self.sh)
        rlimits = [f"--{name.lower()}={value}:{value}" for name, value in self.rlimits(limits, uid)]
        return [*argv, self.prlimit, *rlimits, "--", self.setpriv, "--pdeathsig", "KILL", "--"]

    def image_mounts(self, tree: Path) -> list[str]:
        """The namespaces of `mounts`, the system directories (the slot program's Python runs
        from them, before the chroot), and the image's root with its own special and scratch
        filesystems, all of these but /proc and /dev in the sandbox's one bounded tmpfs."""
        args, root = self._system(), IMAGE_ROOT
        args += ["--bind", str(tree / "root"), root]
        args += ["--proc", f"{root}/proc", "--dev", f"{root}/dev"]
        args += ["--bind", str(tree / "tmp"), f"{root}/tmp"]
        return [*args, "--bind", str(tree / "shm"), f"{root}/dev/shm", "--chdir", "/"]

    def slot_command(
        self,
        tree: Path,
        cgroup: SandboxCgroup,
        seccomp_fd: int | None,
        ready_fd: int,
        slot_fd: int,
    ) -> list[str]:
        """A warm slot: the chain of `command` for a sandbox over `tree` with `slot_main.py`
        (run by `slot_python`, as root inside, from `slot_fd` as `command` runs its scope step)
        where the uid drop and the app would be. It writes to `ready_fd` once it waits for its
        start message. The rlimits are the slot's to set, with the app's."""
        argv = [self.setpriv, "--pdeathsig", "KILL", "--", *cgroup.join_prefix(self.sh)]
        argv += [self.bwrap, *self.mounts(tree, None), *_slot_mount(slot_fd)]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return [*argv, "--", *self._slot_main(SLOT_MARK, str(ready_fd))]

    def _slot_main(self, *args: str) -> list[str]:
        """The command that runs the slot program inside the sandbox, by path."""
        assert self.slot_python is not None
        return [self.slot_python, "-I", "-S", SLOT_PROGRAM, *args]

    def rlimits(self, limits: Resources, uid: int | None) -> list[tuple[str, int]]:
        """(resource, soft=hard) for what the cgroups do not cover; names as `prlimit --NAME`
        and `resource.RLIMIT_NAME` spell them."""
        found = [("NOFILE", limits.open_files)]
        if self.cgroups is None:
            found.append(("AS", limits.memory))
            if uid is not None:  # a uid of its own: the per-uid count is the app's alone
                found.append(("NPROC", limits.processes))
        return found

    def mounts(self, tree: Path | None, workdir: Path | None, disk: int = 16 << 20) -> list[str]:
        """`tree`: a sandbox tmpfs, whose `app/` and scratch directories are bound; else
        `workdir` is bound at /app (when given) and /tmp and /dev/shm are tmpfs of `disk`."""
        args = self._system()
        args += ["--proc", "/proc", "--dev", "/dev"]
        if tree is not None:  # all in one tmpfs, bounded together
            args += ["--bind", str(tree / "tmp"), "/tmp", "--bind", str(tree / "shm"), "/dev/shm"]
            for name in ACCOUNTS:  # filled for the app's uid by `fill_app_dir`
                args += ["--ro-bind", str(tree / name), f"/etc/{name}"]
            return [*args, "--bind", str(tree / "app"), APP_DIR, "--chdir", APP_DIR]
        for scratch in ("/tmp", "/dev/shm"):  # writable by the app, bounded like its /app
            args += ["--perms", "1777", "--size", str(disk), "--tmpfs", scratch]
        if workdir is not None:
            args += ["--bind", str(workdir), APP_DIR, "--chdir", APP_DIR]
        return args

    def _system(self) -> list[str]:
        """The namespaces every sandbox gets, the visible system directories (read-only) and
        the hidden ones."""
        args = [
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
        ]
        for path in self.visible:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in self.hidden:
            args += ["--tmpfs", path]
        return args

    def describe(self) -> str:
        parts = ["bwrap", "own uid per app" if self.as_root else "agent's uid"]
        parts.append("cgroups" if self.cgroups else "rlimits")
        return ", ".join(parts) + "".join(f"; {note}" for note in self.notes)


CHAIN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""The environment of everything that runs as root before the sandbox exists: nothing of the
app's (an app's LD_PRELOAD must never reach prlimit or bwrap)."""


@functools.cache
def slot_main() -> bytes:
    """`slot_main.py`, read once: what every sandbox that runs it gets (`_slot_mount`), also
    after wakeful was upgraded under a running agent, and no file read on the loop at every
    start."""
    return SLOT_MAIN.read_bytes()


def _slot_mount(slot_fd: int) -> list[str]:
    """bwrap's arguments that make `SLOT_PROGRAM`, read-only and readable by every uid (the
    cold chain's scope step runs as the app's), from the file `slot_fd`, read whole at the
    sandbox's start: from the agent, not from a path of the node, so neither the installed
    file's mode nor the data directory's (0700, invariant 23) is in the way."""
    mount = ["--perms", "0755", "--dir", SLOT_HOME]
    return [*mount, "--perms", "0444", "--ro-bind-data", str(slot_fd), SLOT_PROGRAM]


ENV_STEP = "wakeful-env"
"""The name the chain's environment step runs under (its `$0`)."""


HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
"""An image sandbox's /etc/hosts: its own name, `sandbox` (bwrap's `--hostname`), and
localhost, whatever the image has (docker writes one too)."""


def resolv_conf(host: str) -> bytes:
    """An image sandbox's /etc/resolv.conf: the node's (`host`, its text), without the
    nameservers on loopback, which the sandbox's own network cannot reach (docker drops them
    too); where none is left, Google's public resolvers, as docker falls back to."""
    kept = []
    servers = 0
    for line in host.splitlines():
        words = line.split()
        if words[:1] == ["nameserver"] and len(words) > 1:
            address = words[1]
            if address.startswith("127.") or address == "::1":
                continue
            servers += 1
        kept.append(line)
    if not servers:
        kept += ["nameserver 8.8.8.8", "nameserver 8.8.4.4"]
    return ("\n".join(kept) + "\n").encode()


def image_env_data(env: dict[str, str]) -> bytes:
    """An image app's environment as `slot_main.image_exec` reads it: `NAME=value` entries
    separated by NUL. No shell reads it, so a name need not be a shell's (images carry
    `spring.profiles.active`, as docker passes it); only `=` and NUL cannot be in one."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"{name!r} is not an environment variable exec can pass")
    return b"\0".join(f"{name}={value}".encode() for name, value in env.items())


def env_script(env: dict[str, str]) -> bytes:
    """`export NAME='value'` lines that give the app exactly `env` on top of `CHAIN_ENV` (whose
    one variable, PATH, every app's environment sets), read from a file descriptor, never a
    command line, where any local user could read an app's secrets. Names are shell names
    (`ENV_NAME`); a value is quoted whole, its own single quotes closed and escaped."""
    lines = []
    for name, value in env.items():
        if not name.isidentifier() or not name.isascii():
            raise ValueError(f"{name!r} is not a valid environment variable name")
        quoted = "'" + value.replace("'", "'\\''") + "'"
        lines.append(f"export {name}={quoted}\n")
    return "".join(lines).encode()
