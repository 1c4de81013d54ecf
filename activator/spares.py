"""Telling the ingresses the moment a pool turns short (issue 42).

A pool is short when a request of it got less than a normal lease: an overflow lease, or a
wait with every routable sandbox at its hard limit (`LeaseLedger.short_of`). The ingresses
holding normal leases of it then hand back those they are not using (`ingress.cache`), so
the capacity goes where the requests are. A renewal says so (`LeaseGrant.spare_wanted`), but
a quiet ingress renews a lease only a third of its TTL after the last time: meanwhile every
request of another ingress took an overflow lease of its own. `SpareAsks` tells its
listeners (each lease channel; an in-process ingress) as the pool turns short, once per
spell (`wakeful.domain.leases.short`), by the app and the version the pool serves, which is
how an ingress keeps its leases. The renewal's word stays: for an ingress that cannot be
told (plain HTTP), or whose channel was closed then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from wakeful.activator.view import PoolState

log = logging.getLogger(__name__)

Listener = Callable[[str, str], None]
"""Told (app, version) of a pool that turned short; never waits."""


class SpareAsks:
    def __init__(self, pools: Mapping[str, PoolState]) -> None:
        """`pools`: the activator's view of the pools, by name."""
        self._pools = pools
        self._listeners: list[Listener] = []

    def heed(self, listener: Listener) -> Callable[[], None]:
        """Tell `listener` from now on; returns what stops it."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def tell(self, pool: str) -> None:
        """`pool` turned short (`LeaseLedger.became_short`): every listener hears it now."""
        state = self._pools.get(pool)
        if state is None:
            return
        record = state.item.value
        for listener in list(self._listeners):
            try:
                listener(record.app, record.version)
            except Exception:  # a listener's failure is its own; the grant goes on
                log.exception("telling a lease holder that %s is short failed", pool)
