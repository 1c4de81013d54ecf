"""The messages a tunnel stream carries between a dial-out node and an ingress replica (seed 003).

A node opens each stream as a WebSocket (`OPEN`, with the node's token in its
`Authorization` header) through the load balancer to whichever ingress replica the balancer
picks. Every message is one binary WebSocket message: a kind byte, then its payload. The
stream carries one exchange at a time, and an exchange is a byte pipe to one sandbox: the
ingress writes the HTTP/1.1 request exactly as it would on a TCP connection and parses the
answer itself, so the node never parses HTTP (all the ingress's bounds on a hostile sandbox
still apply), and the node's part is a socket to a sandbox of its own.

| kind      | from    | payload                                                   |
|-----------|---------|-----------------------------------------------------------|
| HELLO     | node    | JSON: `{"node": NAME}` (first message of a stream)        |
| HELLO     | ingress | JSON: `{"replica": ID, "replicas": [ID, ...]}` (answer)   |
| CONNECT   | ingress | 2-byte length, sandbox id, then the first request bytes   |
| DATA      | both    | bytes of the exchange                                     |
| FIN       | node    | the sandbox closed the connection                         |
| REFUSED   | node    | why: nothing reached the sandbox (safe to retry elsewhere)|
| END       | ingress | `1`: the connection may be kept for the next, `0`: close  |
| ENDED     | node    | the exchange is over; the stream is idle again            |
| PING/PONG | both    | (spare: WebSocket pings keep idle streams alive)           |
| ACCEPTED  | replica | (RELAY only) a stream of the node is the relay's now      |

An exchange starts with CONNECT and ends with END from the ingress, answered by ENDED; after
REFUSED or FIN the node discards DATA until END. Messages on a stream are ordered, so
nothing of one exchange can arrive after ENDED: the ingress hands the stream to the next
request only then. `RELAY` carries the same exchange between two ingress replicas (one that
holds no idle stream of the node asks one that does), authenticated with an ingress token;
the replica asked answers ACCEPTED once it gives the relay a stream, or REFUSED at once.
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
REFUSED = 0x52  # R
END = 0x45  # E
ENDED = 0x41  # A
ACCEPTED = 0x4B  # K
PING = 0x50  # P
PONG = 0x51  # Q

MAX_MESSAGE = 1024 * 1024
"""Bytes in one message, at most: DATA is cut below it."""
CHUNK = 256 * 1024
MAX_HELLO = 64 * 1024


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


def connect(sandbox: str, data: bytes = b"") -> bytes:
    name = sandbox.encode()
    if len(name) > 0xFFFF:
        raise WireError("the sandbox id is too long")
    return bytes((CONNECT,)) + len(name).to_bytes(2, "big") + name + data


def read_connect(message: bytes) -> tuple[str, bytes]:
    """The sandbox a CONNECT names, and the request bytes that came with it."""
    if len(message) < 3:
        raise WireError("a CONNECT too short to name a sandbox")
    size = int.from_bytes(message[1:3], "big")
    if len(message) < 3 + size:
        raise WireError("a CONNECT shorter than the sandbox id it announces")
    try:
        name = message[3 : 3 + size].decode()
    except UnicodeDecodeError:
        raise WireError("a CONNECT whose sandbox id is not UTF-8") from None
    return name, message[3 + size :]


def data(chunk: bytes) -> bytes:
    return b"D" + chunk


def end(reuse: bool) -> bytes:
    return b"E1" if reuse else b"E0"


def refused(reason: str) -> bytes:
    return b"R" + reason.encode()[:1000]


FIN_MESSAGE = b"F"
ENDED_MESSAGE = b"A"
ACCEPTED_MESSAGE = b"K"
PING_MESSAGE = b"P"
PONG_MESSAGE = b"Q"
