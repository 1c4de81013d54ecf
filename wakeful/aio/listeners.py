"""Callbacks told of something, each on its own: one that raises is logged and the others
are still told, so a listener's bug never breaks whoever tells (a grant, a channel's reader).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, ParamSpec

log = logging.getLogger(__name__)

P = ParamSpec("P")


class Listeners(Generic[P]):
    def __init__(self, what: str) -> None:
        """`what`: what they are told, for the log line of one that failed."""
        self._what = what
        self._listeners: list[Callable[P, None]] = []

    def heed(self, listener: Callable[P, None]) -> Callable[[], None]:
        """Tell `listener` from now on; returns what stops it (once is enough; again, nothing)."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def tell(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in list(self._listeners):
            try:
                listener(*args, **kwargs)
            except Exception:
                log.exception("telling a listener %s failed", self._what)

    def __len__(self) -> int:
        return len(self._listeners)
