"""Shipping sandbox output from a node: bounded buffers, counted drops, retries, batches."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from tests.support.node import agent_settings, put_hello
from wakeful.aio.packing import pack
from wakeful.deploy import logread
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.logbook import LogBook
from wakeful.deploy.logdir import LogDir
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.logbatch import LogBatch, ShipFailed
from wakeful.domain.logfiles import Limits, line_text
from wakeful.domain.models import AppSpec, HealthCheck, Sandbox, SandboxStatus
from wakeful.node.agent import NodeAgent
from wakeful.node.logship import LogShipper, OutputBuffer, utf8_cut
from wakeful.node.testing import FakeSecrets
from wakeful.store import open_store

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[2] / "examples" / "hello"


class FlakySink:
    """Refuses the first `failures` batches, then takes them (and hands them on, if asked)."""

    def __init__(self, failures: int = 0, then: LogBook | None = None) -> None:
        self.failures = failures
        self.then = then
        self.tries = 0
        self.taken: list[LogBatch] = []
        self.arrived = anyio.Event()

    async def ship(self, batch: LogBatch) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise ShipFailed("the control plane is down")
        self.taken.append(batch)
        if self.then is not None:
            await self.then.ship(batch)
        self.arrived.set()
        self.arrived = anyio.Event()


def test_a_full_buffer_drops_its_oldest_bytes_and_counts_them() -> None:
    buffer = OutputBuffer(limit=10)
    assert buffer.append(b"abcdef") == 0
    assert buffer.append(b"ghijkl") == 2
    assert (len(buffer), buffer.start, buffer.dropped) == (10, 2, 2)
    assert buffer.take(100).data == b"cdefghijkl"
    assert buffer.append(b"x" * 25) == 15  # bigger than the buffer: only its end stays
    assert (buffer.take(100).data, buffer.start) == (b"x" * 10, 27)


@pytest.mark.parametrize(
    ("data", "n", "cut"),
    [
        pytest.param(b"abc", 2, 2, id="ascii is cut anywhere"),
        pytest.param("é".encode(), 1, 0, id="not inside a 2-byte character"),
        pytest.param("a€".encode(), 3, 1, id="not inside a 3-byte character"),
        pytest.param("a€".encode(), 4, 4, id="after a whole character"),
        pytest.param("a😀".encode(), 4, 1, id="not inside a 4-byte character"),
        pytest.param(b"\xff\xfe", 1, 1, id="invalid bytes are no character to keep whole"),
    ],
)
def test_slices_end_on_a_character_boundary(data: bytes, n: int, cut: int) -> None:
    assert utf8_cut(data, n) == cut


def test_bytes_dropped_while_in_flight_count_only_if_that_shipment_fails() -> None:
    shipped, lost = OutputBuffer(limit=10), OutputBuffer(limit=10)
    for buffer in (shipped, lost):
        buffer.append(b"0123456789")
        piece = buffer.take(100)
        buffer.append(b"abcde")  # pushes five bytes of the piece in flight out
        if buffer is shipped:
            buffer.shipped(piece)
        else:
            buffer.failed(piece)
    assert (shipped.dropped, shipped.start, shipped.take(100).data) == (0, 10, b"abcde")
    assert (lost.dropped, lost.start, lost.take(100).data) == (5, 5, b"56789abcde")


def book_in(root: Path) -> LogBook:
    """The control plane's log book, on a log directory of its own under `root`."""
    logdir = LogDir(root / "logs", "t1", Limits(86400, 1 << 30, 1 << 28), sync=False)
    logdir.start()
    return LogBook(logdir)


def lines_of(book: LogBook, app: str = "hello") -> list[str]:
    found = logread.forward(book.logdir.root, app, "output", logread.Query())
    return [line_text(json.loads(line), "output") for line in found]


async def test_a_failed_shipment_keeps_the_output_bounded_and_a_retry_delivers_it(
    tmp_path: Path,
) -> None:
    book = book_in(tmp_path)
    sink = FlakySink(failures=1, then=book)
    shipper = LogShipper(sink, "n1", buffer_bytes=16)
    write = shipper.open("sb-1", "hello", 1.0)
    write(b"first\n")
    assert not await shipper.flush()
    assert shipper.pending == 6  # kept for the retry
    write(b"second\nthird\n")  # 19 bytes held at most 16: "fir" goes
    assert (shipper.pending, shipper.dropped) == (16, 3)
    assert await shipper.flush()
    assert shipper.pending == 0
    assert sink.taken[-1].chunks[0].offset == 3
    assert lines_of(book) == [
        "[sb-1] [wakeful: 3 bytes of output missing here]",
        "[sb-1] st",
        "[sb-1] second",
        "[sb-1] third",
    ]
    book.logdir.stop()


async def test_a_batch_is_bounded_and_a_chatty_sandbox_does_not_starve_a_quiet_one() -> None:
    sink = FlakySink()
    shipper = LogShipper(sink, "n1", buffer_bytes=1000, batch_bytes=100)
    shipper.open("sb-chatty", "a", 1.0)(b"x" * 1000)
    shipper.open("sb-quiet", "b", 2.0)(b"hi\n")
    assert await shipper.flush()
    sizes = {chunk.sandbox: chunk.size for chunk in sink.taken[-1].chunks}
    assert sizes == {"sb-quiet": 3, "sb-chatty": 97}
    assert sink.taken[-1].pending == 903


