"""The messages a tunnel stream carries between a dial-out node and an ingress replica (seed 003).

A node opens each stream as a WebSocket (`OPEN`, with the node's token in its
`Authorization` header) through the load balancer to whichever ingress replica the balancer
picks. Every message is one binary WebSocket message: a kind byte, then its payload. The
stream carries one exchange at a time, and an exchange is a byte pipe to one sandbox: the
ingress writes the HTTP/1.1 request exactly as it would on a TCP connection and parses the
answer itself, so the node never parses HTTP (all the ingress's bounds on a hostile sandbox
still apply), and the node's part is a socket to a sandbox of its own.

| kind      | from    | payload                                                    |
|-----------|---------|------------------------------------------------------------|
| HELLO     | node    | JSON: `{"node": NAME}` (first message of a stream)         |
| HELLO     | ingress | JSON: `{"replica": ID, "replicas": [ID, ...]}` (answer)    |
| CONNECT   | ingress | tag, 2-byte length, sandbox id, the first request bytes    |
| DATA      | ingress | request bytes of the exchange in progress                  |
| END       | ingress | `1`: the node may keep its socket for the next, `0`: close |
| DATA      | node    | tag, answer bytes                                          |
| DATA_FIN  | node    | tag, the last answer bytes; the sandbox closed             |
| FIN       | node    | tag: the sandbox closed the connection                     |
| REFUSED   | node    | tag, why: nothing reached the sandbox (retry elsewhere)    |
| DRAIN     | node    | the node wants to close this stream: no new exchange on it |
| DRAINED   | ingress | the stream is out of use: the node closes it               |
| ACCEPTED  | replica | (RELAY only) a stream of the node is the relay's now       |

A node closes a stream it no longer wants (pruned, recycled) with DRAIN, and only once the
replica answered DRAINED: a request may have taken the stream as DRAIN went out, and is
carried first. An exchange starts with CONNECT, which carries its tag (one byte, counting
per stream), and ends with END; after REFUSED or FIN the node reads on to the END. The
ingress hands the stream to the next request as soon as END is sent: messages are ordered,
so the node reads END before the next CONNECT, and whatever the node sent for the old
exchange meanwhile carries the old tag and is dropped. (An earlier version had the node
answer END with ENDED and kept the stream out of use for that round trip: at 500 requests/s
a replica's two resting streams were then often both in it.) `RELAY` carries the same
exchange between two ingress replicas (one that holds no idle stream of the node asks one
that does), authenticated with an ingress token; the replica asked answers ACCEPTED once it
gives the relay a stream, or REFUSED at once.
"""

from __future__ import annotations

import json
from typing import Any

OPEN = "/v1/tunnel"
"""The path a node opens each stream on (a WebSocket, with its node token)."""
RELAY = "/v1/relay"
"""The path a replica relays an exchange to a peer on (with an ingress token)."""
NODE_HEADER = "x-wakeful-node"
"""RELAY's header: the node whose stream should carry the exchange."""
WAIT_HEADER = "x-wakeful-wait"
"""RELAY's header: seconds the replica relayed to may wait for a stream to free (0: answer
at once)."""

HELLO = 0x48  # H
CONNECT = 0x43  # C
DATA = 0x44  # D
FIN = 0x46  # F
DATA_FIN = 0x47  # G
REFUSED = 0x52  # R
END = 0x45  # E
ACCEPTED = 0x4B  # K
DRAIN = 0x58  # X
DRAINED = 0x59  # Y
ANSWERS = frozenset({DATA, DATA_FIN, FIN, REFUSED})
"""What the node sends about an exchange: each carries the exchange's tag."""

CHUNK = 64 * 1024
"""Body bytes in one DATA message, at most."""
MAX_MESSAGE = CHUNK + 1024
"""Bytes in one message, at most (the WebSocket's limit): a kind, a tag and a CHUNK, or a
CONNECT with its sandbox id, or a hello."""
MAX_HELLO = 16 * 1024

WEBSOCKET_OPTIONS: dict[str, Any] = {
    "compression": None,
    "max_size": MAX_MESSAGE,
    "max_queue": 4,
    "ping_interval": 20,
    "ping_timeout": 90,
}
"""Both ends of every stream (the `websockets` library's options). No compression: bodies pass
as they are. Messages of at most `MAX_MESSAGE`, 4 queued before reading pauses (backpressure:
a paused stream holds ~260 KiB). A ping every 20 s keeps an idle stream alive through a
balancer's idle timeout (nginx: 60 s). A pong may take 90 s: while an exchange is paused (a
client not reading its answer, a sandbox not reading its request) the stream is not read, so
its pong waits too, and such a client is cut off after the ingress's `client_timeout` (60 s),
such a sandbox after the node's 60 s; only a dead peer reaches the bound."""


class WireError(ValueError):
    """A message that breaks the protocol: the stream is closed."""


def hello(fields: dict[str, Any]) -> bytes:
    return bytes((HELLO,)) + json.dumps(fields, separators=(",", ":")).encode()


def read_hello(message: bytes) -> dict[str, Any]:
    if not message or message[0] != HELLO or len(message) > MAX_HELLO:
        raise WireError("the stream did not begin with a hello")
    try:
        fields = json.loads(message[1:])
    except ValueError as exc:
        raise WireError(f"the hello is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise WireError("the hello is not a JSON object")
    return fields


def connect(tag: int, sandbox: str, data: bytes = b"") -> bytes:
    name = sandbox.encode()
    if len(name) > 0xFFFF:
        raise WireError("the sandbox id is too long")
    return bytes((CONNECT, tag)) + len(name).to_bytes(2, "big") + name + data


def read_connect(message: bytes) -> tuple[int, str, bytes]:
    """The tag and the sandbox a CONNECT names, and the request bytes that came with it."""
    if len(message) < 4:
        raise WireError("a CONNECT too short to name a sandbox")
    tag = message[1]
    size = int.from_bytes(message[2:4], "big")
    if len(message) < 4 + size:
        raise WireError("a CONNECT shorter than the sandbox id it announces")
    try:
        name = message[4 : 4 + size].decode()
    except UnicodeDecodeError:
        raise WireError("a CONNECT whose sandbox id is not UTF-8") from None
    return tag, name, message[4 + size :]


def data(chunk: bytes) -> bytes:
    """Request bytes (ingress to node)."""
    return b"D" + chunk


def answer(kind: int, tag: int, payload: bytes = b"") -> bytes:
    """DATA, DATA_FIN, FIN or REFUSED from the node, for the exchange `tag`."""
    return bytes((kind, tag)) + payload


def refused(tag: int, reason: str) -> bytes:
    return answer(REFUSED, tag, reason.encode()[:1000])


def end(reuse: bool) -> bytes:
    return b"E1" if reuse else b"E0"


ACCEPTED_MESSAGE = b"K"
DRAIN_MESSAGE = b"X"
DRAINED_MESSAGE = b"Y"
