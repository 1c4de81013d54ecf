"""The HTTP/2 connection (`http2.connection`) on the HTTP/1.1 server's listener, with a handler
of the test's and a client whose frames the test reads one by one (hyperframe and hpack: h2's
own client takes no frame after a GOAWAY, which is what this looks at): a stop lets the
streams under way finish and refuses newer ones; a small answer is one HEADERS and one DATA
frame ending the stream."""

from __future__ import annotations

import asyncio
import socket

import anyio
import h2.config
import h2.connection
import h2.errors
import pytest
from hpack import Decoder
from hyperframe.frame import DataFrame, Frame, GoAwayFrame, HeadersFrame, RstStreamFrame

from wakeful.ingress.http1 import Handler, Handling, HttpServer, Limits, Request, Responder

pytestmark = pytest.mark.anyio


class Frames:
    """The server's frames, as they come."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self.decoder = Decoder()

    async def next(self) -> Frame:
        header = await self._reader.readexactly(9)
        frame, length = Frame.parse_frame_header(memoryview(header))
        frame.parse_body(memoryview(await self._reader.readexactly(length)))
        return frame

    async def until(self, kind: type[Frame], stream: int | None = None) -> Frame:
        while True:
            frame = await self.next()
            if isinstance(frame, kind) and (stream is None or frame.stream_id == stream):
                return frame


async def served(
    handler: Handler,
) -> tuple[HttpServer, asyncio.StreamReader, asyncio.StreamWriter, h2.connection.H2Connection]:
    """A server with HTTP/2 on a loopback port, a connection to it, and an h2 client whose
    preface is ready to go with the first request."""
    server = HttpServer(handler, Limits(), http2=True)
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    await server.start(sock, 16)
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    client = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
    client.initiate_connection()
    return server, reader, writer, client


def request(client: h2.connection.H2Connection, path: bytes) -> int:
    stream = client.get_next_available_stream_id()
    head = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"x"), (b":path", path)]
    client.send_headers(stream, head, end_stream=True)
    return stream


async def test_a_stop_lets_streams_under_way_finish_and_refuses_newer_ones() -> None:
    started, go = anyio.Event(), anyio.Event()

    class Slow:
        async def handle(self, request: Request, out: Responder) -> None:
            if request.target == b"/slow":
                started.set()
                await go.wait()
            out.send_whole(200, [], request.target)

    server, reader, writer, client = await served(Handling(Slow().handle))
    slow = request(client, b"/slow")
    writer.write(client.data_to_send())
    frames = Frames(reader)
    with anyio.fail_after(10):
        await started.wait()
        stopping = asyncio.create_task(server.stop(30))
        goaway = await frames.until(GoAwayFrame)
        assert isinstance(goaway, GoAwayFrame)
        assert (goaway.last_stream_id, goaway.error_code) == (slow, 0)
        newer = request(client, b"/fast")  # sent before the client acted on the GOAWAY
        writer.write(client.data_to_send())
        refused = await frames.until(RstStreamFrame, newer)
        assert isinstance(refused, RstStreamFrame)
        assert refused.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
        go.set()
        head = await frames.until(HeadersFrame, slow)
        assert dict(frames.decoder.decode(head.data, raw=True))[b":status"] == b"200"
        data = await frames.until(DataFrame, slow)
        assert isinstance(data, DataFrame)
        assert data.data == b"/slow" and "END_STREAM" in data.flags  # one frame ends it
        assert await reader.read() == b""  # and the connection closes after it
        await stopping
    writer.close()


async def test_a_client_that_goes_away_still_gets_the_answers_under_way() -> None:
    """A client's GOAWAY says it starts nothing more, not that it wants no answer: h2 takes
    no frame after one, so the ingress keeps it from h2 and answers what was asked."""
    go = anyio.Event()

    class Waits:
        async def handle(self, request: Request, out: Responder) -> None:
            await go.wait()
            out.send_whole(200, [], request.target)

    server, reader, writer, client = await served(Handling(Waits().handle))
    asked = request(client, b"/asked")
    client.close_connection()  # GOAWAY, right behind the request
    writer.write(client.data_to_send())
    frames = Frames(reader)
    with anyio.fail_after(10):
        while not server.h2 or not any(c.closing for c in server.h2):  # noqa: ASYNC110
            await anyio.sleep(0.01)
        go.set()
        data = await frames.until(DataFrame, asked)
        assert isinstance(data, DataFrame)
        assert data.data == b"/asked" and "END_STREAM" in data.flags
        assert await reader.read() == b""  # then it closes: nothing more will be asked
    writer.close()
    await server.stop(1)
