"""The isolating runtime on this machine (wakeful.node.jail.bwrap): what a sandbox sees, what
it is told when the kernel kills it for memory, and a refusal that says how to install bwrap.
The hostile-app suite (tests/security) covers the attacks end to end."""

from __future__ import annotations

import ast
import contextlib
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.support.node import uid_table
from wakeful.domain.models import Resources
from wakeful.node.jail import IsolationUnavailable
from wakeful.node.jail.detect import detect_jail
from wakeful.node.jail.kernel import LANDLOCK_SCOPE_ABI, landlock_abi
from wakeful.node.jail.network import (
    control_endpoints,
    default_gateways,
    fence_control,
    install_network_rules,
)
from wakeful.node.jail.tmpfs import mount_sandbox_fs, unmount
from wakeful.node.jail.uids import UidTable
from wakeful.node.sandbox.local import ProcessRuntime
from wakeful.node.sandbox.ports import listeners
from wakeful.node.sandbox.runtime import Identity
from wakeful.node.sandbox.workdir import clear_sandboxes
from wakeful.node.secrets import BASE_ENV
from wakeful.node.settings import NodeSettings
from wakeful.store.testing import free_port

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs Debian's bubblewrap"),
]


WARM = [pytest.param(0, id="cold-join"), pytest.param(1, id="warm-slot")]
"""Every start path: the chain joins the cgroups itself, or a warm slot (wakeful.node.sandbox.slots)
already sits in them. Without cgroups (not root) both are the same path."""


def runtime(data_dir: Path, warm_slots: int = 0) -> ProcessRuntime:
    data_dir.mkdir(exist_ok=True)
    jail = detect_jail(data_dir)
    uids = uid_table(data_dir)
    homes = data_dir / "sandboxes"
    return ProcessRuntime(jail=jail, uids=uids, warm_slots=warm_slots, slot_homes=homes)


@contextlib.asynccontextmanager
async def warm(runtime: ProcessRuntime) -> AsyncIterator[ProcessRuntime]:
    """The runtime with its warm slots filled (as the node agent keeps them) until the end."""
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(runtime.keep_warm)
        if runtime.slots is not None:
            with anyio.fail_after(30):
                await runtime.slots.filled()
        yield runtime
        tasks.cancel_scope.cancel()


async def run(
    data_dir: Path,
    code: str,
    limits: Resources | None = None,
    app: str = "a",
    warm_slots: int = 0,
    command: list[str] | None = None,
) -> tuple[int, str, str | None]:
    """Run `python3 -c code` (or `command`) in a sandbox: (exit code, output's tail, reason)."""
    workdir = data_dir / "sandboxes" / "sb" / "app"
    workdir.mkdir(parents=True, exist_ok=True)
    async with warm(runtime(data_dir, warm_slots)) as started:
        process = await started.start(
            command or ["python3", "-c", code],
            BASE_ENV,
            workdir,
            workdir.parent / "output.log",
            Identity("sb", app, limits or Resources()),
        )
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(process.pump, None)
                code_ = await process.wait()
        if warm_slots and started.slots is not None:
            assert started.slots.taken == 1  # the path under test was the one taken
    return code_, process.tail(), process.reason()


