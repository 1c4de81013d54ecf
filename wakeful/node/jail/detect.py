"""What this machine allows a sandbox, found once when the node agent starts (`detect_jail`).

The tools (bubblewrap, util-linux's `setpriv` and `prlimit`), whether the agent is root, in a
container and with the capabilities sandboxes need, writable cgroups, the network fence, the
seccomp filter, a Python visible inside a sandbox (warm slots, the Landlock scope step): what
is missing either refuses the start with one line saying what to do, or is written into the
`Jail`'s `notes` (shown by `wakeful status`). `check` then starts one empty sandbox, as root
dropping to a sandbox uid, so a machine that cannot isolate fails at start, not at an app's.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import IsolationUnavailable
from .bwrap import SYSTEM_PATHS, Jail
from .cgroups import Cgroups
from .kernel import LANDLOCK_SCOPE_ABI, landlock_abi, userns_filter
from .network import Network, default_gateways, install_network_rules
from .uids import UID_BASE

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


def proc_status(text: str) -> dict[str, str]:
    """`/proc/PID/status` as read: each field's name and its value, untrimmed."""
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def dropped(returncode: int, status: Mapping[str, str], uid: int) -> bool:
    """A probe that printed its `/proc/self/status` (`status`, from `proc_status`) and exited
    with `returncode` ran as `uid` (real, effective, saved and filesystem) with empty bounding
    and effective capability sets. A field it did not print counts as not dropped."""
    return (
        returncode == 0
        and status.get("Uid", "").split() == [str(uid)] * 4
        and all(int(status.get(name, "1"), 16) == 0 for name in ("CapBnd", "CapEff"))
    )


def detect_jail(
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
                f"the container lacks {', '.join(lacking)}, which sandboxes need: " + CONTAINER_HINT
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
    slot_python = visible_python(visible)
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
    jail = Jail(
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
    check(jail, data_dir, probe_uid)
    return jail


def check(jail: Jail, probe_dir: Path, probe_uid: int = UID_BASE) -> None:
    """Start one empty sandbox, so a machine that cannot make namespaces fails at start;
    as root, drop to a sandbox uid in it as `Jail.command` does, and give a file to that uid,
    so a machine (a container) without the capabilities for that fails at start too: the
    drop of the bounding set fails quietly without CAP_SETPCAP, and without CAP_SETUID or
    CAP_CHOWN every app's start failed later with a misleading error."""
    hint = (
        CONTAINER_HINT if in_container() else "start with --isolation=none to run apps unisolated"
    )
    argv = [jail.bwrap, *jail.mounts(None, None), "--", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        raise IsolationUnavailable(
            f"bwrap cannot make a sandbox here: {done.stderr.strip() or done.returncode} ({hint})"
        )
    if not jail.as_root:
        return
    drop = [
        jail.setpriv,
        f"--reuid={probe_uid}",
        f"--regid={probe_uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]
    argv = [jail.bwrap, *jail.mounts(None, None), "--", *drop, "cat", "/proc/self/status"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except subprocess.SubprocessError as exc:
        raise IsolationUnavailable(f"a sandbox did not start in time here: {exc}") from None
    status = proc_status(done.stdout)
    if not dropped(done.returncode, status, probe_uid):
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


def visible_python(visible: Sequence[str]) -> str | None:
    """The control plane's own Python when a sandbox can see it, else a system one."""
    for candidate in (os.path.realpath(sys.executable), *PYTHONS):
        real = os.path.realpath(candidate)
        if os.access(real, os.X_OK) and any(
            real.startswith(os.path.realpath(path) + "/") for path in visible
        ):
            return real
    return None
