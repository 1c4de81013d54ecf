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

from collections.abc import Callable, Mapping

from wakeful.activator.view import PoolState
from wakeful.aio.listeners import Listeners


class SpareAsks:
    def __init__(self, pools: Mapping[str, PoolState]) -> None:
        """`pools`: the activator's view of the pools, by name."""
        self._pools = pools
        self._listeners: Listeners[[str, str]] = Listeners("that a pool turned short")

    def heed(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Tell `listener` (app, version) from now on; returns what stops it. It never
        waits; one that raises is logged, and the grant that made the news goes on."""
        return self._listeners.heed(listener)

    def tell(self, pool: str) -> None:
        """`pool` turned short (`LeaseLedger.became_short`): every listener hears it now."""
        state = self._pools.get(pool)
        if state is not None:
            self._listeners.tell(state.item.value.app, state.item.value.version)