@pytest.mark.parametrize("warm_slots", WARM)
async def test_a_sandbox_sees_its_own_tree_its_own_uid_and_nothing_else(
    tmp_path: Path, warm_slots: int
) -> None:
    (tmp_path / "token").write_text("secret")
    code = (
        "import os; open('/tmp/scratch', 'w').write('x'); open('/dev/shm/s', 'w').write('x'); "
        "print(os.getcwd(), os.getuid(), sorted(os.listdir('/')), "
        "sorted(k for k in os.environ if k not in ('PWD', 'SHLVL', '_', 'LC_CTYPE')), "
        "os.path.exists(" + repr(str(tmp_path / "token")) + "))"
    )
    exit_code, tail, _ = await run(tmp_path, code, warm_slots=warm_slots)
    assert exit_code == 0, tail
    cwd, uid, rest = tail.split(" ", 2)
    assert cwd == "/app"
    if os.geteuid() == 0:
        assert int(uid) >= 400_000  # its app's own uid, never root
        assert uid_table(tmp_path).uid("a") == int(uid)  # recorded
    assert "'root'" not in rest and "'home'" not in rest and "'run'" not in rest
    assert rest.endswith("['LANG', 'PATH'] False")  # no token file, no agent environment


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own needs root")
@pytest.mark.parametrize("warm_slots", WARM)
async def test_the_app_runs_without_any_privilege_left(tmp_path: Path, warm_slots: int) -> None:
    """Whichever path started it (setpriv, or a warm slot dropping privileges itself): every
    uid and gid the app's, no group, every capability set empty, no_new_privs on."""
    fields = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
    code = (
        "status = dict(line.split(':', 1) for line in open('/proc/self/status')); "
        f"print(repr([status[name].split() for name in {fields!r} + ('NoNewPrivs',)]))"
    )
    exit_code, tail, _ = await run(tmp_path, code, warm_slots=warm_slots)
    assert exit_code == 0, tail
    uid = str(uid_table(tmp_path).uid("a"))
    none = ["0000000000000000"]
    assert ast.literal_eval(tail) == [[uid] * 4, [uid] * 4, [], *[none] * 5, ["1"]]


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own needs root")
@pytest.mark.parametrize("warm_slots", WARM)
async def test_the_apps_uid_has_a_name_and_a_home_and_the_hosts_accounts_are_hidden(
    tmp_path: Path, warm_slots: int
) -> None:
    """Programs that look their user up (`whoami`, `~`, getpass) work, and the host's user
    list is not shown; also under the umask an agent runs with (077, `private_data_dir`),
    which once made the sandbox's /etc/passwd unreadable to the app."""
    code = (
        "import getpass, os, pwd; "
        "print(getpass.getuser(), os.path.expanduser('~'), "
        "sorted(p.pw_name for p in pwd.getpwall()), os.popen('whoami').read().strip())"
    )
    umask = os.umask(0o077)
    try:
        exit_code, tail, _ = await run(tmp_path, code, warm_slots=warm_slots)
    finally:
        os.umask(umask)
    assert exit_code == 0, tail
    assert tail.strip() == "app /app ['app', 'nobody', 'root'] app"


