"""A sandbox speaking h2c, written with h2 in the test: for what a well-behaved gRPC server
would not do (refuse a stream, go away, reset mid-answer, send a head too large, stay
silent), and to count the connections the ingress opens."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import h2.exceptions

Answer = Callable[[h2.connection.H2Connection, int, dict[bytes, bytes], bytes], bytes | None]
"""What the sandbox does with a complete request: (connection, stream, head, body); raw
bytes it returns are written before what h2 has to send (a frame h2 would not send)."""


def ok(
    conn: h2.connection.H2Connection, stream: int, head: dict[bytes, bytes], body: bytes
) -> None:
    """200 with the request's path as its body, and gRPC's trailers."""
    conn.send_headers(stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    conn.send_data(stream, head[b":path"])
    conn.send_headers(stream, [(b"grpc-status", b"0")], end_stream=True)


class H2Sandbox:
    """A loopback h2c server: a thread per connection, `answer` per request."""

    def __init__(self, answer: Answer = ok, on_head: bool = False) -> None:
        self.answer = answer
        self.on_head = on_head
        """Answer once the request's head came, not its end (its body then unread)."""
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self.connections = 0
        self.requests: list[dict[bytes, bytes]] = []
        self.resets: list[int] = []
        """Streams the ingress reset (RST_STREAM), by error code."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __enter__(self) -> H2Sandbox:
        thread = threading.Thread(target=self._serve, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            thread = threading.Thread(target=self._connection, args=(sock,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _connection(self, sock: socket.socket) -> None:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        conn.initiate_connection()
        heads: dict[int, dict[bytes, bytes]] = {}
        bodies: dict[int, bytes] = {}
        sock.settimeout(0.1)
        with sock:
            sock.sendall(conn.data_to_send())
            while not self._stop.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    events = conn.receive_data(data)
                except h2.exceptions.ProtocolError:  # after its own GOAWAY, say: done
                    return
                for event in events:
                    if isinstance(event, h2.events.RequestReceived):
                        heads[event.stream_id] = dict(event.headers)  # type: ignore[arg-type]
                        bodies[event.stream_id] = b""
                        if self.on_head:
                            head = heads.pop(event.stream_id)
                            with self._lock:
                                self.requests.append(head)
                            self.answer(conn, event.stream_id, head, b"")
                    elif isinstance(event, h2.events.DataReceived):
                        if event.stream_id in bodies:
                            bodies[event.stream_id] += event.data or b""
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded):
                        if event.stream_id not in heads:  # answered on its head already
                            continue
                        head = heads.pop(event.stream_id)
                        with self._lock:
                            self.requests.append(head)
                        raw = self.answer(conn, event.stream_id, head, bodies.pop(event.stream_id))
                        if raw:
                            sock.sendall(raw)
                    elif isinstance(event, h2.events.StreamReset):
                        self.resets.append(int(event.error_code or 0))
                if out := conn.data_to_send():
                    try:
                        sock.sendall(out)
                    except OSError:
                        return
