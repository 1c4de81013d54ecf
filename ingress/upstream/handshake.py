"""A WebSocket handshake's upstream connection, then the sandbox's end of its splice.

Never pooled: one connection per handshake, closed with the response. A 101 turns it into
the splice's sandbox side (`ingress.websocket.Side`): what the sandbox sends then goes through a
bounded `Pipe`. Any other answer (a refusal: 400, 426, a redirect) is read whole, its body
bounded by `MAX_REFUSAL_BYTES`, and passed on as it is; whatever the sandbox writes after it is
never taken for an answer. The head's rules are the pooled connections' (`upstream.rules`);
the exchange's stage is an `ExchangeState` like theirs.
"""

from __future__ import annotations

import asyncio

import httptools

from wakeful.aio.flow import WriteGate
from wakeful.aio.pipe import Pipe
from wakeful.ingress.errors import UpstreamFailed
from wakeful.ingress.upstream.bases import Gated, tuned
from wakeful.ingress.upstream.closing import shut
from wakeful.ingress.upstream.exchange import (
    BODY,
    COMPLETE,
    HEAD,
    INTERIM,
    SENT,
    SWITCHED,
    ExchangeState,
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
from wakeful.ingress.websocket import MAX_REFUSAL_BYTES


class Handshake(Gated):
    """A WebSocket handshake's upstream connection, then (after a 101) the sandbox's end of
    its splice (`ingress.websocket.Side`). Any other answer is read whole (bounded) and passed
    on as it is."""

    trailers: tuple[tuple[bytes, bytes], ...] = ()

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[None] = self._loop.create_future()
        self.state = ExchangeState()
        self.state.move(SENT)
        """Made for its one request: its exchange begins with it."""
        self._framing = 0
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()
        self._writable = WriteGate(self._loop)
        self.pipe = Pipe(self._pause, self._resume)
        self.closed = False

    def _pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = tuned(transport)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state.stage is SWITCHED:
            self.pipe.feed(data)
            return
        if self._head.done():  # bytes after a refusal's answer: not ours to pass on
            return
        if state.stage is SENT:
            state.move(HEAD)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self.status != 101 or self._head.done():
                self._fail(UpstreamFailed("the sandbox switched protocols without a 101"))
                return
            state.move(SWITCHED)
            self._head.set_result(None)
            self.pipe.feed(data[exc.args[0] :])
            return
        except httptools.HttpParserError as exc:
            cause = callback_error(exc)
            reason = cause if isinstance(cause, UpstreamFailed) else None
            if reason is None and self.status == 101:  # llhttp pauses on it all the same
                reason = UpstreamFailed("the sandbox answered 101 with no Upgrade header")
            self._fail(reason or UpstreamFailed(f"the sandbox's answer is not valid HTTP: {exc}"))
            return
        if not self.status:
            self._framing = framing_run(self._framing, len(data), body_came=False)
            if self._framing > MAX_FRAMING_BYTES:
                self._fail(UpstreamFailed("the sandbox's answer head is too large"))

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._ended()
        self._writable.fail(UpstreamFailed("the sandbox closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.state.stage is COMPLETE:  # a second answer in the same read: never ours
            raise UpstreamFailed("the sandbox sent more than one answer to the handshake")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        interim = judge_status(status, True) is INFORMATIONAL  # not the answer
        refused = framing_refused(self.headers, interim)
        if refused is not None:
            raise UpstreamFailed(refused)
        if interim:
            self.state.move(INTERIM)
            self.headers = []
            return
        self.status = status
        self.state.move(BODY)

    def on_body(self, body: bytes) -> None:
        self._body += body
        if len(self._body) > MAX_REFUSAL_BYTES:
            raise UpstreamFailed(
                f"the sandbox refused the WebSocket with a body over {MAX_REFUSAL_BYTES} bytes"
            )

    def on_message_complete(self) -> None:
        state = self.state
        if state.stage is INTERIM:
            state.move(HEAD)
            return
        state.move(COMPLETE)  # a 101's upgrade, or a refusal's end: nothing may follow
        if self.status != 101 and not self._head.done():
            self._head.set_result(None)

    # -- the handshake and the splice ----------------------------------------------------

    def _ended(self) -> None:
        self.pipe.end()
        if self._head.done():
            return
        state = self.state
        if state.stage is BODY and self.status != 101 and framed_by_close(self.headers):
            state.move(COMPLETE)
            self._head.set_result(None)  # a refusal framed by the end of the connection
        else:
            self._fail(UpstreamFailed("the sandbox closed the connection during the handshake"))

    def _fail(self, exc: BaseException) -> None:
        self.state.fail(exc)
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: a caller that left must not log it
        if self.transport is not None:
            self.transport.abort()

    async def send(self, head: bytes) -> None:
        """Write the handshake; return once the answer is in (a 101's head, or a whole
        refusal)."""
        assert self.transport is not None
        self.transport.write(head)
        await self._head

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def drain(self) -> None:
        if (closed := self._writable.waiting()) is not None:
            await closed
        if self.closed:
            raise UpstreamFailed("the sandbox closed the connection")

    # -- as `raw._Switched` reads it ---------------------------------------------------

    @property
    def splice(self) -> Handshake | None:
        return self if self.state.stage is SWITCHED else None

    def next_nowait(self) -> bytes:
        """The refusal's body, whole (read before the head was handed up), then b""."""
        body, self._body = bytes(self._body), bytearray()
        return body

    async def next(self) -> bytes:
        return self.next_nowait()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            shut(self.transport)
        self.closed = True
