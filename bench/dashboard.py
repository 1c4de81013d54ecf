"""What the dashboard costs the control plane's event loop, and the traffic ring its memory.

For 100, 1,000 and 10,000 apps (each with a pool and, for a tenth of them, traffic reported
for 15 minutes and some waiters), on a real `Activator` over the memory store:

- the baseline: `Activator.snapshot()`, what `wakeful status` costs;
- `Dashboard.snapshot()` (what one tick builds while a browser watches: at most 100 apps with
  their 90-slot series) and its JSON, in ms and KB;
- `Charts.sample` (`activator/reporting.py`), once: it runs every second, watched or not;
- the traffic ring's memory (tracemalloc), in all and per app with traffic.

Figures only, no assertions. From the repository root:

    python -m bench.dashboard [--apps 100,1000,10000]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.dashboard")

import argparse
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable

import anyio
from prometheus_client import CollectorRegistry

from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.dashboard.live import Dashboard
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, Pool
from wakeful.domain.traffic import BUCKETS, SLOTS, STEP, AppTraffic, TrafficRing
from wakeful.store import open_store


def timed(run: Callable[[], object], times: int = 20) -> tuple[float, float]:
    """(p50, max) of `run` in ms."""
    seen = []
    for _ in range(times):
        start = time.perf_counter()
        run()
        seen.append((time.perf_counter() - start) * 1000)
    return statistics.median(seen), max(seen)


def fill(ring: TrafficRing, apps: list[str], now: float) -> None:
    """Every app of `apps` busy for 15 minutes: a report every 2 s, waiters now and then."""
    buckets = [0] * BUCKETS
    buckets[3] = 8
    buckets[6] = 2
    report = AppTraffic(requests=10, errors=0, buckets=buckets)
    start = now - SLOTS * STEP
    for step in range(int(SLOTS * STEP / 2)):
        at = start + step * 2
        for app in apps:
            ring.add(app, report, at)
            if step % 5 == 0:
                ring.waiters(app, 3, at)


async def measure(count: int) -> None:
    async with open_store("memory://") as store:
        spec = AppSpec(command=["serve"])
        for i in range(count):
            name = f"app{i:05d}"
            await store.put(keys.app(name), App(name=name, active_version="v1"))
            pool = Pool(name=f"{name}-v1", app=name, version="v1", spec=spec)
            await store.put(keys.pool(f"{name}-v1"), pool)
        settings = ActivatorSettings(store_url="memory://", token="t")
        activator = Activator(store, settings, CollectorRegistry())
        async with activator.running():
            busy = [f"app{i:05d}" for i in range(0, count, 10)]
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            fill(activator.traffic, busy, time.time())
            ring_bytes = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            dashboard = Dashboard(activator, lambda: None, store)
            base = timed(activator.snapshot)
            built = timed(dashboard.snapshot)
            encoded = len(json.dumps(dashboard.snapshot(), separators=(",", ":")))

            sampled = timed(activator._charts.sample)
    per_app = ring_bytes / max(1, len(busy))
    print(
        f"{count:>6} apps | status snapshot {base[0]:7.2f} ms (max {base[1]:7.2f}) | "
        f"dashboard snapshot {built[0]:7.2f} ms (max {built[1]:7.2f}), {encoded / 1024:6.1f} KB | "
        f"waiter sampling {sampled[0]:6.2f} ms | ring {ring_bytes / 1e6:6.1f} MB for "
        f"{len(busy)} busy apps ({per_app / 1024:.1f} KB each)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", default="100,1000,10000")
    args = parser.parse_args()
    for count in (int(n) for n in args.apps.split(",")):
        anyio.run(measure, count)


if __name__ == "__main__":
    main()
