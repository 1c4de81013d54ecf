"""A network namespace per sandbox (wakeful.node.jail.netns): several sandboxes of one image on
its own port 80, each on a host port of its own; the host's loopback and sockets out of sight;
nothing left behind; pasta's traffic fenced like a sandbox's. Real processes: root, pasta."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import stat
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

from wakeful.node.jail import IsolationUnavailable
from wakeful.node.jail.netns import (
    TUN,
    NetnsGone,
    SandboxNet,
    find_tools,
    open_sandbox_net,
    pasta_argv,
)
from wakeful.node.jail.network import default_gateways, install_network_rules
from wakeful.node.jail.uids import UID_BASE
from wakeful.store.testing import free_port

APP_UID = UID_BASE + 77_001
"""The app's uid (U): in the sandbox range, no capabilities."""
NET_UID = UID_BASE + 77_002
"""The namespaces' owner and pasta's uid (P): in the sandbox range, never an app's."""
PYTHON = "/usr/bin/python3"

real = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("pasta") is None or shutil.which("bwrap") is None,
    reason="needs root, Debian's passt (pasta) and bubblewrap",
)
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tun() -> Iterator[None]:
    """/dev/net/tun as udev makes it (0666: pasta opens it as P); put back as found."""
    mode = stat.S_IMODE(TUN.stat().st_mode)
    if mode & 0o006 != 0o006:
        os.chmod(TUN, 0o666)
    yield
    os.chmod(TUN, mode)


@pytest.fixture
async def net(tun: None) -> AsyncIterator[SandboxNet]:
    opened = await open_sandbox_net(
        host="127.0.0.1", host_port=free_port(), app_port=80, net_uid=NET_UID
    )
    yield opened
    await opened.close()


def sandbox(net: SandboxNet, *command: str, www: Path | None = None) -> list[str]:
    """`command` as the app would run: entered into `net`, in a minimal bwrap, as APP_UID with
    no capabilities; `www` bound at /tmp."""
    binds = ["--bind", str(www), "/tmp"] if www is not None else []
    return [
        *net.enter_prefix(),
        "bwrap",
        "--unshare-pid",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *binds,
        "--",
        "setpriv",
        f"--reuid={APP_UID}",
        f"--regid={APP_UID}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        *command,
    ]


@contextlib.asynccontextmanager
async def httpd(net: SandboxNet, www: Path) -> AsyncIterator[anyio.abc.Process]:
    """busybox httpd on port 80 inside `net`, answering through the host port."""
    argv = sandbox(net, "busybox", "httpd", "-f", "-p", "80", "-h", "/tmp", www=www)
    async with await anyio.open_process(argv) as process:
        try:
            with anyio.fail_after(10):
                while not net.listening():
                    assert process.returncode is None, "httpd exited"
                    await anyio.sleep(0.005)
            yield process
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.kill()


def site(tmp_path: Path, text: str) -> Path:
    www = tmp_path / text
    www.mkdir(mode=0o755)
    (www / "index.html").write_text(text)
    (www / "index.html").chmod(0o644)
    return www


async def get(port: int) -> str:
    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
            return str(answer.read().decode())

    return await anyio.to_thread.run_sync(fetch)


async def connect_from(net: SandboxNet, address: str, port: int) -> str:
    """What the app gets connecting to `address`:`port` from inside `net`."""
    code = (
        "import socket\ntry:\n"
        f" socket.create_connection(({address!r}, {port}), timeout=1)\n print('connected')\n"
        "except Exception as e:\n print(type(e).__name__)"
    )
    done = await anyio.run_process(sandbox(net, PYTHON, "-I", "-c", code), check=False)
    return done.stdout.decode().strip() or done.stderr.decode().strip()


@contextlib.contextmanager
def host_listener(address: str) -> Iterator[tuple[socket.socket, int]]:
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
        sock.bind((address, 0))
        sock.listen()
        sock.setblocking(False)
        yield sock, int(sock.getsockname()[1])


