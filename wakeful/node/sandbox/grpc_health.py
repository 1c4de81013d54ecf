"""The standard gRPC health check (`grpc.health.v1.Health/Check`) as a readiness probe, for
apps with `[health] grpc = true`: one call over cleartext HTTP/2 (h2c, prior knowledge), as
Kubernetes' gRPC probes make it. Ready when the call ends with `grpc-status: 0` and the answer
says SERVING.

`h2` frames it; the messages are small enough to spell by hand: the request is an empty
`HealthCheckRequest` (the server as a whole), the answer a `HealthCheckResponse` whose field 1
is its status (1 = SERVING).
"""

from __future__ import annotations

import anyio
import h2.config
import h2.connection
import h2.events
import h2.exceptions

PATH = b"/grpc.health.v1.Health/Check"
EMPTY_CALL = b"\x00\x00\x00\x00\x00"
"""One message, not compressed, 0 bytes long: a `HealthCheckRequest` with no service named."""
SERVING = b"\x08\x01"
"""`HealthCheckResponse{status: SERVING}` as protobuf: field 1, varint, 1."""
MAX_BYTES = 64 * 1024
"""What the probe reads at most: a health answer is a few dozen bytes."""


async def serving(host: str, port: int) -> bool:
    """One health call; False on anything but a SERVING answer with status 0 (bounded by the
    caller's timeout)."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    authority = f"{host}:{port}".encode()
    conn.send_headers(
        stream,
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", authority),
            (b":path", PATH),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ],
    )
    conn.send_data(stream, EMPTY_CALL, end_stream=True)
    body = b""
    status: bytes | None = None
    read = 0
    try:
        async with await anyio.connect_tcp(host, port) as sock:
            await sock.send(conn.data_to_send())
            while read < MAX_BYTES:
                data = await sock.receive(4096)
                read += len(data)
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                        body += event.data or b""
                        conn.acknowledge_received_data(event.flow_controlled_length, stream)
                    elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                        for name, value in event.headers:
                            if name == b"grpc-status":
                                status = bytes(value)
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                        return status == b"0" and body[5:] == SERVING
                    elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                        return False
                if pending := conn.data_to_send():
                    await sock.send(pending)
    except (OSError, anyio.EndOfStream, anyio.BrokenResourceError, h2.exceptions.H2Error):
        return False
    return False
