"""The workers' supervisor (`ingress.workers`): each worker's settings, the merged metrics, the
kept port, a worker that cannot start. The workers serving together, one killed and started
again, all stopped as one: tests/e2e/test_ingress_workers.py."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

import wakeful.ingress.workers as workers_module
from wakeful.aio.spawn import Child
from wakeful.ingress.ports import Closing, reserve, reserved
from wakeful.ingress.settings import IngressSettings, split_address
from wakeful.ingress.workerrules import HUNG, hung, restart_pause, share, shifted
from wakeful.ingress.workers import (
    Supervisor,
    Worker,
    labelled,
    supervise,
    tunnel_listeners,
    worker_env,
)
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio


def test_each_worker_is_a_replica_with_its_own_tunnel_port_and_name() -> None:
    settings = IngressSettings(
        tunnel_listen="0.0.0.0:9000",
        tunnel_advertise="ingress-a.internal:9000",
        ingress_workers=3,
    )
    envs = [
        worker_env(
            settings, i, listen="0.0.0.0:8080", tls_listen=None, admin="127.0.0.1:41", replica="a"
        )
        for i in range(3)
    ]
    assert [e["WAKEFUL_TUNNEL_REPLICA"] for e in envs] == ["a-w0", "a-w1", "a-w2"]
    assert [e["WAKEFUL_TUNNEL_LISTEN"] for e in envs] == [
        "0.0.0.0:9000",
        "0.0.0.0:9001",
        "0.0.0.0:9002",
    ]
    assert envs[2]["WAKEFUL_TUNNEL_ADVERTISE"] == "ingress-a.internal:9002"
    assert {e["WAKEFUL_LISTEN"] for e in envs} == {"0.0.0.0:8080"}  # shared
    assert [e["WAKEFUL_INGRESS_WORKER"] for e in envs] == ["0", "1", "2"]
    assert {e["WAKEFUL_INGRESS_WORKERS"] for e in envs} == {"1"}  # a worker never forks more
    assert "WAKEFUL_TLS_LISTEN" not in envs[0]
    assert [e["WAKEFUL_ACCESS_LOG_RATE"] for e in envs] == ["334", "333", "333"]  # shared
    assert shifted("[::1]:0", 4) == "[::1]:0"  # each its own free port
    assert shifted("[::1]:443", 1) == "[::1]:444"
    assert tunnel_listeners(settings) == (
        "tunnel listeners: 0.0.0.0:9000, 0.0.0.0:9001, 0.0.0.0:9002"
        " (the tunnel balancer lists each)"
    )


def test_the_supervisor_names_its_tunnel_listeners_only_when_it_has_them() -> None:
    assert tunnel_listeners(IngressSettings(ingress_workers=2)) is None
    free = tunnel_listeners(IngressSettings(tunnel_listen="[::1]:0", ingress_workers=2))
    assert free is not None and "free port" in free


@pytest.mark.parametrize(
    ("total", "workers", "parts"),
    [(1000, 3, [334, 333, 333]), (1000, 1, [1000]), (10, 4, [3, 3, 2, 2]), (1, 3, [1, 1, 1])],
)
def test_the_access_log_rate_is_shared_adding_up_to_it(
    total: int, workers: int, parts: list[int]
) -> None:
    """Each worker's `WAKEFUL_ACCESS_LOG_RATE`: the parts add up to the ingress's rate (a
    rate below the workers' count gives each the least a setting takes, 1)."""
    assert [share(total, workers, i) for i in range(workers)] == parts


@pytest.mark.parametrize(
    ("last", "ran", "pause"),
    [
        (None, 0.1, 1.0),
        (1.0, 0.1, 2.0),
        (8.0, 5.0, 16.0),
        (16.0, 5.0, 30.0),
        (30.0, 5.0, 30.0),
        (30.0, 60.0, 1.0),
    ],
    ids=[
        "the first restart waits a second",
        "a crash soon after doubles it",
        "and again",
        "up to 30 s",
        "no further",
        "a worker that ran a minute starts over at a second",
    ],
)
def test_restart_pause(last: float | None, ran: float, pause: float) -> None:
    assert restart_pause(last, ran) == pause


@pytest.mark.parametrize(
    ("silent_since", "now", "verdict"),
    [
        (None, 1e6, False),
        (100.0, 100.0, False),
        (100.0, 100.0 + HUNG - 0.1, False),
        (100.0, 100.0 + HUNG, True),
    ],
    ids=[
        "answering, or never ready since it started: never hung",
        "just stopped answering",
        "a moment short of the bound",
        "the bound: hung",
    ],
)
def test_hung(silent_since: float | None, now: float, verdict: bool) -> None:
    assert hung(silent_since, now) is verdict


def test_a_worker_count_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="must be 1 to 256 or 'auto'"):
        IngressSettings(ingress_workers=0)
    assert IngressSettings(ingress_workers="auto").workers >= 1
    assert IngressSettings(ingress_workers="3").workers == 3  # as WAKEFUL_INGRESS_WORKERS=3


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def test_metrics_of_every_worker_merge_with_a_worker_label() -> None:
    one = (
        "# HELP wakeful_ingress_requests_total Requests answered\n"
        "# TYPE wakeful_ingress_requests_total counter\n"
        'wakeful_ingress_requests_total{app="hello",status_class="2xx"} 5.0\n'
    )
    two = one.replace("5.0", "7.0")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(labelled([(0, one), (1, two), (2, "not { metrics")])))
    text = generate_latest(registry).decode()
    [family] = text_string_to_metric_families(text)  # one family, not one per worker
    got = {s.labels["worker"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert got == {"0": 5.0, "1": 7.0}


def test_the_port_is_kept_for_the_workers_and_taken_by_nobody_else() -> None:
    port = free_port()
    with reserve(f"127.0.0.1:{port}", "listen address") as held:
        assert held.getsockname()[1] == port
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))  # without SO_REUSEPORT: refused
        with socket.socket() as probe:
            probe.settimeout(2)
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # bound, not listening


