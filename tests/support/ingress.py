"""An ingress in the test's process on the memory store with the real activator, sandboxes as
subprocesses (`examples/hello`), and raw sockets and servers for what a client library would
not send or a sandbox would not answer."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
from prometheus_client import CollectorRegistry

from tests.support.listening import listens
from wakeful.activator.client import InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.aio.marks import Marks
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.ingress import Ingress, IngressSettings
from wakeful.ingress.acme import CertSource
from wakeful.ingress.preread import PREREAD_BYTES
from wakeful.store import Store, open_store
from wakeful.store.testing import free_port

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello" / "app.py"


def sandbox_processes(script: Path) -> Iterator[Callable[[], int]]:
    """A fixture's body: start sandboxes running `script` (real processes, PORT set); returns
    each one's port. Stopped at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        for _ in range(5):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, str(script)],
                env={**os.environ, "PORT": str(port)},
                stdout=subprocess.DEVNULL,
            )
            procs.append(proc)
            if listens(proc, port):
                return port
        raise RuntimeError(f"{script.name} found no free port in five tries")

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)


def closed_port() -> int:
    """A loopback port nothing listens on: connecting is refused."""
    return free_port()


def sandbox(sandbox_id: str, port: int | None, status: SandboxStatus) -> Sandbox:
    running = status is SandboxStatus.RUNNING
    return Sandbox(
        id=sandbox_id,
        pool="hello-v1",
        app="hello",
        node="n1",
        status=status,
        ready=running,
        address=f"127.0.0.1:{port}" if port is not None else None,
    )


@dataclass
class Stack:
    store: Store
    activator: Activator
    ingress: Ingress
    client: httpx.AsyncClient
    registry: CollectorRegistry
    routes_seen: Marks
    """Where the in-process ingress says how far its routes have come."""

    @property
    def url(self) -> str:
        host, port = self.ingress.address
        return f"http://{host}:{port}"

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(f"wakeful_ingress_{name}", labels)
        return 0.0 if value is None else value

    def leased(self) -> int:
        return sum(s.leased for s in self.activator.snapshot())

    async def put_sandbox(
        self, sandbox_id: str, port: int | None, status: SandboxStatus = SandboxStatus.RUNNING
    ) -> None:
        await self.store.put(f"sandboxes/{sandbox_id}", sandbox(sandbox_id, port, status))


