"""The upstream transport: requests to sandboxes on asyncio protocols and httptools.

- `raw`: `RawTransport`, the `ingress.transport.Transport` the ingress runs: one attempt per
  `send`, within the app's slots, on a pooled connection or a handshake's own.
- `connection`: one pooled connection, one exchange at a time, backpressure both ways.
- `h2c`: cleartext HTTP/2 to the sandboxes of h2c apps, connections pooled and multiplexed;
  `h2exchange`: one exchange on one of their streams.
- `handshake`: a WebSocket handshake's connection, then the sandbox's end of its tunnel.
- `pool`: idle connections per sandbox, and the slots that bound exchanges per app.
- `exchange`: one exchange's stage as a transition table (pure).
- `rules`: what an answer head means: status, framing, the framing bound (pure).
"""

from wakeful.aio.flow import HIGH_WATER
from wakeful.ingress.upstream.raw import RawTransport

__all__ = ["HIGH_WATER", "RawTransport"]
