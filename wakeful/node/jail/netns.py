"""A network namespace per sandbox, so an image's own fixed port (8080, 80) works as it is.

Theory of operation. Each sandbox gets a network namespace of its own, joined to the host by
pasta (Debian's `passt`), which listens on a host port the node picks and splices each
connection to the app's port inside. Two processes per sandbox, both as `net_uid` (P), an
unprivileged uid of the fenced sandbox range that is never an app's:

    holder: setpriv --reuid P --pdeathsig KILL -- unshare --user --net --map-root-user --
              sh -c 'echo 0 > .../ip_unprivileged_port_start; echo ready; exec sleep infinity'
    pasta:  setpriv --reuid P --pdeathsig KILL -- pasta (pasta_argv) HOLDER_PID
    the sandbox: nsenter --net=/proc/HOLDER_PID/ns/net -- (the bwrap chain, as root)

Why P owns the namespaces (user_namespaces(7)). pasta refuses to run as root, and a process
needs CAP_SYS_ADMIN in the user namespace that owns a network namespace to join it: as P it
has none over a root-made one. `unshare --user` run by P makes a user namespace whose owner is
P, and the network namespace made with it belongs to that user namespace; "a process whose
effective uid is the owner of a user namespace, in its parent namespace, has all capabilities
in it", so pasta, run as P in the initial namespace, may join both. The holder is root inside
its user namespace, so it may set the per-namespace sysctl that lets any uid bind port 80
(`ip_unprivileged_port_start=0`); root on the host has every capability in descendant
namespaces, so the node's `nsenter` joins the network namespace. The app keeps its own uid U
in the initial user namespace (U != P): it is no member of P's user namespace and not its
owner, so it has no capability over its network namespace (no interfaces, routes or
sysctls of its own making), and it cannot signal or trace P's processes.

What the app sees: its own loopback, an interface with the host's address and default route
(pasta's defaults: an app that dials the host's main address reaches itself), `/proc/net` of
its namespace only. The host's loopback is not reachable: no automatic forwarding of ports
(`-T none -U none`) and the gateway is the real one (`--no-map-gw`), not the host. Everything
else leaves through pasta's own sockets, which belong to P on the host: P is in the sandbox
range, so `network.NFT_RULES` fences the app's connections to this machine, the other nodes,
the control plane and the metadata service exactly as it fences a sandbox in the host's
namespace (`net_uid` outside that range is refused here).

`SandboxNet.listening` says when the app listens inside: a TCP connect to the host port
succeeds as soon as pasta does, app or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import shutil
import signal
import stat
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from wakeful.aio.spawn import STDOUT, Child, connect_read_pipe, spawn

from . import IsolationUnavailable
from .bwrap import CHAIN_ENV
from .uids import UID_BASE, UID_COUNT

log = logging.getLogger(__name__)
TUN = Path("/dev/net/tun")
UNPRIVILEGED_PORTS = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
HOLDER_READY = b"ready"
PID_FILE = "/proc/self/fd/1"
"""pasta writes its pid there once it listens and the namespace is configured: its stdout, a
pipe the node reads (given to P, which reopens it by this path)."""
START_TIMEOUT = 10.0
"""Seconds the holder and pasta have to say they are ready (both take a few ms)."""


class NetnsGone(RuntimeError):
    """The sandbox's network namespace is gone (its holder exited): nothing can enter it."""


def pasta_argv(
    pasta: str, *, host: str, host_port: int, app_port: int, holder_pid: int
) -> list[str]:
    """pasta's command line: forward `host`:`host_port` to `app_port` inside the namespace of
    `holder_pid`, nothing else in; its pid on its stdout (`PID_FILE`) once it serves."""
    return [
        pasta,
        "--foreground",  # the node supervises it: it dies with the node (pdeathsig) or close()
        "--quiet",
        "--config-net",  # address, route and loopback set up inside, no DHCP needed
        "--tcp-ports",
        f"{host}/{host_port}:{app_port}",
        "--udp-ports",
        "none",
        "--tcp-ns",
        "none",  # no port of the host's loopback forwarded into the namespace
        "--udp-ns",
        "none",
        "--no-map-gw",  # the gateway address is the real gateway, not the host's loopback
        "--no-dhcp",
        "--no-dhcpv6",
        "--no-ra",
        "--pid",
        PID_FILE,
        str(holder_pid),
    ]


