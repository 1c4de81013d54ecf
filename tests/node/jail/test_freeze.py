"""Freezing a sandbox for the suspended tier, on real processes: the cgroup v1 freezer (root,
isolated), SIGSTOP to every process of its PID namespace (isolated without a freezer) and to
its process group (unisolated). A request sent while it is frozen waits in the listen backlog
and is answered once it is thawed; a frozen sandbox still stops."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
from pathlib import Path

import anyio
import pytest

from tests.support.node import uid_table
from wakeful.domain.models import Resources
from wakeful.node.jail.cgroups import Cgroups
from wakeful.node.jail.detect import detect_jail
from wakeful.node.jail.jailed import descendants
from wakeful.node.jail.thawguard import thaw_left
from wakeful.node.sandbox.local import ProcessRuntime
from wakeful.node.sandbox.process import LocalProcess
from wakeful.node.sandbox.runtime import Identity
from wakeful.node.secrets import BASE_ENV
from wakeful.node.testing import process_states
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio

SERVER = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = str(os.getpid()).encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *args): pass\n"
    "import subprocess; child = subprocess.Popen(['sleep', '600'])\n"
    "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n"
)
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")


def make_runtime(kind: str, data_dir: Path) -> ProcessRuntime:
    if kind == "unisolated":
        return ProcessRuntime()
    jail = detect_jail(data_dir)
    if kind == "sigstop" and jail.cgroups is not None:
        jail = dataclasses.replace(jail, cgroups=dataclasses.replace(jail.cgroups, freezer=None))
    if kind == "freezer" and (jail.cgroups is None or jail.cgroups.freezer is None):
        pytest.skip("no writable cgroup v1 freezer here")
    uids = uid_table(data_dir) if jail.as_root else None
    return ProcessRuntime(jail=jail, uids=uids)


def ask(port: int) -> socket.socket:
    """A GET sent, its answer not read yet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return sock


def answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


async def serving(port: int) -> None:
    with anyio.fail_after(60):
        while True:
            try:
                await anyio.to_thread.run_sync(lambda: answer(ask(port)))
                return
            except OSError:
                await anyio.sleep(0.05)


KINDS = [
    pytest.param("freezer", marks=[needs_bwrap, needs_root]),
    pytest.param("sigstop", marks=[needs_bwrap]),
    pytest.param("unisolated"),
]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_frozen_sandbox_answers_once_thawed_and_still_stops(
    kind: str, tmp_path: Path
) -> None:
    runtime = make_runtime(kind, tmp_path)
    workdir = tmp_path / "sandboxes" / "sb" / "app"
    workdir.mkdir(parents=True)
    port = free_port()
    env = {**BASE_ENV, "PORT": str(port), "HOST": "127.0.0.1"}
    sandbox_id = f"sb-freeze-{kind}"
    process = await runtime.start(
        ["python3", "-c", SERVER],
        env,
        workdir,
        workdir.parent / "output.log",
        Identity(sandbox_id, "a", Resources()),
    )
    assert isinstance(process, LocalProcess)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(process.pump, None)
        await serving(port)
        tree = [process.pid, *descendants(process.pid)]
        held = await process.freeze()
        assert held > 1 << 20  # a Python server holds megabytes
        jail = runtime.jail
        if kind == "freezer":
            assert jail is not None and jail.cgroups is not None
            freezer = jail.cgroups.sandbox(sandbox_id).freezer
            assert freezer is not None
            assert (freezer / "freezer.state").read_text().strip() == "FROZEN"
            members = {int(p) for p in (freezer / "cgroup.procs").read_text().split()}
            assert jail.cgroups.sandbox(sandbox_id).pids_in() <= members
        else:
            with anyio.fail_after(10):  # a signal lands when the process next runs
                while process_states(tree) != {"T"}:  # noqa: ASYNC110 (all stopped, its child too)
                    await anyio.sleep(0.01)
        sent = await anyio.to_thread.run_sync(ask, port)  # accepted by the kernel meanwhile
        sent.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sent.recv(1)  # nothing answers while frozen
        sent.settimeout(30)
        await process.thaw()
        assert (await anyio.to_thread.run_sync(answer, sent)).startswith(b"HTTP/1.0 200")
        assert "T" not in process_states(tree)

        await process.freeze()  # frozen again, then stopped: the stop thaws it first, so
        with anyio.fail_after(60):  # SIGTERM ends it, long before the grace's SIGKILL would
            code = await process.stop(600)
        assert code in (-signal.SIGTERM, 128 + signal.SIGTERM), code
        tasks.cancel_scope.cancel()
    with anyio.fail_after(20):  # nothing left: the app's child got its SIGTERM too
        while [pid for pid in tree if process_states([pid]) - {"Z"}]:  # noqa: ASYNC110
            await anyio.sleep(0.01)


@needs_root
def test_an_agent_thaws_only_its_own_leftovers_not_another_agents_frozen_sandboxes(
    tmp_path: Path,
) -> None:
    """What an agent left frozen is thawed (by its guard, or at its next start, so it can
    die), named by the sandbox directories it left, and not what another agent on this
    machine froze: on the real freezer."""
    cgroups = Cgroups.detect()
    if cgroups is None or cgroups.freezer is None:
        pytest.skip("no writable cgroup v1 freezer here")
    mine, theirs = (cgroups.sandbox(f"sb-thaw-{who}-{os.getpid()}") for who in ("mine", "theirs"))
    states = []
    try:
        for cgroup in (mine, theirs):
            assert cgroup.freezer is not None
            cgroup.freezer.mkdir()
            (cgroup.freezer / "freezer.state").write_text("FROZEN")
            states.append(cgroup.freezer / "freezer.state")
        for left in (states[0].parent.name, "sb-never-frozen"):
            (tmp_path / left).mkdir()
        thaw_left(tmp_path, cgroups.freezer)
        assert [state.read_text().strip() for state in states] == ["THAWED", "FROZEN"]
    finally:
        for cgroup in (mine, theirs):
            cgroup.remove()