@pytest.mark.skipif(landlock_abi() < LANDLOCK_SCOPE_ABI, reason="needs Landlock ABI 6")
@pytest.mark.parametrize("warm_slots", WARM)
async def test_the_hosts_abstract_sockets_and_processes_are_out_of_reach(
    tmp_path: Path, warm_slots: int
) -> None:
    """Abstract UNIX sockets live in the network namespace a sandbox shares with the host:
    each sandbox's own Landlock domain keeps it from connecting to one made outside it, while
    its own still work."""
    name = f"wakeful-test-{uuid.uuid4().hex}"
    code = (
        "import socket\n"
        "own = socket.socket(socket.AF_UNIX); own.bind('\\0own'); own.listen()\n"
        "socket.socket(socket.AF_UNIX).connect('\\0own')\n"
        "try:\n"
        f"    socket.socket(socket.AF_UNIX).connect('\\0{name}'); print('reached')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    with socket.socket(socket.AF_UNIX) as host:
        host.bind("\0" + name)
        host.listen()
        exit_code, tail, _ = await run(tmp_path, code, warm_slots=warm_slots)
    assert exit_code == 0, tail
    assert tail.strip() == "refused 1", tail  # EPERM: Landlock's answer


@pytest.mark.skipif(os.geteuid() != 0, reason="a tmpfs needs root")
@pytest.mark.parametrize("warm_slots", WARM)
async def test_disk_bounds_app_tmp_and_shm_together(tmp_path: Path, warm_slots: int) -> None:
    """10 MiB into each of /app, /tmp and /dev/shm with a 16 MiB `disk`: the third write
    fails (with a tmpfs each, all three would fit)."""
    code = (
        "import errno\n"
        "for path in ('/app/a', '/tmp/b', '/dev/shm/c'):\n"
        "    try:\n"
        "        open(path, 'wb').write(bytes(10 << 20))\n"
        "    except OSError as exc:\n"
        "        print(path, errno.errorcode[exc.errno])\n"
    )
    exit_code, tail, _ = await run(tmp_path, code, Resources(disk="16Mi"), warm_slots=warm_slots)
    assert exit_code == 0, tail
    assert tail.split() == ["/tmp/b", "ENOSPC", "/dev/shm/c", "ENOSPC"]


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
@pytest.mark.parametrize("warm_slots", WARM)
async def test_a_sandbox_killed_for_memory_is_reported_as_such(
    tmp_path: Path, warm_slots: int
) -> None:
    limits = Resources(memory="32Mi")
    code = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"
    exit_code, _, reason = await run(tmp_path, code, limits, warm_slots=warm_slots)
    assert exit_code != 0
    assert reason == "killed: out of memory (limit 32Mi)"


async def test_without_bwrap_the_agent_refuses_and_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to find there
    with pytest.raises(IsolationUnavailable, match="apt-get install bubblewrap"):
        detect_jail(tmp_path)


def test_apps_starting_at_once_each_get_their_own_recorded_uid(tmp_path: Path) -> None:
    """Sandboxes are prepared in worker threads: ten apps waking together once raced on the
    record's temporary file (a start failed with ENOENT)."""
    table = uid_table(tmp_path)
    apps = [f"app{i}" for i in range(40)]

    def start(app: str) -> int:  # as a start does: allocate, exec, then save
        uid = table.uid(app)
        table.save()
        return uid

    with ThreadPoolExecutor(max_workers=40) as pool:
        uids = list(pool.map(start, apps))
    assert len(set(uids)) == len(apps) and min(uids) >= 400_000
    assert [uid_table(tmp_path).uid(app) for app in apps] == uids  # as recorded


def test_two_data_directories_on_one_machine_never_share_a_uid(tmp_path: Path) -> None:
    """Two agents with their own data directories (and uid tables) claim uids machine-wide:
    the second skips the first's, and a recorded uid the other claimed since is given up."""
    claims = tmp_path / "claims"
    first_dir, second_dir = tmp_path / "one", tmp_path / "two"
    first_dir.mkdir()
    second_dir.mkdir()
    first = UidTable(first_dir / "uids.json", claims=claims)
    second = UidTable(second_dir / "uids.json", claims=claims)
    assert first.uid("a") != second.uid("b")
    first.save()  # as a start does once the app runs
    assert first.uid("a") == UidTable(first_dir / "uids.json", claims=claims).uid("a")
    # A table copied from the first (or one that lost its claims): it takes none of its uids.
    (second_dir / "uids.json").write_text(json.dumps({"c": first.uid("a")}))
    assert UidTable(second_dir / "uids.json", claims=claims).uid("c") != first.uid("a")
    # A claim whose data directory is gone is taken over.
    shutil.rmtree(first_dir)
    third_dir = tmp_path / "three"
    third_dir.mkdir()
    assert UidTable(third_dir / "uids.json", claims=claims).uid("d") == 400_000


@pytest.mark.parametrize("warm_slots", WARM)
async def test_the_apps_environment_reaches_the_app_and_nothing_before_it(
    tmp_path: Path, warm_slots: int
) -> None:
    """An app's `env` (LD_PRELOAD, LD_DEBUG...) must not reach prlimit, bwrap or setpriv,
    which run as root (setpriv with root's capabilities), nor the scope step, which runs before
    the Landlock scope: the dynamic loader's debug output names every program it hands control
    to, so only the app may appear in it, while the app does see the variable."""
    workdir = tmp_path / "sandboxes" / "sb" / "app"
    workdir.mkdir(parents=True)
    log = workdir.parent / "output.log"
    async with warm(runtime(tmp_path, warm_slots)) as started:
        process = await started.start(
            ["python3", "-c", "import os; print('app sees', os.environ.get('LD_DEBUG'))"],
            {**BASE_ENV, "LD_DEBUG": "libs"},
            workdir,
            log,
            Identity("sb", "a", Resources()),
        )
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(process.pump, None)
                assert await process.wait() == 0
    output = await anyio.Path(log).read_text()
    assert "app sees libs" in output
    assert "bwrap" not in output and "prlimit" not in output and "setpriv" not in output
    assert output.count("transferring control:") == 1, output  # the app's python3 alone


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
def test_left_over_empty_cgroups_are_swept_and_fresh_ones_kept(tmp_path: Path) -> None:
    cgroups = detect_jail(tmp_path).cgroups
    assert cgroups is not None
    stale, fresh = cgroups.sandbox("sweep-stale-test"), cgroups.sandbox("sweep-fresh-test")
    for cgroup in (stale, fresh):
        cgroup.create(Resources())
    for path in (stale.memory, stale.pids):
        os.utime(path, (1, 1))  # left behind long ago
    try:
        cgroups.sweep()
        assert not stale.memory.exists() and not stale.pids.exists()
        assert fresh.memory.exists() and fresh.pids.exists()  # may be waiting for its sandbox
    finally:
        stale.remove()
        fresh.remove()


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own needs root")
async def test_a_port_answered_by_someone_else_is_not_the_sandboxs(tmp_path: Path) -> None:
    """Another app could bind a sandbox's port first, and its probe would succeed: the agent
    checks who listens before it calls the sandbox ready."""
    workdir = tmp_path / "sandboxes" / "sb" / "app"
    workdir.mkdir(parents=True)
    listen = (
        "import socket, sys, time; s = socket.socket(); "
        "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True); "
        "time.sleep(60)"
    )
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    free = free_port()
    process = await runtime(tmp_path).start(
        ["python3", "-c", listen, str(free)], BASE_ENV, workdir, workdir.parent / "o.log"
    )
    listening = anyio.Event()

    def seen(chunk: bytes) -> None:
        if b"up" in chunk:
            listening.set()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(process.pump, seen)
            with anyio.fail_after(30):
                await listening.wait()
            assert listeners(free)  # our own parser finds it
            assert process.owns_port(free)
            assert not process.owns_port(taken)  # root's socket, not the sandbox's uid
            await process.stop(5)
    finally:
        squatter.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_what_a_crashed_agent_left_is_unmounted_and_removed_at_start(tmp_path: Path) -> None:
    """A killed agent leaves its sandboxes' tmpfs mounted (memory held) and their directories
    on disk; the next start clears both before anything runs."""
    left = tmp_path / "sandboxes" / "old-1" / "fs"
    mount_sandbox_fs(left, 1 << 20)
    (left / "data").write_text("x")
    (tmp_path / "sandboxes" / "old-2" / "app").mkdir(parents=True)
    try:
        clear_sandboxes(tmp_path)
        mounts = Path("/proc/self/mounts").read_text()
        assert str(left) not in mounts
        assert not (tmp_path / "sandboxes").exists()
    finally:
        if str(left) in Path("/proc/self/mounts").read_text():
            unmount(left)


def test_control_plane_endpoints_are_read_from_the_urls_a_node_is_given() -> None:
    urls = [
        "etcd://127.0.0.1:2379,10.1.2.3:2380",  # loopback: refused by the base rules already
        "http://192.0.2.7:8082",
        "https://[2001:db8::1]:9000",
        "http://198.51.100.4",  # the scheme's port
        "sqlite:///state/store.db",  # not a network address
        "http://nosuch.invalid:1",  # does not resolve: the node could not reach it either
    ]
    assert control_endpoints(urls) == [
        ("10.1.2.3", 2380),
        ("192.0.2.7", 8082),
        ("198.51.100.4", 80),
        ("2001:db8::1", 9000),
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="nftables needs root")
def test_a_control_plane_on_another_machine_is_refused_to_sandbox_uids() -> None:
    """192.0.2.7 (TEST-NET) stands for the control API on another machine: unreachable here,
    so without the rule a connect times out; with it, it is refused at once."""
    code = (
        "import socket\ntry:\n socket.create_connection(('192.0.2.7', 8082), timeout=1)\n"
        "except Exception as e:\n print(type(e).__name__)"
    )
    sandbox_uid = ["setpriv", "--reuid=400001", "--regid=400001", "--clear-groups"]

    def tried(address: str, *prefix: str) -> str:
        attempt = code.replace("192.0.2.7", address)
        done = subprocess.run([*prefix, "/usr/bin/python3", "-c", attempt], capture_output=True)
        return done.stdout.decode().strip()

    try:
        assert install_network_rules([("192.0.2.7", 8082)]) is None
        assert tried("192.0.2.7", *sandbox_uid) == "ConnectionRefusedError"
        assert tried("192.0.2.7") != "ConnectionRefusedError"  # only sandbox uids
        # The control plane moved (a container restarted on another address): the sets
        # follow, the old address is no longer refused and the new one is.
        assert fence_control([("203.0.113.8", 8082)]) is None
        assert tried("203.0.113.8", *sandbox_uid) == "ConnectionRefusedError"
        assert tried("192.0.2.7", *sandbox_uid) != "ConnectionRefusedError"
    finally:
        install_network_rules()


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
async def test_a_warm_slot_becomes_the_sandbox_in_its_own_cgroups_and_is_replaced(
    tmp_path: Path,
) -> None:
    """The slot's cgroups take the sandbox's name and the app's limits (a 24Mi app must not
    keep the slot's looser ones); the rlimits the chain's prlimit would set are set; the pool
    fills up again once the start settled; and when the runtime stops, no idle slot and no
    slot cgroup is left."""
    workdir = tmp_path / "sandboxes" / "sb" / "app"
    workdir.mkdir(parents=True)
    started = runtime(tmp_path, warm_slots=1)
    assert started.slots is not None and started.jail is not None
    cgroups = started.jail.cgroups
    assert cgroups is not None
    code = (
        "import resource; "
        "print(open('/proc/self/cgroup').read().replace(chr(10), ' '), "
        "resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    limits = Resources(memory="24Mi", open_files=99)
    sandbox_id = f"sb-warm-{uuid.uuid4().hex[:8]}"
    async with warm(started):
        idle = started.slots.idle
        process = await started.start(
            ["python3", "-c", code],
            BASE_ENV,
            workdir,
            workdir.parent / "output.log",
            Identity(sandbox_id, "a", limits),
        )
        assert process.pid == idle[0].process.pid  # the slot itself became the sandbox
        for _ in range(20):
            await anyio.lowlevel.checkpoint()  # the pool's task would start a refill here
        assert started.slots.spawned == 1  # held back while the start boots (slots.py)
        memory = cgroups.sandbox(sandbox_id).memory
        assert (memory / "memory.limit_in_bytes").read_text().strip() == str(24 << 20)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(process.pump, None)
                assert await process.wait() == 0
            await started.slots.filled()
        assert started.slots.taken == 1
        spare = started.slots.idle
    assert f"wakeful/{sandbox_id}" in process.tail() and "(99, 99)" in process.tail()
    assert all(slot.process.returncode is not None for slot in spare)
    left = [p.name for p in cgroups.memory.iterdir() if p.name.startswith("slot-")]
    left_pids = {pid for name in left for pid in cgroups.sandbox(name).pids_in()}
    assert not left_pids & {slot.process.pid for slot in spare}


@pytest.mark.parametrize("warm_slots", WARM)
async def test_the_app_starts_with_no_signal_ignored(tmp_path: Path, warm_slots: int) -> None:
    """The agent and a warm slot are Python, which ignores SIGPIPE and SIGXFSZ; an ignored
    signal stays ignored across exec, so a shell pipeline in the app would never see SIGPIPE."""
    grep = ["grep", "SigIgn", "/proc/self/status"]
    exit_code, tail, _ = await run(tmp_path, "", warm_slots=warm_slots, command=grep)
    assert exit_code == 0, tail
    assert tail.split() == ["SigIgn:", "0000000000000000"]


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
@pytest.mark.parametrize("after", [0.0, 0.005, 0.02])
async def test_stopping_the_pool_while_it_spawns_leaves_no_slot(
    tmp_path: Path, after: float
) -> None:
    """The pool stopped at any point of a slot's start (before, while or after it joins its
    cgroups): no slot process of this pool is left in a cgroup."""
    started = runtime(tmp_path, warm_slots=2)
    assert started.jail is not None and started.jail.cgroups is not None
    cgroups = started.jail.cgroups
    before = {p.name for p in cgroups.memory.iterdir() if p.name.startswith("slot-")}
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(started.keep_warm)
        await anyio.sleep(after)
        tasks.cancel_scope.cancel()
    made = {p.name for p in cgroups.memory.iterdir() if p.name.startswith("slot-")} - before
    # An empty one may stay a moment (the kernel refuses the first rmdir of a cgroup whose
    # last process just died); `sweep` removes those (test above). None may hold a process.
    assert [name for name in made if cgroups.sandbox(name).pids_in()] == []


def _claim_one(data_dir: str, claims: str, go: Any, out: Any) -> None:
    go.wait()
    out.put(UidTable(Path(data_dir) / "uids.json", claims=Path(claims)).uid("a"))


def test_agents_claiming_at_the_same_moment_never_share_a_uid(tmp_path: Path) -> None:
    """Six agents (processes, data directories of their own) allocating at once, over claims
    some of which are stale: every claim is made under one machine-wide lock. Without it an
    empty or just-replaced claim was taken over twice in most rounds."""
    context = multiprocessing.get_context("fork")
    for round_ in range(10):
        claims = tmp_path / f"claims-{round_}"
        claims.mkdir()
        for uid in range(400_000, 400_003):  # stale: their data directories are gone
            (claims / str(uid)).write_text(str(tmp_path / "gone"))
        go, out = context.Event(), context.Queue()
        dirs = []
        for n in range(6):
            (data_dir := tmp_path / f"r{round_}-agent{n}").mkdir()
            dirs.append(data_dir)
        workers = [
            context.Process(target=_claim_one, args=(str(d), str(claims), go, out)) for d in dirs
        ]
        for worker in workers:
            worker.start()
        go.set()
        uids = [out.get(timeout=30) for _ in workers]
        for worker in workers:
            worker.join(30)
        assert len(set(uids)) == len(uids), uids


def test_an_agent_gives_only_the_uids_of_its_range(tmp_path: Path) -> None:
    """WAKEFUL_SANDBOX_UIDS: agents that cannot see each other's claims (compose nodes whose
    root is the host's) take parts of the sandbox range that do not meet."""
    claims = tmp_path / "claims"
    table = UidTable(tmp_path / "uids.json", claims=claims, uids=(450_000, 450_001))
    assert {table.uid("a"), table.uid("b")} == {450_000, 450_001}
    with pytest.raises(IsolationUnavailable, match="no free sandbox uid left for app 'c'"):
        table.uid("c")
    table.save()
    # The same table read with another range: its recorded uids outside it are given anew.
    moved = UidTable(tmp_path / "uids.json", claims=claims, uids=(460_000, 460_009))
    assert 460_000 <= moved.uid("a") <= 460_009


@pytest.mark.parametrize("value", ["[399999,400010]", "[400010,400009]", "[499000,500000]"])
def test_a_uid_range_outside_the_sandbox_range_is_refused(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAKEFUL_SANDBOX_UIDS", value)
    with pytest.raises(ValueError, match="sandbox_uids"):
        NodeSettings()


def test_the_default_gateway_is_read_from_the_routes(tmp_path: Path) -> None:
    routes = tmp_path / "route"
    routes.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "eth0\t00000000\t0100580A\t0003\t0\t0\t0\t00000000\n"  # default via 10.88.0.1
        "eth0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\n"
    )
    assert default_gateways(routes) == ["10.88.0.1"]
    assert default_gateways(tmp_path / "absent") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="nftables needs root")
def test_a_gateway_is_refused_to_sandbox_uids_but_for_dns() -> None:
    """In a container the default gateway is the host: refused, but for DNS (podman's
    networks answer names there). 203.0.113.9 (TEST-NET-3) stands for it: without the rule a
    connect times out; with it, it is refused at once. Not in 192.0.2.0/24, which CI's own
    network may hold: a neighbour that failed to resolve there made test_peers' unfenced
    connects fail at once instead of timing out."""
    code = (
        "import socket, sys\ntry:\n"
        " socket.create_connection(('203.0.113.9', int(sys.argv[1])), timeout=1)\n"
        "except Exception as e:\n print(type(e).__name__)"
    )
    sandbox_uid = ["setpriv", "--reuid=400001", "--regid=400001", "--clear-groups"]

    def tried(port: int) -> str:
        command = [*sandbox_uid, "/usr/bin/python3", "-c", code, str(port)]
        return subprocess.run(command, capture_output=True).stdout.decode().strip()

    try:
        assert install_network_rules(gateways=["203.0.113.9"]) is None
        assert tried(8082) == "ConnectionRefusedError"
        assert tried(53) != "ConnectionRefusedError"
    finally:
        install_network_rules()
