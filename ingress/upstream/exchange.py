"""One exchange on an upstream connection, as data: a request sent, its answer read. The one
rule: an exchange's stage changes only along this table, and an illegal move raises and
changes nothing.

    IDLE ──send──▶ SENT ──a byte──▶ HEAD ──final head──▶ BODY ──end──▶ COMPLETE ──reuse──▶ IDLE
                     │               │  ▲                  │               │
                     │          1xx  │  │ its end          │               └──101──▶ SWITCHED
                     │               ▼  │                  │
                     │             INTERIM                 │
                     └───────┴───────┴─────── fail ────────┴──▶ FAILED

A connection starts IDLE and goes back to IDLE only from COMPLETE, and only when the
exchange left it clean (`reusable`): so no byte of one answer is ever read as another's.
SWITCHED (a handshake's 101, after which the connection carries a WebSocket) and FAILED are
final: the connection is closed. A failure after COMPLETE changes nothing (the answer is
whole; only the connection is lost), and a FAILED exchange never becomes COMPLETE.

No asyncio, no I/O. `upstream.handshake` moves it with `move`, which checks the table when it
runs. `upstream.connection` makes five moves on every proxied request, so it moves inline,
each move under a guard that names the stage it leaves (`if state.stage is BODY: state.stage
= COMPLETE`, or `if state.stage is not IDLE: raise IllegalMove(...)` before `state.stage =
SENT`), and `test_exchange.py` checks every such move against the table: the check runs once,
in the tests, not per request (a method call per move cost more than the rest of the
exchange's bookkeeping). Members are module constants for the same reason: an enum member
read through its class costs more than the move.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class Stage(IntEnum):
    IDLE = 0
    """No exchange: a new connection, or a pooled one."""
    SENT = 1
    """The request is going out; no byte of the answer came yet."""
    HEAD = 2
    """Bytes of the answer came; its head is not complete."""
    INTERIM = 3
    """A 1xx head came (not the answer); the answer's head follows its end."""
    BODY = 4
    """The answer's head is in; its body is coming."""
    COMPLETE = 5
    """The answer is whole."""
    SWITCHED = 6
    """A handshake's 101: the connection now carries a WebSocket, not HTTP."""
    FAILED = 7
    """The exchange broke; `ExchangeState.error` says how."""


IDLE: Final = Stage.IDLE
SENT: Final = Stage.SENT
HEAD: Final = Stage.HEAD
INTERIM: Final = Stage.INTERIM
BODY: Final = Stage.BODY
COMPLETE: Final = Stage.COMPLETE
SWITCHED: Final = Stage.SWITCHED
FAILED: Final = Stage.FAILED

MOVES: Final[dict[Stage, frozenset[Stage]]] = {
    IDLE: frozenset({SENT}),
    SENT: frozenset({HEAD, FAILED}),
    HEAD: frozenset({INTERIM, BODY, FAILED}),
    INTERIM: frozenset({HEAD, FAILED}),
    BODY: frozenset({COMPLETE, FAILED}),
    COMPLETE: frozenset({IDLE, SWITCHED}),
    SWITCHED: frozenset(),
    FAILED: frozenset(),
}
"""The table: from each stage, the stages an exchange may move to."""


_NEXT: Final = tuple(MOVES[stage] for stage in Stage)
"""`MOVES` indexed by stage."""


class IllegalMove(Exception):  # mypyc compiles no subclass of RuntimeError
    """An exchange was told to move where the table does not go (a bug, not a sandbox's
    misbehaviour: the protocols check what the sandbox sent before they move)."""

    def __init__(self, start: Stage, to: Stage) -> None:
        super().__init__(f"an exchange cannot move from {start.name} to {to.name}")


class ExchangeState:
    """The stage of the exchange on one connection, and the facts that decide whether the
    connection may carry another."""

    __slots__ = (
        "body_sent",
        "chunked_body",
        "error",
        "extra",
        "failed_in",
        "head_only",
        "keep_alive",
        "stage",
    )

    def __init__(self) -> None:
        self.stage = IDLE
        self.error: BaseException | None = None
        """Why it failed (FAILED only)."""
        self.failed_in = IDLE
        """The stage it failed in (FAILED only)."""
        self.head_only = False
        """The request was a HEAD: its answer ends with its head, whatever it says."""
        self.chunked_body = False
        """The request's body went out chunked."""
        self.body_sent = True
        """The request's body went out whole (or it had none)."""
        self.keep_alive = False
        """The answer's head let the connection carry another exchange."""
        self.extra = False
        """Bytes of a second answer came after the answer: the connection is not ours."""

    def move(self, to: Stage) -> None:
        if to not in _NEXT[self.stage]:
            raise IllegalMove(self.stage, to)
        self.stage = to

    def fail(self, error: BaseException) -> bool:
        """The exchange broke with `error`; False (and nothing changes) when it had already
        ended: a whole answer stands, and the first failure is the one kept."""
        stage = self.stage
        if stage is COMPLETE or stage is FAILED or stage is SWITCHED or stage is IDLE:
            return False
        self.move(FAILED)
        self.failed_in = stage
        self.error = error
        return True

    @property
    def answered(self) -> bool:
        """Some byte of the answer came (before it failed, for a FAILED exchange)."""
        stage = self.failed_in if self.stage is FAILED else self.stage
        return stage is not IDLE and stage is not SENT

    @property
    def reusable(self) -> bool:
        """The connection may carry another exchange: the answer is whole, its head allowed
        it, the request's body went out whole, and nothing can still be on the wire."""
        return (
            self.stage is COMPLETE
            and self.keep_alive
            and self.body_sent
            and not self.extra
            # A body sent chunked may have been left unread by an app that reads only
            # Content-Length bodies: its bytes would be taken as the next request.
            and not self.chunked_body
            # A HEAD answer ends with its head, whatever it says: a sandbox that sends a body
            # after it anyway would have those bytes read as the next request's answer.
            and not self.head_only
        )