async def test_an_ended_sandbox_is_shipped_to_the_end_then_forgotten() -> None:
    sink = FlakySink()
    shipper = LogShipper(sink, "n1")
    shipper.open("sb-1", "hello", 1.0)(b"bye")
    shipper.close("sb-1")
    assert await shipper.flush()
    (chunk,) = sink.taken[-1].chunks
    assert (chunk.text, chunk.finished) == ("bye", True)
    assert await shipper.flush()
    assert sink.tries == 1  # nothing open, nothing to say


async def test_ended_sandboxes_waiting_to_ship_are_bounded() -> None:
    shipper = LogShipper(FlakySink(failures=10), "n1", max_finished=1)
    for sandbox in ["sb-1", "sb-2"]:
        shipper.open(sandbox, "hello", 1.0)(b"12345")
        shipper.close(sandbox)
    assert (shipper.pending, shipper.dropped) == (5, 5)


async def test_only_output_actually_lost_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """Many sandboxes ending at once (a node stopping) push out ended ones that had nothing
    left to ship: no warning for those; one for output that is really dropped."""
    shipper = LogShipper(FlakySink(failures=10), "n1", max_finished=1)
    for sandbox in ["sb-1", "sb-2", "sb-3"]:
        shipper.open(sandbox, "hello", 1.0)
        shipper.close(sandbox)
    assert not [r for r in caplog.records if "never shipped" in r.getMessage()]
    shipper.open("sb-4", "hello", 1.0)(b"12345")
    shipper.close("sb-4")
    shipper.open("sb-5", "hello", 1.0)
    shipper.close("sb-5")
    lost = [r.getMessage() for r in caplog.records if "never shipped" in r.getMessage()]
    assert lost == ["dropping 5 bytes of output never shipped"]


async def test_a_broken_or_hanging_sink_is_a_failed_flush_not_a_crash() -> None:
    class Broken:
        async def ship(self, batch: LogBatch) -> None:
            raise RuntimeError("a bug in the sink")

    class Hanging:
        async def ship(self, batch: LogBatch) -> None:
            await anyio.sleep_forever()

    for sink in (Broken(), Hanging()):
        shipper = LogShipper(sink, "n1", ship_timeout=0.05)
        shipper.open("sb-1", "hello", 1.0)(b"kept\n")
        assert not await shipper.flush()
        assert shipper.pending == 5


async def test_the_loop_ships_at_once_when_output_piles_up() -> None:
    sink = FlakySink()
    shipper = LogShipper(sink, "n1", interval=3600, eager_bytes=10)  # only a wake-up ships
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(shipper.run)
        with anyio.fail_after(10):
            write = shipper.open("sb-1", "hello", 1.0)  # a new sandbox is announced at once
            await sink.arrived.wait()
            write(b"0123456789\n")
            while not any(c.text for b in sink.taken for c in b.chunks):
                await sink.arrived.wait()
        tasks.cancel_scope.cancel()
    assert "".join(c.text for b in sink.taken for c in b.chunks) == "0123456789\n"


async def test_the_loop_retries_after_failures_and_keeps_running() -> None:
    sink = FlakySink(failures=3)
    shipper = LogShipper(sink, "n1", interval=0.01, max_backoff=0.02)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(shipper.run)
        shipper.open("sb-1", "hello", 1.0)(b"made it\n")
        with anyio.fail_after(10):
            await sink.arrived.wait()
        tasks.cancel_scope.cancel()
    assert sink.tries - len(sink.taken) == 3  # three refusals, then it went through
    assert sink.taken[0].chunks[0].text == "made it\n"


async def test_the_agent_ships_a_sandboxs_output_and_still_writes_its_file(tmp_path: Path) -> None:
    book = book_in(tmp_path)
    sink = FlakySink(then=book)  # the book itself, and an event per batch to wait on
    async with open_store("memory://") as store:
        artifacts = LocalArtifacts(tmp_path / "artifacts")
        digest = await artifacts.put(pack(HELLO))
        spec = AppSpec(
            command=[sys.executable, "app.py"],
            health=HealthCheck(path="/healthz", timeout=10),
            shutdown_timeout=5,
        )
        await put_hello(store, spec, digest)
        settings = agent_settings(tmp_path, log_ship_interval=0.05, shutdown_drain=0)
        agent = NodeAgent(
            store,
            settings,
            artifacts,
            StateKeeper(store, artifacts).for_node(settings.node_name),
            FakeSecrets(),
            logs=sink,
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run)
            await agent.wait_registered()
            await store.create(
                keys.sandbox("sb-1"),
                Sandbox(id="sb-1", pool="hello-v1", app="hello", node="n1", owner="n1", epoch=1),
            )
            with anyio.fail_after(20):
                while not any("hello listening" in line for line in lines_of(book)):
                    await sink.arrived.wait()
            log_file = tmp_path / "sandboxes" / "sb-1" / "output.log"
            assert "hello listening" in log_file.read_text()  # the file, while it runs
            tasks.cancel_scope.cancel()
        item = await store.get(keys.sandbox("sb-1"), Sandbox)
        assert item is not None and item.value.status is SandboxStatus.STOPPED
    assert not log_file.parent.exists()  # the sandbox is gone: so is its directory
    assert lines_of(book)[0].startswith("[sb-1] hello listening on 127.0.0.1:")
    book.logdir.stop()
