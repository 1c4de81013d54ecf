"""Benchmark the proxy path: one trivial sandbox driven directly, through the ingress, and
through nginx, with wrk (peak throughput) and hey (latency at a fixed rate).

- The sandbox: a minimal HTTP/1.1 responder on raw asyncio + uvloop (this module run with
  `--sandbox PORT`, a subprocess): it answers every request with a 2-byte body, keep-alive.
  The stdlib hello app is far too slow to be the thing measured against.
- The ingress: `ingress.Ingress` in this process on uvloop with httptools, the real
  `Activator` in-process (`InProcessLeases`) on the memory store; app `bench` with one
  running sandbox and a large `requests_per_instance`, so one cached lease carries the load.
- nginx: Debian's nginx as our own process (one worker, like the single-process ingress),
  generated config, upstream keep-alive, access log off.
- The floor (`bench/floor.py`, a subprocess): the least a proxy on the ingress's own stack
  (Python, uvloop, httptools) does, none of the ingress's work. What the ingress costs above
  it is its own code's; what the floor costs above nginx, the stack's. `floor+rules` is the
  same with five of the ingress's compiled header rules on both heads: roughly what those
  cost (`bench/floor.py` says how roughly). `bench/ladder.py` sets the four side by side.
- wrk: 1 thread, 32 connections; then, for each proxy, again with a new
  connection for each request (`Connection: close`: what a client that opens one per
  request costs, a script's, a health check's). hey: 10 workers at a fixed total rate
  (`--rate`), the proxies' CPU per request meanwhile, then again with a new connection for
  each request (`-disable-keepalive`): at the same rate the peers of both proxies sleep and
  are woken as often, which each one's own peak does not give (in a VM a wake-up is an
  interrupt through the hypervisor, and the slower proxy's peers sleep more).
- Then a sandbox that answers after 100 ms, at the same rate on 200 connections (enough to
  keep 100 requests in flight), in two shapes: hey (its workers fire together: bursts of 200)
  and wrk paced by a random think time (arrivals spread out): p95 direct, through nginx, the
  floor and the ingress.
- A node agent's firewall (the nftables table of `wakeful/node/jail/network.py`) turns on
  connection tracking for every packet of the machine; nginx, whose cost per request is mostly
  the kernel's, loses more to it than the ingress does. Compare runs on the same footing
  (`nft list tables`).

Only loopback. From the repository root (needs `apt-get install nginx wrk hey`):

    python -m bench.proxy [--seconds 10] [--rate 1000]
    python -m bench.proxy --split [--seconds 10] [--runs 3]  # a split's cost (bench/split.py)
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.proxy")

import argparse
import contextlib
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio

from bench.harness import (
    CONNECTIONS,
    FLOORS,
    HEY_WORKERS,
    HOST,
    NGINX_CONF,
    SLOW_DELAY,
    SLOW_WORKERS,
    Result,
    ingress_on,
    nginx_conf,
    process,
    run_hey,
    run_sandbox,
    run_wrk,
)
from bench.procfs import cpu_seconds, user_seconds, with_children
from wakeful.store.testing import free_port


async def measure(
    name: str, url: str, seconds: int, rate: int, pids: Sequence[int] = ()
) -> tuple[Result, Result]:
    """wrk (peak; with `pids`, their CPU time per request meanwhile, and again with a new
    connection for each request), then hey at `rate` (with `pids`, its CPU time per request
    too, and again with a new connection for each: at one rate, the peers of both proxies
    are woken as often, which a figure at each one's peak does not give)."""
    print(f"  {name}: wrk {seconds}s ...", flush=True)
    before, user = cpu_seconds(*pids), user_seconds(*pids)
    peak = await run_wrk(url, seconds)
    if pids and peak.rps:
        peak.cpu_us = (cpu_seconds(*pids) - before) / (peak.rps * seconds) * 1e6
        peak.user_us = (user_seconds(*pids) - user) / (peak.rps * seconds) * 1e6
        print(f"  {name}: wrk {seconds}s, a new connection each request ...", flush=True)
        before = cpu_seconds(*pids)
        new = await run_wrk(url, seconds, close=True)
        if new.rps:
            peak.cpu_new_us = (cpu_seconds(*pids) - before) / (new.rps * seconds) * 1e6
        if new.errors:  # connections refused or reset would flatter the figure: said
            print(f"  {name}: a new connection each request: {new.errors}", flush=True)
    print(f"  {name}: hey {seconds}s at {rate} req/s ...", flush=True)
    before = cpu_seconds(*pids)
    latency = await run_hey(url, seconds, rate)
    if pids and latency.rps:
        latency.cpu_us = (cpu_seconds(*pids) - before) / (latency.rps * seconds) * 1e6
        print(f"  {name}: hey {seconds}s at {rate} req/s, a new connection each ...", flush=True)
        before = cpu_seconds(*pids)
        new = await run_hey(url, seconds, rate, close=True)
        if new.rps:
            latency.cpu_new_us = (cpu_seconds(*pids) - before) / (new.rps * seconds) * 1e6
        if new.errors:
            print(f"  {name}: at {rate} req/s, a new connection each: {new.errors}", flush=True)
    return peak, latency


async def main(seconds: int, rate: int) -> None:
    missing = [tool for tool in ("nginx", "wrk", "hey") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: apt-get install nginx wrk hey")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"wrk -t1 -c{CONNECTIONS} {seconds}s, hey -c{HEY_WORKERS} at {rate} req/s {seconds}s"
    )
    print("sandbox: raw asyncio + uvloop responder (2-byte body, keep-alive), a subprocess")
    results: dict[str, tuple[Result, Result]] = {}
    sandbox_port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-bench-") as tmp,
        process(
            [sys.executable, "-m", "bench.proxy", "--sandbox", str(sandbox_port)], sandbox_port
        ),
    ):
        direct = f"http://127.0.0.1:{sandbox_port}/"
        results["direct"] = await measure("direct", direct, seconds, rate)
        async with ingress_on(sandbox_port) as url:  # this process: the activator's CPU too
            results["ingress"] = await measure("ingress", url, seconds, rate, [os.getpid()])
        for name, mode in FLOORS.items():
            floor_port = free_port()
            floor = [sys.executable, "-m", "bench.floor", str(floor_port), str(sandbox_port)]
            with process([*floor, *mode], floor_port) as bare:
                floor_url = f"http://127.0.0.1:{floor_port}/"
                results[name] = await measure(name, floor_url, seconds, rate, [bare.pid])
        nginx_port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(nginx_conf(NGINX_CONF, tmp, upstream=sandbox_port, port=nginx_port))
        nginx = ["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"]
        with process(nginx, nginx_port) as master:
            results["nginx"] = await measure(
                "nginx",
                f"http://127.0.0.1:{nginx_port}/",
                seconds,
                rate,
                with_children(master.pid),
            )
    slow = await slow_backend(seconds, rate)

    row = "{:<11} {:>12} {:>9} {:>9}   {:>10} {:>9} {:>9}  {}"
    print()
    print(
        row.format(
            "path", "wrk req/s", "p50 ms", "p99 ms", "hey req/s", "p50 ms", "p99 ms", "errors"
        )
    )
    for name, (peak, latency) in results.items():
        errors = " ".join(e for e in (peak.errors, latency.errors) if e) or "-"
        print(
            row.format(
                name,
                f"{peak.rps:,.0f}",
                f"{peak.p50_ms:.2f}",
                f"{peak.p99_ms:.2f}",
                f"{latency.rps:,.0f}",
                f"{latency.p50_ms:.2f}",
                f"{latency.p99_ms:.2f}",
                errors,
            )
        )
    (ing, ing_lat), (base, base_lat), (ngx, ngx_lat) = (
        results["ingress"],
        results["direct"],
        results["nginx"],
    )

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "n/a"

    print()
    print(
        f"ingress/direct: throughput {ratio(ing.rps, base.rps)}, "
        f"p50 at {rate}/s {ratio(ing_lat.p50_ms, base_lat.p50_ms)}x, "
        f"p99 {ratio(ing_lat.p99_ms, base_lat.p99_ms)}x"
    )
    print(
        f"ingress/nginx:  throughput {ratio(ing.rps, ngx.rps)}, "
        f"p50 at {rate}/s {ratio(ing_lat.p50_ms, ngx_lat.p50_ms)}x, "
        f"p99 {ratio(ing_lat.p99_ms, ngx_lat.p99_ms)}x"
    )
    print(
        f"CPU per request at peak: ingress {ing.cpu_us:.1f} µs (user {ing.user_us:.1f}), "
        f"nginx {ngx.cpu_us:.1f} µs (user {ngx.user_us:.1f}) "
        f"({ratio(ing.cpu_us, ngx.cpu_us)}x); a new connection each request: "
        f"{ing.cpu_new_us:.1f} µs, nginx {ngx.cpu_new_us:.1f} µs "
        f"({ratio(ing.cpu_new_us, ngx.cpu_new_us)}x)"
    )
    print(
        f"CPU per request at {rate} req/s: ingress {ing_lat.cpu_us:.1f} µs, nginx "
        f"{ngx_lat.cpu_us:.1f} µs ({ratio(ing_lat.cpu_us, ngx_lat.cpu_us)}x); a new "
        f"connection each request: {ing_lat.cpu_new_us:.1f} µs, nginx "
        f"{ngx_lat.cpu_new_us:.1f} µs ({ratio(ing_lat.cpu_new_us, ngx_lat.cpu_new_us)}x)"
    )
    for name, what in (
        ("floor", "the same stack, none of the ingress's work"),
        ("floor+rules", "and five of the ingress's header rules"),
    ):
        low, low_lat = results[name]
        print(
            f"{name} ({what}): {low.cpu_us:.1f} µs (user {low.user_us:.1f}) at peak, "
            f"{low.cpu_new_us:.1f} with a new connection each, {low_lat.cpu_us:.1f} at "
            f"{rate} req/s, {low_lat.cpu_new_us:.1f} with a new connection each"
        )
    print(
        f"ingress adds at {rate}/s: p50 {ing_lat.p50_ms - base_lat.p50_ms:+.2f} ms, "
        f"p99 {ing_lat.p99_ms - base_lat.p99_ms:+.2f} ms over direct"
    )
    print()
    for shape, paths in slow.items():
        print(f"a {SLOW_DELAY * 1000:.0f} ms backend at {rate} req/s, {shape}:")
        for name, result in paths.items():
            errors = result.errors or "-"
            cpu = ""
            if result.cpu_us:  # the bursts' through a proxy: its CPU, and the user time of it
                cpu = f"  CPU {result.cpu_us:5.1f} µs a request (user {result.user_us:.1f})"
            print(
                f"  {name:<11} {result.rps:>7,.0f} req/s  p50 {result.p50_ms:6.1f} ms  "
                f"p95 {result.p95_ms:6.1f} ms  p99 {result.p99_ms:6.1f} ms  errors {errors}{cpu}"
            )
        for name in ("nginx", *FLOORS, "ingress"):
            added = paths[name].p95_ms - paths["direct"].p95_ms
            print(f"  {name} adds {added:+.1f} ms at p95")


