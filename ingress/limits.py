"""What a client connection may hold, bounded while it is read, not after.

`bounded_httptools(...)` makes uvicorn's httptools protocol class with three bounds uvicorn
lacks:

- **Head size.** httptools has no limit of its own: a client could send an endless header and
  uvicorn would buffer it. The bytes fed to the parser are counted until the head is
  complete; past `limit` the answer is 431 and the connection closes. Memory stays within the
  bound plus one read. (A head that fits the bound but not the rest of the limit is still
  answered 431 after parsing, in `edge.py`.)
- **Head time.** A connection must complete a request head within `head_timeout` seconds of
  opening, and of its previous answer ending; otherwise it is closed (408 when part of a head
  came). uvicorn's keep-alive timer is cancelled by any byte, so a client sending one byte now
  and then (slowloris) would otherwise hold its connection forever.
- **Connections.** Past `max_connections` open client connections a new one is answered 503
  with `Retry-After` and closed at once; the connections already open keep working.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 40\r\n"
    b"connection: close\r\n\r\n"
    b"request line and headers are too large\r\n"
)
_TOO_SLOW = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 37\r\n"
    b"connection: close\r\n\r\n"
    b"the request head did not come in time\n"
)
_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\n"
    b"content-length: 40\r\n"
    b"connection: close\r\n\r\n"
    b"too many connections to this ingress :(\n"
)


class _BoundedHttpTools(HttpToolsProtocol):
    limit = 32 * 1024
    head_timeout = 10.0
    max_connections = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_done = False
        self._head_begun = False
        self._head_bytes = 0
        self._began_in_this_read = False
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_done = False
        self._head_begun = True
        self._head_bytes = 0
        self._began_in_this_read = True

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._head_begun = False
        self._disarm_head_deadline()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its head came; this one is not late yet
        if self.pipeline:
            return  # heads already in, waiting their turn
        if self._head_begun:
            self.transport.write(_TOO_SLOW)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._began_in_this_read = False
        super().data_received(data)
        if self._head_done or self.transport.is_closing():
            return
        if self._began_in_this_read:
            # The read that starts a head may also end the previous request's body (pipelining):
            # count from the next read. One read is bounded by the transport's buffer size.
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.limit:
            self.transport.write(_TOO_LARGE)
            self.transport.close()


def bounded_httptools(
    limit: int, head_timeout: float = 10.0, max_connections: int = 10_000
) -> type[HttpToolsProtocol]:
    bounds = {"limit": limit, "head_timeout": head_timeout, "max_connections": max_connections}
    return type("BoundedHttpTools", (_BoundedHttpTools,), bounds)
