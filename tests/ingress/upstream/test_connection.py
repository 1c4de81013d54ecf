"""One pooled upstream connection driven by hand: bytes in through its protocol callbacks, a
transport that records what happens to it."""

from __future__ import annotations

import asyncio

import pytest

from wakeful.aio.flow import HIGH_WATER
from wakeful.ingress.errors import ClosedUnanswered, UpstreamTimeout
from wakeful.ingress.upstream.connection import UpstreamConnection
from wakeful.ingress.upstream.exchange import COMPLETE, FAILED, IDLE
from wakeful.ingress.upstream.pool import Pool

pytestmark = pytest.mark.anyio


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.aborted = self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.aborted or self.closed

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # every write goes out at once

    reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _connected() -> tuple[UpstreamConnection, _Transport, Pool]:
    home = Pool("127.0.0.1", 0)
    conn = UpstreamConnection(home)
    transport = _Transport()
    conn.connection_made(transport)
    return conn, transport, home


async def test_an_answer_read_whole_goes_back_to_the_pool() -> None:
    conn, transport, home = _connected()
    head = conn.exchange(b"GET / HTTP/1.1\r\n\r\n", None, False, "GET", 30)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    await head
    assert (conn.status, conn.next_nowait(), conn.next_nowait()) == (200, b"ok", b"")
    conn.done(keepalive=5)
    assert conn.state.stage is IDLE and list(home.idle) == [conn]
    assert transport.written == b"GET / HTTP/1.1\r\n\r\n"


async def test_an_answer_left_unread_goes_back_to_the_pool_reading() -> None:
    """An answer past the high-water mark pauses reading until the client takes it; one whose
    client left first (a reset stream, a client that never read) went back to the pool with
    reading paused, and the next request on it waited for an answer never read, then got 504
    (a hostile tester's find)."""
    conn, transport, home = _connected()
    head = conn.exchange(b"GET / HTTP/1.1\r\n\r\n", None, False, "GET", 30)
    body = b"x" * (HIGH_WATER + 1)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await head
    assert conn.state.stage is COMPLETE and not transport.reading  # paused on what waits
    conn.done(keepalive=5)  # the client left: nothing of it was taken
    assert conn.state.stage is IDLE and list(home.idle) == [conn]
    assert transport.reading
    second = conn.exchange(b"GET /next HTTP/1.1\r\n\r\n", None, False, "GET", 30)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    await second
    assert (conn.next_nowait(), conn.next_nowait()) == (b"ok", b"")


async def test_a_connection_closed_before_any_answer_is_closed_unanswered() -> None:
    conn, _, _ = _connected()
    head = conn.exchange(b"GET / HTTP/1.1\r\n\r\n", None, False, "GET", 30)
    conn.connection_lost(ConnectionResetError())
    with pytest.raises(ClosedUnanswered):
        await head


async def test_an_answer_framed_by_close_ends_with_the_connection() -> None:
    conn, _, _ = _connected()
    head = conn.exchange(b"GET / HTTP/1.1\r\n\r\n", None, False, "GET", 30)
    conn.data_received(b"HTTP/1.1 200 OK\r\n\r\npart")
    await head
    conn.eof_received()
    assert conn.state.stage is COMPLETE
    assert (conn.next_nowait(), conn.next_nowait()) == (b"part", b"")


async def test_an_answer_framed_by_close_cut_by_silence_is_never_taken_for_whole() -> None:
    """The silence fails the exchange; the connection's end that follows must not turn it
    into an answer framed by close (the client would get a cut body as a whole one)."""
    conn, transport, _ = _connected()
    head = conn.exchange(b"GET / HTTP/1.1\r\n\r\n", None, False, "GET", 30)
    conn.data_received(b"HTTP/1.1 200 OK\r\n\r\npart")
    await head
    conn._timed_out()  # the sandbox stayed silent past the timeout
    assert transport.aborted
    conn.connection_lost(None)
    assert conn.state.stage is FAILED
    assert conn.next_nowait() == b"part"
    with pytest.raises(UpstreamTimeout):
        conn.next_nowait()


async def test_a_kept_connection_reads_each_answer_whole_whatever_came_before() -> None:
    """A kept connection keeps its parser for the next exchange (it read its answer to the
    end: llhttp starts the next from its beginning): each framing, an interim answer
    included, leaves nothing of itself in the next answer."""
    conn, _, home = _connected()
    exchanges = [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok"),
        (b"HTTP/1.1 201 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 201, b"hi"),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 OK\r\nContent-Length: 3\r\n\r\nabc",
            202,
            b"abc",
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b""),
        (b"HTTP/1.1 203 OK\r\nContent-Length: 0\r\n\r\n", 203, b""),
    ]
    for answer, status, body in exchanges:
        head = conn.exchange(b"GET / HTTP/1.1\r\n\r\n", None, False, "GET", 30)
        conn.data_received(answer)
        await head
        read = b""
        while chunk := conn.next_nowait():
            read += chunk
        assert (conn.status, read, conn.state.stage) == (status, body, COMPLETE)
        conn.done(keepalive=5)
        assert conn.state.stage is IDLE and home.idle[-1] is conn
