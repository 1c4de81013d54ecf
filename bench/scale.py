"""Benchmark scale: many apps registered, each with one routable sandbox record.

1. A memory store is seeded with `--apps` apps (`app1`..`appN`), a pool each and one running,
   ready sandbox each, all pointing at one trivial sandbox (`bench.proxy`'s responder, a
   subprocess).
2. The activator and the ingress start in this process (as in `bench/proxy.py`); printed: the
   time from start to both views loaded (the ingress's routes synced, the activator's view
   synced), and what they added to the process's RSS (measured after seeding, so the store's
   own records are not counted).
3. wrk drives the ingress for `--seconds`: once with every request for `app1`, once spread over
   `--spread` apps (a Lua script picks a Host per request), one lease cache entry per app.

Figures only, no assertions. From the repository root (needs `apt-get install wrk`):

    .venv/bin/python -m bench.scale [--apps 10000] [--spread 1000] [--seconds 5]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.scale")

import argparse
import gc
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.proxy import CONNECTIONS, process, run_wrk, serving
from bench.websocket import rss
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.store import Put, Store
from wakeful.store.testing import free_port
from wakeful.store.url import open_store

SPREAD_LUA = """
local n = {spread}
request = function()
    local host = "app" .. math.random(1, n) .. ".localhost"
    return wrk.format("GET", "/", {{ ["Host"] = host }})
end
"""


async def seed(store: Store, apps: int, sandbox_port: int) -> None:
    spec = AppSpec(command=["bench"], concurrency=Concurrency(requests_per_instance=1000))
    batch: list[Put] = []
    for n in range(1, apps + 1):
        app = f"app{n}"
        batch += [
            Put(f"apps/{app}", App(name=app, active_version="v1")),
            Put(
                f"pools/{app}-v1",
                Pool(name=f"{app}-v1", app=app, version="v1", spec=spec, desired_instances=1),
            ),
            Put(
                f"sandboxes/{app}-sb",
                Sandbox(
                    id=f"{app}-sb",
                    pool=f"{app}-v1",
                    app=app,
                    node="n1",
                    status=SandboxStatus.RUNNING,
                    ready=True,
                    address=f"127.0.0.1:{sandbox_port}",
                ),
            ),
        ]
        if len(batch) >= 300:
            await store.txn([], batch)
            batch = []
    if batch:
        await store.txn([], batch)


async def main(apps: int, spread: int, seconds: int) -> None:
    if shutil.which("wrk") is None:
        sys.exit("missing wrk: apt-get install wrk")
    pid = os.getpid()
    sandbox_port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-scale-") as tmp,
        process(
            [sys.executable, "-m", "bench.proxy", "--sandbox", str(sandbox_port)], sandbox_port
        ),
    ):
        async with open_store("memory://") as store:
            started = time.perf_counter()
            await seed(store, apps, sandbox_port)
            print(
                f"seeded {apps} apps, pools and sandboxes in {time.perf_counter() - started:.1f} s"
            )
            gc.collect()
            before = rss(pid)
            started = time.perf_counter()
            async with serving(store) as ingress:
                loaded = time.perf_counter() - started
                gc.collect()
                added = rss(pid) - before
                url = "http://{}:{}/".format(*ingress.address)
                print(f"activator and ingress up, every route and pool loaded: {loaded:.2f} s")
                print(f"RSS they added (activator + ingress, one process): {added / 2**20:.0f} MiB")
                one = await run_wrk(url, seconds, host="app1.localhost")
                script = Path(tmp) / "spread.lua"
                script.write_text(SPREAD_LUA.format(spread=spread))
                many = await run_wrk(url, seconds, script=script)
                grown = rss(pid) - before
                print()
                print(f"wrk -t1 -c{CONNECTIONS} {seconds}s through the ingress:")
                print(f"  one app:            {one.rps:>10,.0f} req/s  p50 {one.p50_ms:.2f} ms")
                print(
                    f"  spread over {spread:<6} {many.rps:>10,.0f} req/s  p50 {many.p50_ms:.2f} ms"
                )
                print(f"  RSS added after the runs: {grown / 2**20:.0f} MiB")
                cached = len(ingress.cache.snapshot())
                errors = f"{one.errors or '-'} / {many.errors or '-'}"
                print(f"  lease cache entries: {cached}; errors: {errors}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--apps", type=int, default=10_000)
    parser.add_argument("--spread", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.apps, args.spread, args.seconds))
