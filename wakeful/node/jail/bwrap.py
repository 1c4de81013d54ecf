"""Sandboxes that cannot touch the control plane: bubblewrap namespaces, an unprivileged uid
per app, cgroup or rlimit limits, a bounded writable tree.

Theory of operation. `Jail.detect` runs once when the node agent starts and finds what this
machine allows; `Jail.command` turns an app's command into the chain that starts it:

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
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wakeful.domain.models import Resources

from . import IsolationUnavailable
from .cgroups import Cgroups, SandboxCgroup
from .kernel import LANDLOCK_SCOPE_ABI, landlock_abi, userns_filter
from .network import Network, default_gateways, install_network_rules
from .slot_main import SCOPE_MARK
from .tmpfs import ACCOUNTS
from .uids import UID_BASE

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
SLOT_MARK = "wakeful-warm-slot"
"""In an idle warm slot's command line (its first argument): what tells it from a sandbox."""
PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
"""Where a warm slot looks for a Python inside the sandbox when the control plane's own is not
under a visible path (a virtual environment's or pyenv's)."""
INSTALL_HINT = (
    "bubblewrap is not installed: run `apt-get install bubblewrap` (Debian/Ubuntu), or start "
    "with --isolation=none to run apps unisolated (they can then read the control plane's "
    "files and tokens)"
)


CONTAINER_MARK = Path("/run/.containerenv")
"""What podman puts in every container; wakeful's image also sets `container=oci` (systemd's
convention, which docker does not follow). `/.dockerenv` is not used: some CI and build hosts
that are machines of their own carry it."""
CONTAINER_HINT = (
    "in a container, give it what sandboxes need: --user 0 --cap-drop ALL --cap-add "
    "SYS_ADMIN,NET_ADMIN,SETUID,SETGID,SETPCAP,CHOWN,FOWNER,DAC_OVERRIDE,KILL, with podman "
    'also --userns=auto:size=500000 (the README\'s "As containers"), or set '
    "WAKEFUL_ISOLATION=none to run apps unisolated (they can then read the control plane's "
    "files and tokens)"
)


CAPABILITIES = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "NET_ADMIN": 12,
    "SYS_ADMIN": 21,
}
"""What a root agent needs for sandboxes (their bits in CapEff): the nine of CONTAINER_HINT."""