def holder_argv(setpriv: str, unshare: str, net_uid: int) -> list[str]:
    """The holder: a user and network namespace owned by `net_uid`, port 80 open to any uid in
    it, `ready` on its stdout, then it sleeps until killed (its pid names the namespace)."""
    script = f"echo 0 > {UNPRIVILEGED_PORTS} && echo {HOLDER_READY.decode()} && exec sleep infinity"
    return [
        *_as_uid(setpriv, net_uid),
        unshare,
        "--user",
        "--net",
        "--map-root-user",
        "--",
        "sh",
        "-c",
        script,
    ]


def _as_uid(setpriv: str, uid: int) -> list[str]:
    """Run the rest as `uid`, no groups, and die with the node."""
    ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return [setpriv, *ids, "--inh-caps=-all", "--pdeathsig", "KILL", "--"]


class _Output(asyncio.Protocol):
    """pasta's stdout and stderr, read for as long as it runs (it must never block on a full
    pipe): the last few KiB kept for an error, `ready` once the pid line came."""

    TAIL = 4096

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.tail = b""
        self.ready: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()

    def data_received(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-self.TAIL :]
        complete = self.tail.split(b"\n")[:-1]
        if not self.ready.done() and any(line.strip().isdigit() for line in complete):
            self.ready.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    def reason(self) -> str:
        lines = [line.strip() for line in self.tail.decode(errors="replace").splitlines()]
        said = [line for line in lines if line and not line.isdigit() and "syslog" not in line]
        return said[-1][:200] if said else ""


