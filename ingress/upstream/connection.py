"""One pooled connection to a sandbox, carrying one exchange at a time.

An `asyncio.Protocol` with httptools (the C parser uvicorn uses) for the answer's head and
framing. The request head goes out as one `bytes`, its body chunks pass through (a writer task
per body), and the answer's body is handed up as it arrives. The exchange's stage lives in one
`ExchangeState` (`upstream.exchange`); what the answer's head means is `upstream.rules`'.

- **Backpressure both ways.** Reading from the sandbox pauses while more than `HIGH_WATER`
  bytes of its answer wait for the client; writing the request body waits while the
  sandbox's socket buffer is full.
- **Silence.** `silence` seconds before the answer's head, and between body reads; an idle
  pooled connection closes after the transport's `keepalive`.
- **How it fails.** A connection that ends before a single byte of the answer came raises
  `ClosedUnanswered` (the proxy may send the request once more: `ingress.retry`); one a
  tunnel's node could not open, `ConnectFailed`; anything else after the request was written,
  `UpstreamFailed` or `UpstreamTimeout`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterable

import httptools

from wakeful.aio.deadline import Deadline
from wakeful.aio.flow import HIGH_WATER, LOW_WATER, WriteGate
from wakeful.ingress.errors import ClosedUnanswered, ConnectFailed, UpstreamFailed, UpstreamTimeout
from wakeful.ingress.streams import nonempty
from wakeful.ingress.upstream.bases import Gated, Home, Listener, tuned
from wakeful.ingress.upstream.closing import reset, shut
from wakeful.ingress.upstream.exchange import (
    BODY,
    COMPLETE,
    FAILED,
    HEAD,
    IDLE,
    INTERIM,
    SENT,
    ExchangeState,
    IllegalMove,
)
from wakeful.ingress.upstream.rules import (
    INFORMATIONAL,
    MAX_FRAMING_BYTES,
    callback_error,
    framed_by_close,
    framing_refused,
    framing_run,
    judge_status,
)


class _Extra(Exception):
    """A second answer began on the connection before a request asked for it."""


class UpstreamConnection(Gated):
    """One upstream connection; carries one exchange at a time."""

    def __init__(self, home: Home) -> None:
        self._home = home
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._deadline = Deadline(self._loop, self._timed_out)
        """While pooled: when the idle connection closes. During an exchange: when the
        sandbox's silence ends it (pushed on by every read)."""
        self._silence = 0.0
        self.state = ExchangeState()
        # the exchange in progress
        self._parser: httptools.HttpResponseParser | None = None
        self._spare: httptools.HttpResponseParser | None = None
        """The last exchange's parser, kept for the next when it read its answer to the end
        (`on_message_complete`: llhttp then reads the next from its start): a new one costs
        a lookup of each of its callbacks."""
        self._read_whole = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        """Reading is paused: `HIGH_WATER` bytes of the answer wait for the client."""
        self._framing = 0
        self._body_bytes = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._writable = WriteGate(self._loop)
        self._writer: asyncio.Task[None] | None = None
        self._exchanges = 0
        """Exchanges begun on this connection: one, while its first is under way."""
        self._listener: Listener | None = None
        """Told of the exchange's moves, in place of `_head` and `_wakeup` (`begin`)."""

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = tuned(transport)

    def data_received(self, data: bytes) -> None:
        self._received(data)
        if self._listener is not None:  # whatever the read did: moved, ended, failed
            self._listener.moved()

    def _received(self, data: bytes) -> None:
        parser = self._parser
        state = self.state
        stage = state.stage
        if parser is None or stage is IDLE or stage is COMPLETE:  # bytes nobody asked for
            self._abort(UpstreamFailed("the sandbox sent bytes outside an answer"))
            return
        if stage is SENT:
            state.stage = HEAD
        elif stage is BODY:  # silence: from the last read, now
            self._deadline.after(self._silence)
        body_before = self._body_bytes
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._abort(UpstreamFailed("the sandbox switched protocols unasked"))
            return
        except httptools.HttpParserError as exc:
            cause = callback_error(exc)
            if isinstance(cause, _Extra) or state.extra:
                self._abort(UpstreamFailed("the sandbox sent more than one answer"))
            elif isinstance(cause, UpstreamFailed):
                self._abort(cause)
            else:
                self._abort(UpstreamFailed(f"the sandbox's answer is not valid HTTP: {exc}"))
            return
        if state.stage is not COMPLETE:
            # Framing read in a row (no body byte came with it): bounded, see MAX_FRAMING_BYTES.
            self._framing = framing_run(self._framing, len(data), self._body_bytes != body_before)
            if self._framing > MAX_FRAMING_BYTES:
                self._abort(UpstreamFailed("the sandbox's answer head or trailers are too large"))

    def eof_received(self) -> bool:
        self._ended(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._deadline.cancel()
        self._home.forget(self)
        self._ended(exc)
        self._writable.fail(UpstreamFailed("the sandbox closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.state.stage is COMPLETE:  # a second answer in the same read: not ours
            self.state.extra = True
            raise _Extra

    def on_header(self, name: bytes, value: bytes) -> None:
        if value and (value[-1] == 0x20 or value[-1] == 0x09):  # llhttp keeps trailing OWS;
            value = value.rstrip(b" \t")  # not the value's (RFC 9112 §5.1), nor HTTP/2's
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        state = self.state
        if state.stage is not HEAD:  # bytes came (`data_received`): a head is all it can be
            raise IllegalMove(state.stage, BODY)
        status = self._parser.get_status_code()
        interim = judge_status(status, False) is INFORMATIONAL  # 100 Continue, 103...
        refused = framing_refused(self.headers, interim)
        if refused is not None:
            raise UpstreamFailed(refused)
        if interim:
            state.stage = INTERIM
            self.headers = []
            return
        self.status = status
        state.stage = BODY
        self._deadline.after(self._silence)  # the head ended a silence: the body's starts
        if self._head is not None and not self._head.done():
            self._head.set_result(None)
        if state.head_only:  # no body follows a HEAD answer, whatever it says
            state.keep_alive = self._parser.should_keep_alive()
            self._finish()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
            self._deadline.clear()  # not the sandbox's silence while we do not read
        if self._wakeup is not None:
            self._wake()

    def on_message_complete(self) -> None:
        state = self.state
        if state.stage is INTERIM:
            state.stage = HEAD
            return
        assert self._parser is not None
        # Asked now: llhttp resets what it knows once the callback returns.
        state.keep_alive = self._parser.should_keep_alive()
        self._read_whole = True
        self._finish()

    # -- the exchange ------------------------------------------------------------------

    def _finish(self) -> None:
        state = self.state
        if state.stage is BODY:
            state.stage = COMPLETE
            self._deadline.clear()
            if self._wakeup is not None:
                self._wake()

    def _ended(self, exc: BaseException | None) -> None:
        """The sandbox closed its side, or the connection broke."""
        state = self.state
        stage = state.stage
        if stage is IDLE or stage is COMPLETE or stage is FAILED:
            return
        if stage is SENT:
            if isinstance(exc, ConnectFailed):  # a tunnel's node could not reach the sandbox
                self._fail(exc)
            else:
                closed = ClosedUnanswered(
                    "the connection closed before any answer", self._exchanges == 1
                )
                self._fail(closed)
        elif stage is BODY and framed_by_close(self.headers):
            self._finish()  # an answer framed by the end of the connection
            if self._listener is not None:
                self._listener.moved()
        else:
            reason = f": {exc}" if exc else ""
            self._fail(UpstreamFailed(f"the sandbox closed the connection mid-answer{reason}"))

    def _fail(self, exc: BaseException) -> None:
        if not self.state.fail(exc):
            return  # whole, or failed already: only the connection is lost (see `done`)
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: a caller that left must not log it
        self._wake()
        if self._listener is not None:
            self._listener.moved()

    def _abort(self, exc: BaseException) -> None:
        self._fail(exc)
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def exchange(
        self,
        head: bytes,
        body: AsyncIterable[bytes] | None,
        chunked: bool,
        method: str,
        silence: float,
    ) -> asyncio.Future[None]:
        """Write the request; the future is done once the answer's head is in, or raises
        ClosedUnanswered, ConnectFailed, UpstreamFailed, or UpstreamTimeout when the head took
        longer than `silence` seconds (then each body read may take as long)."""
        self._start(head, body, chunked, method, silence)
        self._head = head_in = self._loop.create_future()
        assert self.transport is not None
        self.transport.write(head)
        if body is not None:
            self._writer = self._loop.create_task(self._send_body(body, chunked))
        return head_in

    def begin(self, head: bytes, method: str, silence: float, listener: Listener) -> None:
        """`exchange` for a request with no body, told to `listener` (until `done`, `close`
        or `detach`) rather than through a future: the answer's head is in once `status` is
        set, its body is read with `next_nowait`, and how it failed is `state.error`."""
        self._start(head, None, False, method, silence)
        self._listener = listener
        assert self.transport is not None
        self.transport.write(head)

    def detach(self) -> None:
        """Tell the listener nothing more: the rest of the answer is read with `next_chunk`."""
        self._listener = None

    def _start(
        self,
        head: bytes,
        body: AsyncIterable[bytes] | None,
        chunked: bool,
        method: str,
        silence: float,
    ) -> None:
        assert self.transport is not None
        state = self.state
        if state.stage is not IDLE:
            raise IllegalMove(state.stage, SENT)
        state.stage = SENT
        self._exchanges += 1
        state.error = None
        state.head_only = method == "HEAD"
        state.chunked_body = chunked
        state.body_sent = body is None
        state.keep_alive = state.extra = False
        self._silence = silence
        self._deadline.after(silence)
        self._parser = self._spare or httptools.HttpResponseParser(self)
        self._spare = None
        self._read_whole = False
        self._paused = False
        self._framing = self._body_bytes = 0
        self.status, self.headers = 0, []
        self._chunks.clear()
        self._buffered = 0
        self._head = None

    async def _send_body(self, body: AsyncIterable[bytes], chunked: bool) -> None:
        transport = self.transport
        assert transport is not None
        state = self.state
        try:
            async with contextlib.aclosing(nonempty(body)) as chunks:
                async for chunk in chunks:
                    if self.closed or state.stage is FAILED:
                        return
                    if chunked:
                        transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                    else:
                        transport.write(chunk)
                    if (closed := self._writable.waiting()) is not None:
                        await closed
            if chunked and not self.closed:
                transport.write(b"0\r\n\r\n")
            state.body_sent = True
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the client left mid-body, or the sandbox did
            if isinstance(exc, UpstreamFailed) and state.answered:
                return  # the sandbox answered early and stopped reading: its answer stands
            self._abort(exc)

    def next_nowait(self) -> bytes | None:
        """The next piece of the answer's body already read; b"" at its end; None when it
        has not come yet."""
        if self._chunks:
            chunk = self._chunks.popleft()
            self._buffered -= len(chunk)
            if self._paused and self._buffered <= LOW_WATER and self.transport:
                self._paused = False
                self.transport.resume_reading()
                if self.state.stage is not COMPLETE:
                    self._deadline.after(self._silence)
            return chunk
        state = self.state
        if state.stage is COMPLETE:
            return b""
        if state.error is not None:
            raise state.error
        return None

    async def next_chunk(self) -> bytes:
        """The next piece of the answer's body; b"" at its end. Raises UpstreamTimeout when
        the sandbox stays silent (see `exchange`)."""
        while True:
            chunk = self.next_nowait()
            if chunk is not None:
                return chunk
            self._wakeup = self._loop.create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None

    def _timed_out(self) -> None:
        if self.state.stage is IDLE:
            self.close()
        else:
            self._abort(UpstreamTimeout(f"the sandbox stayed silent for {self._silence:g} s"))

    def done(self, keepalive: float) -> None:
        """The exchange is over: back to the pool when it ended cleanly, else closed."""
        self._listener = None
        writer, self._writer = self._writer, None
        unsent = writer is not None and not writer.done()
        if writer is not None and unsent:
            writer.cancel()
        state = self.state
        # `reusable` implies COMPLETE; named here as the guard of the move to IDLE.
        if state.stage is COMPLETE and state.reusable and not self.closed:
            if self._read_whole:
                self._spare = self._parser
            self._parser = None
            self._chunks.clear()  # unread: the client left before it was relayed
            self._buffered = 0
            if self._paused and self.transport is not None:  # paused on that unread answer:
                self._paused = False  # read again, or the next exchange would wait in vain
                self.transport.resume_reading()
            state.stage = IDLE
            self._deadline.after(keepalive)
            self._home.give_back(self)
        else:  # a body the sandbox did not take (it answered first): it never will now
            self.close(abort=unsent)

    def release_stream(self) -> None:
        """A tunnel stream's clean end (`TunnelPool`): the stream goes back to the node,
        which keeps its socket to the sandbox for the next one; this connection is done."""
        transport = self.transport
        self.closed = True
        self._deadline.cancel()
        release = getattr(transport, "release", None)
        if release is not None:
            release(True)
        elif transport is not None:
            transport.close()

    def close(self, abort: bool = False) -> None:
        """Close the connection (`shut`); `abort`: now, whatever is left unsent."""
        self._listener = None
        if self.transport is not None and not self.closed:
            if abort:
                reset(self.transport)
            else:
                shut(self.transport)
        self.closed = True
        self._deadline.cancel()
        self._home.forget(self)