def missing_capabilities(status: Path = Path("/proc/self/status")) -> list[str]:
    """The `CAPABILITIES` this process lacks (a container started without them)."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            held = int(line.split()[1], 16)
            return [name for name, bit in CAPABILITIES.items() if not held >> bit & 1]
    return list(CAPABILITIES)


def in_container(environ: Mapping[str, str] = os.environ, mark: Path = CONTAINER_MARK) -> bool:
    return bool(environ.get("container")) or mark.exists()


@dataclass(frozen=True)
class Jail:
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

    @classmethod
    def detect(
        cls,
        data_dir: Path,
        extra_paths: tuple[Path, ...] = (),
        refused: Sequence[tuple[str, int]] = (),
        networks: Sequence[Network] = (),
        probe_uid: int = UID_BASE,
    ) -> Jail:
        """`refused`: control-plane endpoints on other machines no sandbox may reach;
        `networks`: the operator's refused networks (`sandbox_refused_networks`);
        `probe_uid`: the first of the agent's sandbox uids, which `check` drops to."""
        tools = {name: shutil.which(name) for name in ("bwrap", "setpriv", "prlimit", "sh")}
        if tools["bwrap"] is None:
            raise IsolationUnavailable(INSTALL_HINT)
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise IsolationUnavailable(f"isolation needs {', '.join(missing)} (util-linux)")
        as_root = os.geteuid() == 0
        if as_root and in_container():
            lacking = missing_capabilities()
            if lacking:
                raise IsolationUnavailable(
                    f"the container lacks {', '.join(lacking)}, which sandboxes need: "
                    + CONTAINER_HINT
                )
        cgroups = Cgroups.detect() if as_root else None
        failed: str | None = None
        visible = (*SYSTEM_PATHS, *(str(p.absolute()) for p in extra_paths))
        hidden = tuple(str(data_dir) for path in visible if data_dir.is_relative_to(Path(path)))
        notes = []
        if not as_root:
            notes.append("not root: sandboxes share the agent's uid; network not isolated")
        elif (
            failed := install_network_rules(
                refused, networks, default_gateways() if in_container() else ()
            )
        ) is not None:
            if in_container():  # a container without NET_ADMIN: say so, as without SYS_ADMIN
                raise IsolationUnavailable(
                    f"nft cannot fence sandboxes off the control plane here ({failed}): "
                    + CONTAINER_HINT
                )
            notes.append(f"network not isolated: {failed}")
        fenced = as_root and failed is None
        seccomp = userns_filter(platform.machine())
        if seccomp is None:
            notes.append(f"user namespaces not refused (no filter for {platform.machine()})")
        slot_python = _visible_python(visible)
        if slot_python is None and cgroups is not None:
            notes.append("no Python 3 under the visible system paths: no warm slots")
        scope = slot_python is not None and landlock_abi() >= LANDLOCK_SCOPE_ABI
        if not scope:
            why = "Landlock ABI < 6" if slot_python is not None else "no Python 3 visible"
            notes.append(f"host abstract sockets reachable ({why})")
        if cgroups is None:
            notes.append("no writable cgroups: memory is an address-space rlimit")
            if not as_root:
                notes.append("processes not limited")
        jail = cls(
            bwrap=str(tools["bwrap"]),
            setpriv=str(tools["setpriv"]),
            prlimit=str(tools["prlimit"]),
            sh=str(tools["sh"]),
            as_root=as_root,
            cgroups=cgroups,
            visible=visible,
            hidden=hidden,
            seccomp=seccomp,
            slot_python=slot_python,
            scope=scope,
            fenced=fenced,
            notes=tuple(notes),
        )
        jail.check(data_dir, probe_uid)
        return jail

    def check(self, probe_dir: Path, probe_uid: int = UID_BASE) -> None:
        """Start one empty sandbox, so a machine that cannot make namespaces fails at start;
        as root, drop to a sandbox uid in it as `command` does, and give a file to that uid,
        so a machine (a container) without the capabilities for that fails at start too: the
        drop of the bounding set fails quietly without CAP_SETPCAP, and without CAP_SETUID or
        CAP_CHOWN every app's start failed later with a misleading error."""
        hint = (
            CONTAINER_HINT
            if in_container()
            else "start with --isolation=none to run apps unisolated"
        )
        argv = [self.bwrap, *self._mounts(None, None), "--", "true"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        if done.returncode != 0:
            raise IsolationUnavailable(
                f"bwrap cannot make a sandbox here: {done.stderr.strip() or done.returncode}"
                f" ({hint})"
            )
        if not self.as_root:
            return
        drop = [
            self.setpriv,
            f"--reuid={probe_uid}",
            f"--regid={probe_uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
        argv = [self.bwrap, *self._mounts(None, None), "--", *drop, "cat", "/proc/self/status"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        except subprocess.SubprocessError as exc:
            raise IsolationUnavailable(f"a sandbox did not start in time here: {exc}") from None
        status = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
        dropped = (
            done.returncode == 0
            and status.get("Uid", "").split() == [str(probe_uid)] * 4
            and all(int(status.get(name, "1"), 16) == 0 for name in ("CapBnd", "CapEff"))
        )
        if not dropped:
            said = done.stderr.strip() or f"CapBnd {status.get('CapBnd', '?').strip()}"
            raise IsolationUnavailable(
                f"a sandbox cannot drop to its own uid with no capabilities here: {said} ({hint})"
            )
        try:
            with tempfile.NamedTemporaryFile(dir=probe_dir) as probe:
                os.chown(probe.name, probe_uid, probe_uid)
        except OSError as exc:
            raise IsolationUnavailable(
                f"an app's files cannot be given to its uid here: {exc} ({hint})"
            ) from None

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
        argv: list[str] = []
        if cgroup is not None:
            argv += cgroup.join_prefix(self.sh)
        rlimits = [f"--{name.lower()}={value}:{value}" for name, value in self.rlimits(limits, uid)]
        argv += [self.prlimit, *rlimits, "--", self.setpriv, "--pdeathsig", "KILL", "--"]
        tree, workdir = (root, None) if uid is not None else (None, root)
        argv += [self.bwrap, *self._mounts(tree, workdir, limits.disk)]
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
        argv += [self.bwrap, *self._mounts(tree, None), *_slot_mount(slot_fd)]
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

    def _mounts(self, tree: Path | None, workdir: Path | None, disk: int = 16 << 20) -> list[str]:
        """`tree`: a sandbox tmpfs, whose `app/` and scratch directories are bound; else
        `workdir` is bound at /app (when given) and /tmp and /dev/shm are tmpfs of `disk`."""
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


def _visible_python(visible: Sequence[str]) -> str | None:
    """The control plane's own Python when a sandbox can see it, else a system one."""
    for candidate in (os.path.realpath(sys.executable), *PYTHONS):
        real = os.path.realpath(candidate)
        if os.access(real, os.X_OK) and any(
            real.startswith(os.path.realpath(path) + "/") for path in visible
        ):
            return real
    return None


ENV_STEP = "wakeful-env"
"""The name the chain's environment step runs under (its `$0`)."""


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
