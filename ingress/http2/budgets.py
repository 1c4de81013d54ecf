"""What an HTTP/2 peer's frames may cost before `http2.wire` parses them: the bounds and budgets
of frames that cost work and carry no request, on both sides (clients' connections, and
sandboxes' h2c ones).

`http2.wire` does the framing, the stream states and flow control (`http2.fields` HPACK).
What a server holding ten thousand connections must bound beyond the windows is here:

- **Header blocks.** A HEADERS frame and its CONTINUATIONs are at most `max_block` bytes (the
  ingress's head bound, 32 KiB), refused from the frame header that passes it, before the
  block is gathered (the 2024 CONTINUATION floods; `h2`, which the ingress used before,
  gathered 64 frames of 16 KiB, 1 MiB). A block left open longer than the head timeout
  ends the connection (`FrameScan.open_block` tells the connection when one is open).
- **Frames that carry no request** (PING, SETTINGS and their acknowledgements, PRIORITY,
  GOAWAY, an empty DATA frame that does not end its stream, an empty CONTINUATION, a frame of
  a type HTTP/2 does not define; and, counted by the wire, empty DATA or HEADERS on a stream
  already closed, and a sandbox's 1xx heads): a `Budget`
  of `CONTROL_BURST`, refilled at `CONTROL_RATE` a second.
- **Resets** (RST_STREAM from the client, CVE-2023-44487's rapid reset; and streams the
  client makes the ingress reset, by breaking a stream's rules or opening one past
  MAX_CONCURRENT_STREAMS, CVE-2025-8671's "MadeYouReset"): a `Budget` of `RESET_BURST`,
  refilled at `RESET_RATE` a second. Each reset stream is cancelled at once, its lease given
  back; the budget bounds how fast a client can make the ingress start work it then throws
  away.
- **WINDOW_UPDATE** frames: `CONTROL_BURST`, refilled at `CONTROL_RATE` and by two a DATA
  frame sent (a downloading client acknowledges what it reads).

Past a budget or a bound, the connection gets GOAWAY (ENHANCE_YOUR_CALM) and closes.
"""

from __future__ import annotations

from dataclasses import dataclass

from wakeful.ingress.http2.rules import PREFACE

CONTROL_BURST = 1000
CONTROL_RATE = 500.0
RESET_BURST = 200
RESET_RATE = 100.0

_DATA, _HEADERS, _PRIORITY, _RST, _SETTINGS, _PUSH, _PING, _GOAWAY = 0, 1, 2, 3, 4, 5, 6, 7
_WINDOW_UPDATE, _CONTINUATION = 8, 9
_END_STREAM = 0x1
_END_HEADERS = 0x4
_PADDED = 0x8
_ACK = 0x1


class Budget:
    """A token bucket: `burst` at first, `rate` more a second, never above `burst`."""

    __slots__ = ("_at", "_left", "burst", "rate")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.burst = burst
        self.rate = rate
        self._left = float(burst)
        self._at = now

    def give(self, count: int) -> None:
        """`count` more, beyond the rate (earned: a WINDOW_UPDATE per DATA frame sent), up to
        ten bursts."""
        self._left = min(self._left + count, 10 * self.burst)

    def spend(self, count: int, now: float) -> bool:
        """Take `count`; False when that overdraws the budget."""
        left = self._left
        if left < self.burst:  # the rate refills up to the burst; what was given is kept
            left = min(self.burst, left + (now - self._at) * self.rate)
        left -= count
        self._at = now
        self._left = left
        return left >= 0