@contextlib.asynccontextmanager
async def stack(
    sandboxes: dict[str, int | None] | None = None,
    *,
    rpi: int = 5,
    max_instances: int = 20,
    activation_timeout: float = 30,
    hosts: list[str] | None = None,
    extra_apps: list[App] | None = None,
    pool_update: dict[str, object] | None = None,
    activator: dict[str, object] | None = None,
    clock: Callable[[], float] | None = None,
    certs: CertSource | None = None,
    **settings: object,
) -> AsyncIterator[Stack]:
    """The whole path on the memory store. `sandboxes` maps id → port (running) or None
    (booting). `clock`: one clock for the activator's leases and the ingress's lease cache.
    `certs`: where the ingress gets certificates from ACME.
    Keyword arguments left over are IngressSettings fields."""
    async with open_store("memory://") as store:
        spec = AppSpec(
            command=["serve"],
            concurrency=Concurrency(requests_per_instance=rpi, max_instances=max_instances),
            activation_timeout=activation_timeout,
        )
        await store.put("apps/hello", App(name="hello", hosts=hosts or [], active_version="v1"))
        for other in extra_apps or []:
            await store.put(f"apps/{other.name}", other)
        pool = Pool(name="hello-v1", app="hello", version="v1", spec=spec, desired_instances=1)
        if pool_update:
            pool = pool.model_copy(update=pool_update)
        await store.put("pools/hello-v1", pool)
        for sandbox_id, port in (sandboxes or {}).items():
            status = SandboxStatus.RUNNING if port is not None else SandboxStatus.BOOTING
            await store.put(f"sandboxes/{sandbox_id}", sandbox(sandbox_id, port, status))
        registry = CollectorRegistry()
        config = ActivatorSettings(store_url="memory://", token="t", **activator or {})  # type: ignore[arg-type]
        the_activator = Activator(store, config, registry, **({"clock": clock} if clock else {}))
        routes_seen = Marks(settle=0)
        ingress_settings = IngressSettings(
            store_url="memory://",
            **{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", **settings},  # type: ignore[arg-type]
        )
        ingress = Ingress(
            ingress_settings,
            InProcessLeases(the_activator, routes_seen),
            store,
            registry,
            certs=certs,
            **({"clock": clock} if clock else {}),  # type: ignore[arg-type]
        )
        async with the_activator.running(), ingress.running():
            host, port = ingress.address
            async with httpx.AsyncClient(
                base_url=f"http://{host}:{port}",
                headers={"Host": "hello.localhost"},
                timeout=30,
            ) as client:
                yield Stack(store, the_activator, ingress, client, registry, routes_seen)


class RawServer:
    """A loopback TCP server running `handle(conn)` per connection in a thread: for sandbox
    misbehaviour the hello app cannot show (a reset after reading, canned headers)."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self._handle = handle
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                self._handle(conn)


def read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def answering(answer: bytes) -> Callable[[socket.socket], None]:
    """A sandbox (for `RawServer`) that reads a request's head and sends `answer`, as is."""

    def handle(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(answer)

    return handle


def keep_alive(heads: list[bytes]) -> Callable[[socket.socket], None]:
    """A sandbox (for `RawServer`) that serves its connection's requests in turn, answering
    each "ok" and keeping its head in `heads`; it reads a body as uvicorn does, by its
    Content-Length (a length longer than the body takes the next request's bytes for the
    rest) or to the end of its chunks."""

    def handle(conn: socket.socket) -> None:
        conn.settimeout(10)
        buffered = b""

        def more() -> bytes:
            chunk = conn.recv(65536)
            if not chunk:
                raise EOFError
            return chunk

        with contextlib.suppress(OSError, EOFError):
            while True:
                while b"\r\n\r\n" not in buffered:
                    buffered += more()
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                heads.append(head)
                if b"transfer-encoding: chunked" in head.lower():
                    while b"0\r\n\r\n" not in buffered:
                        buffered += more()
                    buffered = buffered.split(b"0\r\n\r\n", 1)[1]
                elif length := re.search(rb"(?i)\r\ncontent-length: *(\d+)", head):
                    while len(buffered) < int(length.group(1)):
                        buffered += more()
                    buffered = buffered[int(length.group(1)) :]
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    return handle


def reset_after_reading(conn: socket.socket) -> None:
    """Read the request, then reset the connection: bytes reached the sandbox."""
    read_head(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def held(
    client: httpx.AsyncClient,
    release: anyio.Event,
    size: int = 4 * PREREAD_BYTES,
    headers: dict[str, str] | None = None,
) -> int:
    """A request that stays in flight until `release` is set, however slow the machine: a POST
    whose second half of the body is sent only then (the sandbox answers once it has it all).
    The first half is past what the ingress reads before it forwards (`preread`), so the
    request holds its lease and its upstream connection meanwhile. Returns the status."""

    async def body() -> AsyncIterator[bytes]:
        yield b"x" * (size // 2)
        await release.wait()
        yield b"x" * (size - size // 2)

    sent = {"Content-Length": str(size), **(headers or {})}
    answer = await client.post("/", content=body(), headers=sent)
    return answer.status_code


def talk(port: int, data: bytes, *, reset_ok: bool = False) -> bytes:
    """Send `data` at once, then read until the ingress closes the connection. `reset_ok`:
    a connection the ingress refuses with bytes of ours unread may end in a reset (the kernel
    sends one), after whatever it answered first."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:
            if not reset_ok:
                raise
    return got


def responses(data: bytes) -> list[tuple[int, bytes]]:
    """Status and body of each Content-Length framed answer in `data`, in order."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")
        )
        out.append((status, rest[:length]))
        data = rest[length:]
    return out