PACED_LUA = """
math.randomseed(os.time())
local mean = %(mean_ms)f
wrk.headers["Host"] = "%(host)s"
function delay() return math.floor(-math.log(1 - math.random()) * mean) end
function done(summary, latency, requests)
  io.write(string.format("p95_us %%d\\n", latency:percentile(95)))
end
"""
"""wrk with a random think time before each request (exponential, so arrivals spread out
rather than come in ticks); wrk's latency does not count the think time."""


async def slow_backend(seconds: int, rate: int) -> dict[str, dict[str, Result]]:
    """Direct, through nginx, the floor and the ingress, against a sandbox that answers after
    SLOW_DELAY, under two shapes of the same rate:

    - hey: its workers fire on the same tick, so each tick is a burst of 200 requests: what a
      proxy adds is mostly how long the last of a burst waits behind the others, which is its
      CPU per request times the burst;
    - paced: wrk on 200 connections, each waiting a random (exponential) think time before
      each request, sized so the total comes near `rate`: requests arrive spread out."""
    port = free_port()
    sandbox = [sys.executable, "-m", "bench.proxy", "--sandbox", str(port)]
    results: dict[str, dict[str, Result]] = {
        f"hey -c{SLOW_WORKERS} (bursts)": {},
        f"wrk -c{SLOW_WORKERS} paced": {},
    }
    bursts, paced = results.values()
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-bench-") as tmp,
        process([*sandbox, "--delay", str(SLOW_DELAY)], port),
    ):
        print(f"  slow backend: {seconds}s at {rate} req/s, direct, nginx, floor, ingress ...")
        think = max(0.0, SLOW_WORKERS / rate - SLOW_DELAY) * 1000
        script = Path(tmp) / "paced.lua"
        script.write_text(PACED_LUA % {"mean_ms": think, "host": HOST})
        nginx_port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(nginx_conf(NGINX_CONF, tmp, upstream=port, port=nginx_port))
        nginx = ["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"]
        floor_port = free_port()
        floor = [sys.executable, "-m", "bench.floor", str(floor_port), str(port)]
        paths = (
            ("direct", f"http://127.0.0.1:{port}/"),
            ("nginx", f"http://127.0.0.1:{nginx_port}/"),
            *((name, f"http://127.0.0.1:{floor_port}/") for name in FLOORS),
            ("ingress", None),
        )
        for name, url in paths:
            async with contextlib.AsyncExitStack() as stack:
                pids: list[int] = []  # the proxy's processes (direct: none)
                if name == "nginx":
                    master = stack.enter_context(process(nginx, nginx_port)).pid
                    pids = with_children(master)
                if name in FLOORS:
                    bare = process([*floor, *FLOORS[name]], floor_port)
                    pids = [stack.enter_context(bare).pid]
                if url is None:
                    url = await stack.enter_async_context(ingress_on(port))
                    pids = [os.getpid()]  # the ingress and its activator, in this process
                # Warm-up, not counted: hey opens its 200 connections at once, and the first
                # answers through any proxy wait for 200 new upstream connections too.
                await run_hey(url, 1, rate, SLOW_WORKERS)
                before = cpu_seconds(*pids), user_seconds(*pids)
                bursts[name] = burst = await run_hey(url, seconds, rate, SLOW_WORKERS)
                if pids and burst.rps:
                    served = burst.rps * seconds / 1e6
                    burst.cpu_us = (cpu_seconds(*pids) - before[0]) / served
                    burst.user_us = (user_seconds(*pids) - before[1]) / served
                paced[name] = await run_wrk(url, seconds, script=script, connections=SLOW_WORKERS)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=1000, help="hey's total request rate")
    parser.add_argument(
        "--split",
        action="store_true",
        help="measure a 50/50 traffic split against none instead (bench/split.py)",
    )
    parser.add_argument("--runs", type=int, default=3, help="with --split: runs per side")
    parser.add_argument("--sandbox", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sandbox:
        run_sandbox(args.sandbox, args.delay)
    elif args.split:
        from bench import split

        logging.basicConfig(level=logging.WARNING)
        anyio.run(split.main, args.seconds, args.runs, backend_options={"use_uvloop": True})
    else:
        logging.basicConfig(level=logging.WARNING)
        anyio.run(main, args.seconds, args.rate, backend_options={"use_uvloop": True})