async def test_a_worker_that_never_becomes_ready_stops_them_all_with_the_reason() -> None:
    settings = IngressSettings(
        listen=f"127.0.0.1:{free_port()}",
        admin_listen=f"127.0.0.1:{free_port()}",
        ingress_workers=2,
    )
    told: list[str] = []
    with anyio.fail_after(30):
        why = await supervise(
            settings,
            announce=told.append,
            wait_for_stop=anyio.Event().wait,
            command=[sys.executable, "-c", "import sys; sys.exit(3)"],
        )
    assert why is not None
    assert "exited with status 3 before it was ready" in why
    assert told == []  # never announced as listening


SANDBOX = r"""
import os, socket, sys
os.setgid(65534); os.setuid(65534)   # another user, as a sandbox runs
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen()
except OSError:
    print("refused", flush=True)
    sys.exit(0)
print("listening", flush=True)
s.settimeout(5)
try:
    s.accept()
    print("accepted", flush=True)
except OSError:
    pass
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_no_other_user_can_take_the_kept_port_while_no_worker_listens(host: str) -> None:
    """Between the reservation and the first worker's listen (startup), or while every
    worker is being restarted, a sandbox's user binding the port with SO_REUSEADDR is
    refused (it once was not: the supervisor's own socket had SO_REUSEADDR)."""
    port = free_port()
    with reserve(f"{host}:{port}", "listen address"):
        sandbox = subprocess.Popen(
            [sys.executable, "-c", SANDBOX, host, str(port)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert sandbox.stdout is not None
            said = sandbox.stdout.readline().strip()
            assert said == "refused", "a sandbox's user took the client port the workers keep"
        finally:
            sandbox.kill()
            sandbox.wait()
            assert sandbox.stdout is not None
            sandbox.stdout.close()


def test_a_port_another_reuseport_listener_serves_is_a_taken_port() -> None:
    """A port another listener of this user serves with SO_REUSEPORT (a second `wakeful
    ingress --workers` on it, or workers a killed supervisor left) is taken: two sets of
    workers would otherwise share it, the kernel splitting clients between them."""
    port = free_port()
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        with pytest.raises(OSError, match="in use"):
            reserve(f"127.0.0.1:{port}", "listen address").close()


FAKE_WORKER = r"""
import os, signal, socket, sys
host, port = os.environ["WAKEFUL_ADMIN_LISTEN"].rsplit(":", 1)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind((host, int(port)))
s.listen()
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
draining = sys.argv[1] if len(sys.argv) > 1 else None  # a file: 503 once it is there
while True:
    c, _ = s.accept()
    c.recv(65536)
    status = b"503 Draining" if draining and os.path.exists(draining) else b"200 OK"
    c.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    c.close()
"""


async def test_workers_are_seen_ready_with_a_proxy_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ingress host with HTTP_PROXY set for its egress and no NO_PROXY for loopback: the
    supervisor's looks at its workers' admin ports once went to the proxy, and no worker was
    ever seen ready."""
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    tunnel = free_port()
    settings = IngressSettings(
        listen=f"127.0.0.1:{free_port()}",
        admin_listen=f"127.0.0.1:{free_port()}",
        tunnel_listen=f"127.0.0.1:{tunnel}",
        ingress_workers=2,
    )
    told: list[str] = []
    stop = anyio.Event()

    async def wait_for_stop() -> None:
        with anyio.move_on_after(6):
            await stop.wait()

    why = await supervise(
        settings,
        announce=lambda line: (told.append(line), stop.set()),
        wait_for_stop=wait_for_stop,
        command=[sys.executable, "-c", FAKE_WORKER],
    )
    assert why is None
    assert told, "workers serving /readyz 200 were never seen ready"
    # ... and the announcement names each worker's tunnel port, for the tunnel balancer
    assert f"127.0.0.1:{tunnel}, 127.0.0.1:{tunnel + 1} (the tunnel balancer" in told[0]


async def test_a_stop_while_a_worker_is_being_spawned_still_stops_and_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop that lands between a worker's start and its `Child` coming back (no await
    there now that workers start through `spawn` with no pipes; made one here) still stops
    that worker and waits for it before `supervise` returns."""
    spawned: list[Child] = []
    forked = anyio.Event()
    real = workers_module.spawn

    async def slow_spawn(*args: Any, **kwargs: Any) -> Child:
        process = await real(*args, **kwargs)
        spawned.append(process)
        forked.set()
        await anyio.sleep(0.3)  # the await between its start and the Child coming back
        return process

    monkeypatch.setattr(workers_module, "spawn", slow_spawn)
    settings = IngressSettings(
        listen=f"127.0.0.1:{free_port()}",
        admin_listen=f"127.0.0.1:{free_port()}",
        ingress_workers=2,
    )
    with anyio.fail_after(20):
        await workers_module.supervise(
            settings,
            announce=lambda line: None,
            wait_for_stop=forked.wait,
            command=[sys.executable, "-c", FAKE_WORKER],
        )
    try:
        still = [p.pid for p in spawned if p.returncode is None and _alive(p.pid)]
        assert not still, f"workers {still} still run after supervise returned"
    finally:
        for p in spawned:
            if p.returncode is None:
                p.kill()
                await p.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


async def test_workers_start_with_the_variables_given_and_the_addresses_are_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`env` replaces this process's variables (`wakeful up` leaves its admin token out);
    `bound` hears the client address with its port 0 resolved."""
    monkeypatch.setenv("WAKEFUL_TOKEN", "the-admin-token")
    settings = IngressSettings(
        listen="127.0.0.1:0", admin_listen=f"127.0.0.1:{free_port()}", ingress_workers=2
    )
    told: list[tuple[tuple[str, int], tuple[str, int] | None, tuple[str, int]]] = []
    record = (
        "import os, pathlib, time; w = os.environ['WAKEFUL_INGRESS_WORKER']; "
        f"d = pathlib.Path({str(tmp_path)!r}); (d / ('.' + w)).write_text("
        "os.environ.get('GIVEN', '-') + ' ' + os.environ.get('WAKEFUL_TOKEN', '-')); "
        "os.replace(d / ('.' + w), d / w); time.sleep(60)"
    )

    async def both_written() -> None:
        for _ in range(1500):  # fail_after ends it sooner
            if await anyio.to_thread.run_sync(lambda: len(list(tmp_path.glob("[01]"))) == 2):
                return
            await anyio.sleep(0.02)

    with anyio.fail_after(30):
        await supervise(
            settings,
            announce=lambda line: None,
            wait_for_stop=both_written,
            command=[sys.executable, "-c", record],
            env={"GIVEN": "yes", "PATH": os.environ["PATH"]},
            bound=lambda listen, tls, admin: told.append((listen, tls, admin)),
        )
    assert {(tmp_path / w).read_text() for w in ("0", "1")} == {"yes -"}
    [(listen, tls, admin)] = told
    assert listen[0] == "127.0.0.1" and listen[1] > 0 and tls is None
    assert admin == split_address(settings.admin_listen)


async def test_a_cancelled_supervisor_still_stops_its_workers(tmp_path: Path) -> None:
    """`wakeful up` runs the supervisor in a task group its own failure cancels: the workers
    stop with it, not at the process's exit."""
    settings = IngressSettings(
        listen="127.0.0.1:0", admin_listen=f"127.0.0.1:{free_port()}", ingress_workers=2
    )
    record = (
        f"import os, pathlib, time; pathlib.Path({str(tmp_path)!r}, str(os.getpid())).touch(); "
        "time.sleep(60)"
    )
    with anyio.move_on_after(20) as scope:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(
                functools.partial(
                    supervise,
                    settings,
                    announce=lambda line: None,
                    wait_for_stop=anyio.sleep_forever,
                    command=[sys.executable, "-c", record],
                )
            )
            for _ in range(1000):
                if await anyio.to_thread.run_sync(lambda: len(list(tmp_path.iterdir())) == 2):
                    break
                await anyio.sleep(0.02)
            tasks.cancel_scope.cancel()
    assert not scope.cancelled_caught, "the workers never started"
    pids = await anyio.to_thread.run_sync(lambda: [int(p.name) for p in tmp_path.iterdir()])
    assert len(pids) == 2 and not [pid for pid in pids if _alive(pid)], pids


@contextlib.asynccontextmanager
async def one_worker(
    clock: Callable[[], float], *args: str
) -> AsyncIterator[tuple[Supervisor, Worker]]:
    """A supervisor of one fake worker (`FAKE_WORKER` with `args`) on `clock`, once the
    worker is ready; stopped after the block."""
    admin = f"127.0.0.1:{free_port()}"
    worker = Worker(0, {"WAKEFUL_ADMIN_LISTEN": admin}, admin)
    command = [sys.executable, "-c", FAKE_WORKER, *args]
    supervisor = Supervisor([worker], command, stop_timeout=5, clock=clock)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(supervisor.run)
        try:
            with anyio.fail_after(30):
                while not worker.ready:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            yield supervisor, worker
        finally:
            supervisor.stop()


async def test_a_worker_that_stops_answering_is_killed_and_started_again() -> None:
    """A worker stopped (SIGSTOP) or deadlocked keeps its share of the port's connections,
    and its process never exits: once it has not answered its /readyz for `HUNG` seconds
    (the supervisor's clock, driven here) it is killed, started again and counted. Before,
    it was only marked not ready, for ever (a hostile tester's find)."""
    now = [1000.0]
    async with one_worker(lambda: now[0]) as (supervisor, worker):
        first = worker.process
        assert first is not None
        os.kill(first.pid, signal.SIGSTOP)
        with anyio.fail_after(30):  # seen not answering
            while worker.silent_since is None:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        now[0] += HUNG - 1
        await anyio.sleep(3)  # several looks, a second short of the bound: kept
        assert worker.process is first and first.returncode is None
        now[0] += 2
        with anyio.fail_after(30):
            while worker.process is first or not worker.ready:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        restarts = supervisor.registry.get_sample_value(
            "wakeful_ingress_worker_restarts_total", {"worker": "0"}
        )
        assert restarts == 1


async def test_a_port_held_by_closing_connections_is_waited_for_not_refused() -> None:
    """An ingress that ran alone (no SO_REUSEPORT) leaves its closed connections in
    TIME_WAIT on the port for a minute, and the kernel refuses the port to a SO_REUSEPORT
    bind meanwhile: switching to workers and starting at once failed (a hostile tester's
    find). Such a port is `Closing`, not taken, and `reserved` waits for it, at most its
    bound (here 1.5 s), saying why."""
    port = free_port()
    with (
        socket.create_server(("127.0.0.1", port)) as listener,  # SO_REUSEADDR, no REUSEPORT
        socket.create_connection(("127.0.0.1", port)) as client,
    ):
        conn, _ = listener.accept()
        conn.close()  # the server's side closes first: its end waits in TIME_WAIT
        assert client.recv(1) == b""
    with pytest.raises(Closing):
        reserve(f"127.0.0.1:{port}", "listen address")
    started = time.monotonic()
    with pytest.raises(Closing, match="TIME_WAIT"):
        await reserved(f"127.0.0.1:{port}", "listen address", wait=1.5)
    assert time.monotonic() - started >= 1.5


async def test_a_worker_that_answers_503_while_it_drains_is_not_taken_for_hung(
    tmp_path: Path,
) -> None:
    """A 503 is an answer: a worker draining (told to stop on its own, with a long shutdown
    timeout) stays unready for longer than `HUNG` and is let finish, not killed."""
    now = [1000.0]
    flag = tmp_path / "draining"
    async with one_worker(lambda: now[0], str(flag)) as (_, worker):
        first = worker.process
        flag.touch()  # it answers 503 from now on
        with anyio.fail_after(30):
            while worker.ready:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        now[0] += HUNG + 60
        await anyio.sleep(3)  # several looks past the bound
        assert worker.process is first and worker.silent_since is None