def accepted(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@real
async def test_two_sandboxes_of_one_image_serve_port_80_each_on_its_own_host_port(
    tmp_path: Path, tun: None
) -> None:
    """Both bind port 80 as an unprivileged uid: each namespace is its own, and port 80 is
    open to any uid in it."""
    async with contextlib.AsyncExitStack() as stack:
        nets = []
        for name in ("first", "second"):
            net = await open_sandbox_net(
                host="127.0.0.1", host_port=free_port(), app_port=80, net_uid=NET_UID
            )
            stack.push_async_callback(net.close)
            await stack.enter_async_context(httpd(net, site(tmp_path, name)))
            nets.append(net)
        for net, name in zip(nets, ("first", "second"), strict=True):
            host_port = int(pasta_spec(net).split("/")[1].split(":")[0])
            assert await get(host_port) == name


def pasta_spec(net: SandboxNet) -> str:
    """The `-t` spec pasta runs with (its command line)."""
    argv = Path(f"/proc/{net.pasta.pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(b"--tcp-ports") + 1].decode()


def alive(pid: int) -> bool:
    """A process of that pid exists (the node reaped what it closed: not even a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def host_address() -> str:
    """The IPv4 address of the host's default route (what pasta gives the namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.250", 9))  # no packet is sent: only the route is looked up
        return str(probe.getsockname()[0])


@real
async def test_proc_net_inside_shows_the_namespace_s_sockets_not_the_host_s(
    net: SandboxNet, tmp_path: Path
) -> None:
    async with httpd(net, site(tmp_path, "own")):
        with host_listener("127.0.0.1") as (_, port):
            done = await anyio.run_process(
                sandbox(net, "cat", "/proc/net/tcp", "/proc/net/tcp6"), check=True
            )
    local = {line.split()[1].rsplit(":", 1)[1] for line in done.stdout.decode().splitlines()[2:]}
    local.discard("local_address")
    assert "0050" in local  # its own port 80
    assert f"{port:04X}" not in local


@real
async def test_close_leaves_nothing_behind_also_when_the_sandbox_died_first(
    tmp_path: Path, tun: None
) -> None:
    host_port = free_port()
    net = await open_sandbox_net(
        host="127.0.0.1", host_port=host_port, app_port=80, net_uid=NET_UID
    )
    pids = net.pids
    async with httpd(net, site(tmp_path, "gone")):
        assert await get(host_port) == "gone"
    await net.close()  # the sandbox died first
    await net.close()  # and a second close is harmless
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(NetnsGone):
        net.enter_prefix()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, not a listener
        sock.bind(("127.0.0.1", host_port))  # pasta's port is free again
        sock.listen()


@real
async def test_close_while_the_sandbox_runs_kills_pasta_and_the_holder(
    tmp_path: Path, tun: None
) -> None:
    net = await open_sandbox_net(
        host="127.0.0.1", host_port=free_port(), app_port=80, net_uid=NET_UID
    )
    async with httpd(net, site(tmp_path, "running")) as app:
        await net.close()
        assert not any(alive(pid) for pid in net.pids)
        assert app.returncode is None  # the app's namespace lives on, cut off


@real
async def test_a_host_port_in_use_is_an_error_with_pasta_s_reason(tun: None) -> None:
    with (
        host_listener("127.0.0.1") as (_, port),
        pytest.raises(IsolationUnavailable, match=f"Failed to bind any port.*{port}"),
    ):
        await open_sandbox_net(host="127.0.0.1", host_port=port, app_port=80, net_uid=NET_UID)


@real
async def test_a_tun_device_left_0600_is_made_0666_as_udev_does_and_said(
    tun: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Some VMs leave /dev/net/tun 0600: pasta, unprivileged, could not open it. The root
    agent makes it what udev makes it, and logs that it did."""
    mode = stat.S_IMODE(TUN.stat().st_mode)
    os.chmod(TUN, 0o600)
    try:
        opened = await open_sandbox_net(
            host="127.0.0.1", host_port=free_port(), app_port=80, net_uid=NET_UID
        )
        await opened.close()
        assert stat.S_IMODE(TUN.stat().st_mode) == 0o666
        assert "was mode 0600: made it 0666" in caplog.text
    finally:
        os.chmod(TUN, mode)


def test_a_missing_pasta_names_debian_s_package(tmp_path: Path) -> None:
    with pytest.raises(IsolationUnavailable, match=r"pasta not found \(apt-get install passt\)"):
        find_tools(str(tmp_path))


async def test_a_net_uid_outside_the_fenced_range_is_refused() -> None:
    with pytest.raises(ValueError, match="net_uid 1000 is outside the fenced sandbox uids"):
        await open_sandbox_net(host="127.0.0.1", host_port=8080, app_port=80, net_uid=1000)


def test_pasta_forwards_one_port_in_and_nothing_of_the_host() -> None:
    argv = pasta_argv("pasta", host="127.0.0.1", host_port=20001, app_port=80, holder_pid=42)
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--tcp-ports"] == "127.0.0.1/20001:80"
    assert pairs["--udp-ports"] == pairs["--tcp-ns"] == pairs["--udp-ns"] == "none"
    assert {"--no-map-gw", "--foreground", "--config-net"} <= set(argv)
    assert argv[-1] == "42"


@contextlib.asynccontextmanager
async def unfenced() -> AsyncIterator[None]:
    """No nftables fence on this machine until the end (then the rules as an agent installs
    them): what the namespace alone keeps out of reach."""
    await anyio.run_process(["nft", "delete", "table", "inet", "wakeful"], check=False)
    try:
        yield
    finally:
        assert install_network_rules() is None


@real
@pytest.mark.exclusive
async def test_the_host_loopback_and_gateway_are_out_of_reach_even_unfenced(
    tmp_path: Path, tun: None
) -> None:
    """No port of the host's loopback is forwarded in (the listeners exist before pasta
    starts, which would forward them), the gateway address is not mapped to the host's
    loopback, and the host's main address is the namespace's own (pasta copies it)."""
    with host_listener("127.0.0.1") as (loopback, port), host_listener("0.0.0.0") as (any_, other):
        async with unfenced():
            net = await open_sandbox_net(
                host="127.0.0.1", host_port=free_port(), app_port=80, net_uid=NET_UID
            )
            try:
                async with httpd(net, site(tmp_path, "own")):
                    assert await connect_from(net, "127.0.0.1", 80) == "connected"  # the probe
                    assert await connect_from(net, "127.0.0.1", port) == "ConnectionRefusedError"
                    for gateway in default_gateways():
                        assert await connect_from(net, gateway, port) != "connected"
                    assert await connect_from(net, host_address(), other) == (
                        "ConnectionRefusedError"
                    )
            finally:
                await net.close()
        assert not accepted(loopback)
        assert not accepted(any_)


@real
@pytest.mark.exclusive
async def test_the_fence_refuses_the_app_this_machine_s_other_addresses(
    tmp_path: Path, tun: None
) -> None:
    """pasta dials for the app as NET_UID, a sandbox uid: with the rules installed, a listener
    on an address of this machine (not the one the namespace has) is refused; without them
    it answers (the control that the probe reaches the host at all)."""
    address = "198.18.0.1"  # benchmarking range: on `lo` for this test only
    await anyio.run_process(["ip", "addr", "add", f"{address}/32", "dev", "lo"])
    try:
        net = await open_sandbox_net(
            host="127.0.0.1", host_port=free_port(), app_port=80, net_uid=NET_UID
        )
        try:
            with host_listener("0.0.0.0") as (anywhere, port):
                async with unfenced():
                    assert await connect_from(net, address, port) == "connected"
                    assert accepted(anywhere)
                assert await connect_from(net, address, port) != "connected"  # pasta drops it
                assert not accepted(anywhere)
        finally:
            await net.close()
    finally:
        await anyio.run_process(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)