@dataclass
class SandboxNet:
    """One sandbox's network namespace, its holder and its pasta."""

    holder: Child
    pasta: Child
    nsenter: str
    app_port: int
    _output: asyncio.ReadTransport = field(repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def pids(self) -> tuple[int, int]:
        """(holder, pasta), both running as the net uid on the host."""
        return (self.holder.pid, self.pasta.pid)

    def enter_prefix(self) -> list[str]:
        """The argv prefix that runs the next command (the bwrap chain, as root) in the
        namespace. The holder is the node's child, reaped only once it exited, so its pid names
        no other process while it runs; an exited holder raises `NetnsGone`."""
        if self._closed or self.holder.returncode is not None:
            raise NetnsGone(f"the network namespace of holder {self.holder.pid} is gone")
        return [self.nsenter, f"--net=/proc/{self.holder.pid}/ns/net", "--"]

    def listening(self) -> bool:
        """Whether a TCP socket listens on the app's port inside the namespace, read from
        `/proc/HOLDER/net` (the sockets of the holder's namespace) without entering it."""
        port = f":{self.app_port:04X}"
        for table in ("tcp", "tcp6"):
            try:
                text = Path(f"/proc/{self.holder.pid}/net/{table}").read_text()
            except OSError:
                return False
            for line in text.splitlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[1].endswith(port) and fields[3] == "0A":
                    return True
        return False

    def kill(self) -> None:
        """`close` without waiting: SIGKILL to pasta and the holder, reaped by their watchers
        (`spawn.Child`) on the loop. For a sandbox's synchronous release."""
        self._closed = True
        for child in (self.pasta, self.holder):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGKILL)
        self._output.close()

    async def close(self) -> None:
        """Kill pasta and the holder and reap both; the namespace goes with the last process
        in it (the sandbox's, if it still runs). Safe twice, after either died, cancelled."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            await _kill(self.pasta)
            await _kill(self.holder)
            self._output.close()


async def open_sandbox_net(*, host: str, host_port: int, app_port: int, net_uid: int) -> SandboxNet:
    """A new network namespace owned by `net_uid` whose `app_port` answers on `host`:
    `host_port`, ready to be entered (`SandboxNet.enter_prefix`). Raises
    `IsolationUnavailable` with the reason when this machine cannot make one."""
    if not UID_BASE <= net_uid < UID_BASE + UID_COUNT:
        raise ValueError(
            f"net_uid {net_uid} is outside the fenced sandbox uids "
            f"{UID_BASE}-{UID_BASE + UID_COUNT - 1}: pasta's traffic would not be fenced"
        )
    for port in (host_port, app_port):
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is not in 1-65535")
    if os.geteuid() != 0:
        raise IsolationUnavailable("a network namespace per sandbox needs the agent as root")
    tools = find_tools()
    _check_tun()
    holder = await spawn(
        holder_argv(tools["setpriv"], tools["unshare"], net_uid), cwd="/", env=CHAIN_ENV
    )
    try:
        with anyio.fail_after(START_TIMEOUT):
            await _holder_ready(holder, net_uid)
            argv = pasta_argv(
                tools["pasta"],
                host=host,
                host_port=host_port,
                app_port=app_port,
                holder_pid=holder.pid,
            )
            pasta, output = await _start_pasta(
                [*_as_uid(tools["setpriv"], net_uid), *argv], net_uid
            )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _kill(holder)
        raise
    return SandboxNet(holder, pasta, tools["nsenter"], app_port, output)


def find_tools(path: str = CHAIN_ENV["PATH"]) -> dict[str, str]:
    """pasta and util-linux's tools, by name, found on `path`; `IsolationUnavailable` names
    the Debian package of the first one missing."""
    found = {}
    for name, package in (
        ("pasta", "passt"),
        ("setpriv", "util-linux"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
    ):
        where = shutil.which(name, path=path)
        if where is None:
            raise IsolationUnavailable(f"{name} not found (apt-get install {package})")
        found[name] = where
    return found


def _check_tun() -> None:
    """pasta, as P, opens /dev/net/tun: udev makes it 0666 (opening it grants nothing; making
    an interface needs CAP_NET_ADMIN over the namespace), some VMs leave it 0600. The agent,
    root, makes it 0666 then, as udev would, and says so once."""
    try:
        mode = stat.S_IMODE(TUN.stat().st_mode)
    except OSError as exc:
        raise IsolationUnavailable(f"{TUN} is missing ({exc.strerror}): no tun driver") from exc
    if mode & 0o006 == 0o006:
        return
    try:
        os.chmod(TUN, mode | 0o666)
    except OSError as exc:
        raise IsolationUnavailable(
            f"{TUN} is mode {mode:04o}: pasta runs unprivileged and needs it 0666, "
            f"as udev makes it (chmod 0666 {TUN}): {exc.strerror}"
        ) from exc
    log.warning("%s was mode %04o: made it 0666, as udev does, for pasta", TUN, mode)


async def _holder_ready(holder: Child, net_uid: int) -> None:
    assert holder.stdout is not None
    line = await holder.stdout.readline()
    if line.strip() != HOLDER_READY:
        said = line + await holder.stdout.read(4096)
        await holder.wait()
        reason = _last_line(said) or f"exit status {holder.returncode}"
        raise IsolationUnavailable(
            f"the kernel refused a user and network namespace to uid {net_uid}: {reason}"
        )


async def _start_pasta(argv: list[str], net_uid: int) -> tuple[Child, asyncio.ReadTransport]:
    """Start pasta with its stdout and stderr on a pipe the loop reads while it runs; return
    once it wrote its pid there (it serves), or raise with what it said before it exited."""
    loop = asyncio.get_running_loop()
    read_end, write_end = os.pipe()
    try:
        os.fchown(write_end, net_uid, net_uid)  # P reopens it as its pid file
        pasta = await spawn(argv, cwd="/", env=CHAIN_ENV, stdout=write_end, stderr=STDOUT)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    try:
        pipe = io.FileIO(read_end, "rb")  # closes nothing it was given when it fails
    except BaseException:
        os.close(read_end)
        await _kill(pasta)
        raise
    try:
        transport, output = await connect_read_pipe(loop, _Output, pipe)
    except BaseException:  # the pipe is closed
        await _kill(pasta)
        raise
    try:
        await asyncio.wait([output.ready, output.ended], return_when=asyncio.FIRST_COMPLETED)
        if not output.ready.done():
            await pasta.wait()
            reason = output.reason() or f"exit status {pasta.returncode}"
            raise IsolationUnavailable(f"pasta failed for the sandbox's namespace: {reason}")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _kill(pasta)
            transport.close()
        raise
    return pasta, transport


async def _kill(child: Child) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGKILL)
    await child.wait()


def _last_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    said = [line for line in lines if line and "syslog" not in line]
    return said[-1][:200] if said else ""
