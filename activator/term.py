"""Whether this activator may act now: grant, adopt and renew leases, and suspend sandboxes.

- It grants, adopts and renews only while its election term is certainly current
  (`leading()`, asked every time: a process paused past its term grants nothing when it
  wakes, before it has noticed) and it was not deposed (`deposed`, set once, for good).
- After a takeover it grants nothing until admission opens (the adoption window: the
  ingresses report the leases they hold first, invariant 20).
- It suspends nothing before admission opens, and after a takeover not for one lease TTL
  more: an ingress cut off for longer than the window reports its leases late, and a sandbox
  it still uses must not be frozen under its requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio

from wakeful.domain.leases import Unreachable


class Term:
    def __init__(
        self, *, lease_ttl: float, clock: Callable[[], float], leading: Callable[[], bool]
    ) -> None:
        self._lease_ttl = lease_ttl
        self._clock = clock
        self._leading = leading
        self.took_over = False
        """This activator took over from another (it was started with an adoption window)."""
        self.admitting = anyio.Event()
        """Set once admission may grant: at once, or after a takeover's adoption window."""
        self.deposed = anyio.Event()
        """Set when this activator stopped leading: it grants nothing more."""
        self._suspend_from = math.inf
        """On `clock`: when this activator may start suspending (it knows every lease)."""

    def check(self) -> None:
        """`Unreachable` (which an ingress retries on the new leader) once not leading."""
        if self.deposed.is_set() or not self._leading():
            raise Unreachable("this activator stopped leading", retry_after=1)

    def open_admission(self) -> bool:
        """End the adoption window now; False if it had ended already."""
        if self.admitting.is_set():
            return False
        grace = self._lease_ttl if self.took_over else 0.0
        self._suspend_from = self._clock() + grace
        self.admitting.set()
        return True

    def may_suspend(self) -> bool:
        return (
            self.admitting.is_set()
            and not self.deposed.is_set()
            and self._clock() >= self._suspend_from
        )
