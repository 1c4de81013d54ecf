"""HTTP/2's vocabulary (RFC 9113) for `http2.wire`: the codes, types, flags and settings,
a frame's bytes, and a peer's flow-control window (`Window`, as `h2`'s `WindowManager`
kept it: when to tell the peer it may send more)."""

from __future__ import annotations

from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

HEADER_TABLE_SIZE: Final = 0x1
ENABLE_PUSH: Final = 0x2
MAX_CONCURRENT_STREAMS: Final = 0x3
INITIAL_WINDOW_SIZE: Final = 0x4
MAX_FRAME_SIZE: Final = 0x5
MAX_HEADER_LIST_SIZE: Final = 0x6
ENABLE_CONNECT_PROTOCOL: Final = 0x8

DEFAULT_WINDOW: Final = 65_535
MAX_WINDOW: Final = 2**31 - 1
DEFAULT_FRAME: Final = 16_384
MAX_FRAME: Final = 2**24 - 1


class Fault(Exception):
    """A connection error found while a frame is handled (`Wire` makes it a `WireError`)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class Window:
    """What a peer may still send us, and when to tell it it may send more: `h2`'s
    `WindowManager`, rule for rule (the WINDOW_UPDATEs go out when they did)."""

    __slots__ = ("current", "largest", "processed")

    def __init__(self, size: int) -> None:
        self.largest = size
        self.current = size
        self.processed = 0

    def consumed(self, size: int) -> None:
        self.current -= size
        if self.current < 0:
            raise Fault(FLOW_CONTROL_ERROR, "flow control window shrunk below 0")

    def opened(self, size: int) -> None:
        self.current += size
        if self.current > MAX_WINDOW:
            raise Fault(FLOW_CONTROL_ERROR, f"flow control window past {MAX_WINDOW}")
        self.largest = max(self.current, self.largest)

    def processed_bytes(self, size: int) -> int:
        """`size` more bytes read: the increment to send now (0: none yet)."""
        self.processed += size
        if not self.processed:
            return 0
        increment = 0
        if (
            self.current == 0 and self.processed > min(1024, self.largest // 4)
        ) or self.processed >= self.largest // 2:
            increment = min(self.processed, self.largest - self.current)
            self.processed = 0
        self.current += increment
        return increment


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """One frame, its 9-byte header and `payload`."""
    size = len(payload)
    return (
        bytes(
            (
                (size >> 16) & 0xFF,
                (size >> 8) & 0xFF,
                size & 0xFF,
                kind,
                flags,
                (stream_id >> 24) & 0x7F,
                (stream_id >> 16) & 0xFF,
                (stream_id >> 8) & 0xFF,
                stream_id & 0xFF,
            )
        )
        + payload
    )


def goaway_frame(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def u32(payload: bytes, at: int) -> int:
    return int.from_bytes(payload[at : at + 4], "big")
