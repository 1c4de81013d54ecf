"""What every long-lived wakeful process does as a process: it stops on a signal, settles its
heap once it has started, and names itself to the others.

`signals_caught` is entered first, inside the event loop and before a piece starts anything
(`wakeful.pieces._serve`): a SIGINT or SIGTERM that comes while the piece starts is kept for
`wait_for_signal`, which each piece awaits beside its start. Where the start may wait long (a
node's or an ingress replica's claim of its name, a token's check through a store outage), a
stop ends the wait at once; a piece that is serving is stopped in order. Before, the default
action killed a `wakeful up` told to stop while it started, leaving its warm sandboxes and their
mounts behind.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator, Sequence

import anyio

_caught: list[AsyncIterator[int]] = []
"""The receiver `signals_caught` opened, while it is open."""


@contextlib.contextmanager
def signals_caught() -> Iterator[None]:
    """SIGINT and SIGTERM caught from here on, for `wait_for_signal`; and the signals this
    process was started with ignored kept from its children (`ignored_not_inherited`)."""
    ignored_not_inherited()
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        _caught.append(signals)
        try:
            yield
        finally:
            _caught.remove(signals)


def ignored_not_inherited() -> None:
    """SIGHUP and SIGQUIT, if this process was started with them ignored (`nohup` ignores
    SIGHUP, a shell's background job SIGQUIT), stay ignored here but by a handler that does
    nothing: exec keeps an ignored signal ignored and resets a handled one, and every sandbox
    (a subprocess of this one, unisolated) would otherwise start deaf to them. Main thread."""
    for signum in (signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, _nothing)


def _nothing(signum: int, frame: object) -> None:
    pass


async def wait_for_signal(extra: Sequence[signal.Signals] = ()) -> int:
    """Until SIGINT or SIGTERM (or one of `extra`); returns its number."""
    if _caught and not extra:
        async for signum in _caught[-1]:
            return signum
        return 0
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, *extra) as signals:
        async for signum in signals:
            return signum
    return 0


def settle_heap() -> None:
    """Once a service is up: what it made while starting (its modules, classes, settings, the
    state it loaded) moves out of the collector's sight (`gc.freeze`). A full collection scans
    every tracked object, so in a process holding all of that it paused the loop for
    milliseconds; `bench/activator.py` showed it as the lease channel's p99 (26 ms, 6.5 ms once
    frozen)."""
    gc.collect()
    gc.freeze()


def identity() -> str:
    """This process among its peers (a leader record's holder): `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"
