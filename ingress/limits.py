"""The request head's size is bounded while it is being read, not after.

httptools has no limit of its own: a client could send an endless header and uvicorn would
buffer it. `bounded_httptools(limit)` makes a protocol class that counts the bytes fed to the
parser until the head is complete, and past the bound answers 431 and closes the connection.
Memory stays within the bound plus one read. (A head that fits the bound but not the rest of
the limit is still answered 431 after parsing, in `edge.py`.)
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 40\r\n"
    b"connection: close\r\n\r\n"
    b"request line and headers are too large\r\n"
)


class _BoundedHttpTools(HttpToolsProtocol):
    limit = 32 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_done = False
        self._head_bytes = 0
        self._began_in_this_read = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_done = False
        self._head_bytes = 0
        self._began_in_this_read = True

    def on_headers_complete(self) -> None:
        self._head_done = True
        super().on_headers_complete()

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


def bounded_httptools(limit: int) -> type[HttpToolsProtocol]:
    return type("BoundedHttpTools", (_BoundedHttpTools,), {"limit": limit})
