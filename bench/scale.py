"""Benchmark scale: many apps registered, each with one routable sandbox record.

1. A memory store is seeded with `--apps` apps (`app1`..`appN`), a pool each and one running,
   ready sandbox each, all pointing at one trivial sandbox (`bench.proxy`'s responder, a
   subprocess).
2. The activator and the ingress start in this process (as in `bench/proxy.py`); printed: the
   time from start to both views loaded (the ingress's routes synced, the activator's view
   synced), and what they added to the process's RSS (measured after seeding, so the store's
   own records are not counted).
3. wrk drives the ingress for `--seconds`: once with every request for `app1`, once spread over
   `--spread` apps (a Lua script picks a Host per request), one lease cache entry per app; the
   process's CPU time over the requests wrk counted (the ingress and the activator).
4. The same two runs through nginx (one worker, upstream keep-alive as `bench/proxy.py`'s) with
   a `server_name` for each of the `--apps` apps (and 404 for any other Host), the CPU of its
   master and worker: the cost of routing among that many names, side by side.

Figures only, no assertions. From the repository root (needs `apt-get install nginx wrk`):

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
from typing import Any

from bench.harness import (
    CONNECTIONS,
    NGINX_HEAD,
    NGINX_HTTP,
    NGINX_KEEPALIVE,
    NGINX_TO_SANDBOX,
    Result,
    process,
    run_wrk,
    serving,
)
from bench.procfs import cpu_seconds, with_children
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


NGINX_SCALE_CONF = (
    NGINX_HEAD
    + """http {{
{http}
    server_names_hash_max_size {hash_size};
    server_names_hash_bucket_size 64;
    upstream sandbox {{ server 127.0.0.1:{upstream}; keepalive {keepalive}; }}
    server {{
        listen 127.0.0.1:{port} default_server;
        return 404;
    }}
    server {{
        listen 127.0.0.1:{port};
        server_name {names};
"""
    + NGINX_TO_SANDBOX
    + """    }}
}}
"""
)
"""nginx routing by Host among every app's name, to the one sandbox all of them share."""


def nginx_scale_conf(directory: str, apps: int, upstream: int, port: int) -> str:
    names = " ".join(f"app{n}.localhost" for n in range(1, apps + 1))
    return NGINX_SCALE_CONF.format(
        dir=directory,
        http=NGINX_HTTP.format(dir=directory),
        hash_size=max(512, 2 * apps),
        upstream=upstream,
        keepalive=NGINX_KEEPALIVE,
        port=port,
        names=names,
    )


async def both_runs(url: str, seconds: int, script: Path, pids: list[int]) -> tuple[Result, Result]:
    """wrk on `app1`, then spread by `script`, each after a second's warm-up; each with the
    CPU of `pids` a request."""
    runs = []
    for kind in ("one", "spread"):
        options: dict[str, Any] = (
            {"host": "app1.localhost"} if kind == "one" else {"script": script}
        )
        await run_wrk(url, 1, **options)  # not counted: the spread's first asks, cold caches
        before = cpu_seconds(*pids)
        result = await run_wrk(url, seconds, **options)
        if result.rps:
            result.cpu_us = (cpu_seconds(*pids) - before) / (result.rps * seconds) * 1e6
        runs.append(result)
    return runs[0], runs[1]


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
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: apt-get install nginx wrk")
    pid = os.getpid()
    sandbox_port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-scale-") as tmp,
        process(
            [sys.executable, "-m", "bench.proxy", "--sandbox", str(sandbox_port)], sandbox_port
        ),
    ):
        script = Path(tmp) / "spread.lua"
        script.write_text(SPREAD_LUA.format(spread=spread))
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
                one, many = await both_runs(url, seconds, script, [pid])
                grown = rss(pid) - before
                cached = len(ingress.cache.snapshot())
        nginx_port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(nginx_scale_conf(tmp, apps, sandbox_port, nginx_port))
        nginx = ["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"]
        with process(nginx, nginx_port) as master:
            pids = with_children(master.pid)
            ngx_one, ngx_many = await both_runs(
                f"http://127.0.0.1:{nginx_port}/", seconds, script, pids
            )
    print()
    print(f"wrk -t1 -c{CONNECTIONS} {seconds}s, the ingress and nginx ({apps} names each):")
    row = "  {:<27} {:>10} {:>8} {:>12}  {:>8}  {}"
    print(row.format("", "req/s", "p50 ms", "CPU µs/req", "x nginx", "errors"))
    for label, ours, theirs in (
        ("one app", one, ngx_one),
        (f"spread over {spread}", many, ngx_many),
    ):
        for name, result in (("ingress", ours), ("nginx", theirs)):
            times = ""
            if name == "ingress":
                times = f"{ours.cpu_us / theirs.cpu_us:.2f}x" if theirs.cpu_us else "n/a"
            print(
                row.format(
                    f"{label}, {name}",
                    f"{result.rps:,.0f}",
                    f"{result.p50_ms:.2f}",
                    f"{result.cpu_us:.1f}",
                    times,
                    result.errors or "-",
                )
            )
    print(f"  ingress RSS added after the runs: {grown / 2**20:.0f} MiB")
    print(f"  ingress lease cache entries: {cached}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--apps", type=int, default=10_000)
    parser.add_argument("--spread", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.apps, args.spread, args.seconds))