@dataclass(slots=True)
class Seen:
    """What one read held, counted by `FrameScan.feed`."""

    data: bytes = b""
    """What the wire is given: the read, less a GOAWAY frame (and a frame header split by the
    read's end, held back until it is whole)."""
    control: int = 0
    resets: int = 0
    windows: int = 0
    """WINDOW_UPDATE frames: a client downloading sends many, so their budget is refilled by
    the DATA frames the ingress sends (`Budget.give`)."""
    goaway: bool = False
    """The peer sent GOAWAY: it starts no stream after it, and the streams under way must
    still be answered (RFC 9113 §6.8). The connection reads it here; the wire never sees it."""
    goaway_last: int | None = None
    """The last stream a GOAWAY from the peer names (read once its first 4 bytes came)."""
    refusal: str | None = None
    """Why the connection must end now (a header block past its bound)."""


class FrameScan:
    """Follows frame boundaries across reads (9-byte headers, payloads skipped), counts what
    the budgets bound, and takes the client's GOAWAY out; about a microsecond a frame, paid by
    HTTP/2 connections only."""

    __slots__ = (
        "_block",
        "_dropping",
        "_goaway",
        "_head",
        "_skip",
        "max_block",
        "open_block",
    )

    def __init__(self, max_block: int, preface: bool) -> None:
        self.max_block = max_block
        self._skip = len(PREFACE) if preface else 0
        """Bytes still to pass over: the preface, then each frame's payload."""
        self._dropping = False
        """The bytes passed over are a GOAWAY's: not for h2."""
        self._goaway: bytes | None = None
        """The start of a GOAWAY's payload being passed over, until its last stream is read."""
        self._head = b""
        """A frame header split by the end of a read, held back from the wire until whole."""
        self._block = 0
        self.open_block = False
        """A header block began (HEADERS without END_HEADERS) and has not ended."""

    def feed(self, data: bytes) -> Seen:
        seen = Seen()
        if self._head:
            data = self._head + data
            self._head = b""
        at = 0
        end = len(data)
        kept = 0
        """Where the bytes for the wire not yet taken begin."""
        pieces: list[bytes] = []
        while at < end:
            if self._skip:
                step = min(self._skip, end - at)
                if self._dropping and self._goaway is not None:
                    self._goaway += data[at : at + min(step, 4 - len(self._goaway))]
                    if len(self._goaway) == 4:
                        seen.goaway_last = int.from_bytes(self._goaway, "big") & 0x7FFFFFFF
                        self._goaway = None
                self._skip -= step
                at += step
                if self._dropping:
                    self._dropping = self._skip > 0
                    kept = at
                continue
            if end - at < 9:
                self._head = data[at:]
                break
            length = (data[at] << 16) | (data[at + 1] << 8) | data[at + 2]
            kind = data[at + 3]
            flags = data[at + 4]
            if kind == _GOAWAY:
                pieces.append(data[kept:at])
                seen.goaway = True
                seen.control += 1  # a client sends one or two
                at += 9
                kept = at
                self._skip = length
                self._dropping = length > 0
                self._goaway = b"" if length >= 4 else None
                continue
            at += 9
            self._skip = length
            if kind in (_HEADERS, _PUSH, _CONTINUATION):
                self._block = length if kind != _CONTINUATION else self._block + length
                self.open_block = not flags & _END_HEADERS
                if kind == _CONTINUATION and not length:  # no bytes: no bound but this one
                    seen.control += 1
                if self._block > self.max_block:
                    seen.refusal = (
                        f"a header block past {self.max_block} bytes ({self._block} so far)"
                    )
                    return seen
            elif kind == _RST:
                seen.resets += 1
            elif (
                kind in (_PING, _PRIORITY, _SETTINGS)  # acknowledgements too: one is due
                or (kind == _DATA and length == 0 and not flags & _END_STREAM)
                or (kind == _DATA and flags & _PADDED)  # padding: flow control, no data
                or kind > _CONTINUATION  # a type the wire ignores: no request either
            ):
                seen.control += 1
            elif kind == _WINDOW_UPDATE:
                seen.windows += 1
        stop = end - len(self._head)
        if not pieces and kept == 0 and stop == end:
            seen.data = data
        else:
            pieces.append(data[kept:stop])
            seen.data = b"".join(pieces)
        return seen
