"""Cold-start trace points: where a woken request's time goes.

With `WAKEFUL_TRACE=1` in the environment, each step of a wake logs one line on the
`wakeful.trace` logger: `trace EVENT app=APP t=SECONDS`, `t` on the machine's monotonic clock
(CLOCK_MONOTONIC, the same in every process of one machine, so `bench/coldstart.py` can put its
own send and receive times beside them). The events, in order:

    routed     the ingress read the request's head and found its app
    wait       the activator found nothing routable and parked the request
    scale_up   the pool's new size is written
    placed     the pool controller created the sandbox record on a node
    claimed    the node agent took the record and starts preparing the sandbox
    prepared   its records are read and its artifact fetched
    booting    the booting status is written
    spawned    the sandbox's first process started (uid, tmpfs filled, cgroups done)
    probed     the first readiness probe succeeded
    ready      the ready record is written
    routable   the activator's view has the sandbox routable (and wakes the waiters)
    lease      the parked request got its lease
    leased     the ingress holds it
    answered   the sandbox's answer head reached the ingress (a woken request only)

A thaw of a suspended sandbox (`wakeful.activator.suspend`) has its own: `wait`, then
`thawed` (the activator's write is done), `routable`, `lease`, `leased`, and on the node
`thaw_seen` (its watch brought the record) and `unfrozen` (the processes run again).

Off (the default) a mark costs one boolean test.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("wakeful.trace")
ENABLED = os.environ.get("WAKEFUL_TRACE", "") not in ("", "0")
if ENABLED:
    log.setLevel(logging.DEBUG)


def mark(event: str, app: str) -> None:
    if ENABLED:
        log.debug("trace %s app=%s t=%.6f", event, app, time.monotonic())
