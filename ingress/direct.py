"""The direct path: the commonest exchange answered in callbacks, without a task (issue 42).

The commonest exchange is a request with no body, alone on its HTTP/1.x connection (nothing
queued before it), for an app with a cached lease that has room, whose sandbox has an idle
pooled HTTP/1.1 connection and a slot free. `ProxyEdge.direct` (the edge's checks, the
route, the client's share) and `Proxy.take_direct` (the lease's use, the connection, the
slot) take what it needs without waiting; any other request, or one for which any of them
would wait, goes the general path (`ProxyEdge.handle`, on the connection's task) with
nothing taken.

It applies the general path's rules through the same functions (`upstream_request_headers`,
`request_head`, `Proxy.answer_headers`, `Http1Responder`, `answer_for`, `retry.next_attempt`)
and counts what it counts, through the same calls. What differs is how it waits: the sandbox's
connection tells `Direct.moved` each time the exchange moves on (`upstream.bases.Listener`),
and the answer goes to the client from there. The request's task, the futures it waits on,
the `ProxyRequest`, the `ProxyResponse` and the response wrapper are not made.

Where callbacks would have to wait, it hands over:

- the client's buffer fills mid-answer: the rest is relayed by a task (`_relay`), waiting
  for the client as the general path does (at most `client_timeout`);
- the pooled connection closed before any byte of the answer (the keep-alive race) and
  `next_attempt` allows the one resend: everything taken goes back, and the request goes
  the general path marked `resent`, which sends it once more on a fresh connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Final

from wakeful.ingress.cacherules import Use
from wakeful.ingress.errors import ClosedUnanswered, UpstreamError, UpstreamFailed
from wakeful.ingress.formats import CLIENT_GONE
from wakeful.ingress.http1.request import Request
from wakeful.ingress.http1.responder import Http1Responder
from wakeful.ingress.load import Tracker
from wakeful.ingress.retry import Body, Next, next_attempt
from wakeful.ingress.upstream.bases import Listener
from wakeful.ingress.upstream.raw import Idle

if TYPE_CHECKING:
    from wakeful.ingress.edge import ProxyEdge
    from wakeful.ingress.http1.connection import ClientConnection
    from wakeful.ingress.proxy import Proxy

log = logging.getLogger(__name__)

_clock: Final = time.perf_counter


class Direct(Listener):
    """One request answered in callbacks (see the module). Made by `ProxyEdge.direct` with
    everything taken; ends once (`_end`), handing back what it took and telling the client
    connection (`ClientConnection.directed`)."""

    __slots__ = (
        "_app",
        "_conn",
        "_edge",
        "_ended",
        "_idle",
        "_out",
        "_proxy",
        "_reported",
        "_request",
        "_request_id",
        "_sent",
        "_sent_at",
        "_share",
        "_started",
        "_status",
        "_task",
        "_tracker",
        "_use",
        "_waiter",
    )

    def __init__(
        self,
        edge: ProxyEdge,
        proxy: Proxy,
        conn: ClientConnection,
        request: Request,
        app: str,
        reported: str | None,
        use: Use,
        idle: Idle,
        tracker: Tracker,
        share: str | None,
        request_id: str,
        started: float,
    ) -> None:
        self._edge = edge
        self._proxy = proxy
        self._conn = conn
        self._request = request
        self._out = Http1Responder(conn, request)
        self._app = app
        self._reported = reported
        self._use = use
        self._idle = idle
        self._tracker = tracker
        self._share = share
        self._request_id = request_id
        self._started = started
        self._sent_at = 0.0
        self._status = 0
        self._sent = 0
        """Body bytes relayed to the client (for the access log)."""
        self._ended = False
        self._task: asyncio.Task[None] | None = None
        """Relaying the rest once the client's buffer filled (`_relay`)."""
        self._waiter: asyncio.Future[None] | None = None
        """Done at the end, for a server stopping (`finished`); made only when asked for."""

    def send(self) -> bool:
        """Send the request; False (everything taken given back, nothing counted) when that
        failed before it went (a bug: the general path answers it then)."""
        request = self._request
        self._sent_at = _clock()
        try:
            self._send(request)
        except Exception:
            log.exception("sending a request on the direct path failed")
            self._idle.conn.close(abort=True)
            self._give_back(counted=False)
            return False
        return True

    def _send(self, request: Request) -> None:
        self._proxy.send_direct(
            self._app,
            self._idle,
            request.method,
            request.target,
            request.headers,
            request.client,
            request.scheme,
            self._request_id,
            self,
        )

    # -- told by the sandbox's connection ----------------------------------------------

    def moved(self) -> None:
        try:
            self._moved()
        except Exception:  # a bug: as on the general path (`ClientConnection._run`), the
            log.exception("answering a request failed")  # client's connection is dropped
            self._idle.conn.close(abort=True)
            self._end(500)

    def _moved(self) -> None:
        up = self._idle.conn
        out = self._out
        if not out.started:
            if not up.status:  # no answer's head yet
                error = up.state.error
                if error is not None:
                    self._failed(error)
                return
            self._status = up.status
            upstream = _clock() - self._sent_at
            self._proxy.count_phases(self._app, upstream, self._reported)
            lease = self._use.lease
            request_id = self._request_id
            headers = self._proxy.answer_headers(lease, up.headers, request_id, 0.0, 0.0, upstream)
            out.start(self._status, headers)
        while True:
            try:
                chunk = up.next_nowait()
                if chunk is None:  # the rest comes later: the head goes out meanwhile
                    out.flush()
                    return
                if not chunk:
                    out.end()
                    break
                full = out.write(chunk)
            except UpstreamError as broke:
                self._broke(broke)
                return
            self._sent += len(chunk)  # after: a write refused (past the length) sent none
            if full:  # the client's buffer: the rest waits for it, in a task
                up.detach()
                self._task = asyncio.get_running_loop().create_task(self._relay())
                self._task.add_done_callback(self._relayed)
                return
        self._end(self._status)

    async def _relay(self) -> None:
        """The rest of the answer, as `ProxyEdge.handle` relays it, once the client's buffer
        filled: waiting for room (at most `client_timeout`) and for the sandbox."""
        up = self._idle.conn
        out = self._out
        try:
            await out.drain()
            while True:
                chunk = up.next_nowait()
                if chunk is None:
                    out.flush()
                    chunk = await up.next_chunk()
                if not chunk:
                    break
                full = out.write(chunk)
                self._sent += len(chunk)
                if full:
                    await out.drain()
            out.end()
        except UpstreamError as broke:
            self._broke(broke)
            return
        except TimeoutError:
            log.warning(
                "the client read none of its answer in time; cutting it off",
                extra={"app": self._app, "request_id": self._request_id},
            )
            self._end(CLIENT_GONE)
            return
        except asyncio.CancelledError:
            self._end(CLIENT_GONE)
            raise
        self._end(self._status)

    def _relayed(self, task: asyncio.Task[None]) -> None:
        """The relaying task is done. The end it did not reach, it reaches here: cancelled
        before it ever ran (the client left in the same turn of the loop), or an error nobody
        expected (a bug: the client's connection is dropped, as on the general path)."""
        if task.cancelled():
            self._end(CLIENT_GONE)
            return
        error = task.exception()
        if error is not None:
            log.error("answering a request failed", exc_info=error)
            self._idle.conn.close(abort=True)
            self._end(500)

    # -- how it ends ---------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        """The exchange failed before the answer's head: sent once more (the keep-alive race,
        by the general path), or the failure is the answer."""
        if not isinstance(exc, UpstreamError):  # the connection's own errors are all these
            exc = UpstreamFailed(str(exc))
        request = self._request
        if isinstance(exc, ClosedUnanswered):
            step = next_attempt(
                exc, method=request.method, body=Body.NONE, elsewhere=0, again=0, bound=0
            )
            if step is Next.AGAIN or step is Next.AGAIN_LATER:
                waiter, self._waiter = self._waiter, None  # done when the resend is
                self._give_back(counted=False)
                request.resent = True
                request.request_id = self._request_id
                self._conn.directed(request, None)
                if waiter is not None:  # a server stopping waits: for the resend now
                    resend = self._conn.answering()
                    if resend is None:
                        waiter.set_result(None)
                    else:
                        resend.add_done_callback(lambda _: _settle(waiter))
                return
        self._proxy.count_error(self._app, exc)
        self._answer(exc)

    def _broke(self, exc: UpstreamError) -> None:
        """The exchange broke after the answer's head: a 502 while none of it went to the
        client (its head is held), else the client is cut off (its answer incomplete)."""
        self._proxy.count_error(self._app, exc)
        if self._out.unstart():
            self._answer(exc)
            return
        log.warning(
            "upstream broke mid-answer; cutting the client off: %s",
            exc,
            extra={"app": self._app, "request_id": self._request_id},
        )
        self._end(502)

    def _answer(self, exc: UpstreamError) -> None:
        status = self._edge.answer_error(exc, self._request.headers, self._request_id, self._out)
        self._end(status)

    def _give_back(self, counted: bool = True) -> None:
        """Hand back what was taken: the connection and its slot, the lease's use, the
        client's share. `counted`: the request was answered here (a cache hit on the direct
        path); not when it goes on to the general path, which counts it."""
        self._ended = True
        self._tracker.finish()
        self._proxy.finished_direct(self._app, self._idle, self._use, counted)
        self._edge.left(self._share)
        if self._waiter is not None:
            _settle(self._waiter)

    def _end(self, final: int) -> None:
        if self._ended:
            return
        request = self._request
        try:
            self._give_back()
            self._edge.ended_direct(
                self._app,
                self._reported,
                self._use.lease,
                request.method,
                request.target,
                final,
                self._sent,
                _clock() - self._started,
                self._request_id,
            )
        finally:  # whatever the bookkeeping did, the client's connection goes on
            self._conn.directed(request, self._out)

    # -- told by the client's connection -------------------------------------------------

    def cancel(self) -> asyncio.Task[None] | None:
        """The client left, or the server stops: the exchange ends now (its connection to
        the sandbox closed unless its answer was whole), or, when a task relays the rest of
        the answer, that task is cancelled (it ends the exchange as it stops) and returned."""
        if self._task is not None:
            self._task.cancel()
            return self._task
        self._end(CLIENT_GONE)
        return None

    def finished(self) -> asyncio.Future[None]:
        """Done once the exchange ended (a server stopping waits on it)."""
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
            if self._ended:
                self._waiter.set_result(None)
        return self._waiter


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
