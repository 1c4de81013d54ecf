"""Where the ingress's cost a request comes from, in steps: nginx, the floor (`bench.floor`: the
ingress's stack doing the least a proxy does), the floor with the ingress's header rules
(`--rules`), the ingress itself, and the ingress with its direct path off (`general`: every
request on the general path, `ingress.direct`), each in four shapes, alternated in every round
(nginx first, then the general path first) on one machine whose speed moves:

- wrk `-c32` as fast as it can (requests in batches: what a request costs warm);
- wrk `-c1` back to back (each request alone: what it costs cold);
- wrk `-c32` with a new connection each (`Connection: close`);
- hey at 1,000 req/s on 200 connections against a sandbox that answers after 100 ms (hey's
  workers fire together: bursts of 200), and what each adds to direct at p95.

For each: CPU a request (user + system, and user alone, from /proc) and involuntary context
switches a request (the process preempted: waits for a core with the burst's other
processes). The ingress runs in this process with the real activator in-process, as in
`bench.proxy`; nginx with one worker, the floors as subprocesses.

    python -m bench.ladder [--seconds 5] [--rounds 2]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.ladder")

import argparse
import contextlib
import logging
import os
import tempfile
from pathlib import Path

import anyio

from bench.harness import (
    FLOORS,
    NGINX_CONF,
    SLOW_DELAY,
    SLOW_WORKERS,
    ingress_on,
    nginx_conf,
    process,
    run_hey,
    run_wrk,
)
from bench.procfs import cpu_seconds, preempted, user_seconds, with_children
from wakeful.store.testing import free_port

GENERAL = "general"
"""The ingress with its direct path off (`direct_path`): every request on the general path."""

PATHS = ("nginx", *FLOORS, "ingress", GENERAL)
RATE = 1000


class Meter:
    """CPU, user time and preemptions of `pids` over a block, a request."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def start(self) -> None:
        pids = self.pids
        self._at = cpu_seconds(*pids), user_seconds(*pids), preempted(*pids)

    def per_request(self, requests: float) -> str:
        pids = self.pids
        cpu, user, switched = self._at
        if requests <= 0:
            return "no requests"
        cpu_us = (cpu_seconds(*pids) - cpu) / requests * 1e6
        user_us = (user_seconds(*pids) - user) / requests * 1e6
        switches = (preempted(*pids) - switched) / requests
        return f"{cpu_us:6.1f} ({user_us:5.1f}) {switches:4.2f}"


async def shapes(fast: str, slow: str, meter: Meter, seconds: int, direct_p95: float) -> str:
    cells = []
    for connections, close in ((32, False), (1, False), (32, True)):
        meter.start()
        result = await run_wrk(fast, seconds, connections=connections, close=close)
        cells.append(meter.per_request(result.rps * seconds))
        if result.errors:
            cells[-1] += f" [{result.errors}]"
    await run_hey(slow, 1, RATE, SLOW_WORKERS)  # warm-up: hey opens its connections at once
    meter.start()
    burst = await run_hey(slow, seconds, RATE, SLOW_WORKERS)
    cells.append(meter.per_request(burst.rps * seconds))
    cells.append(
        f"{burst.p95_ms - direct_p95:+5.1f} ms" + (f" [{burst.errors}]" * bool(burst.errors))
    )
    return " | ".join(cells)


async def main(seconds: int, rounds: int) -> None:
    port, slow = free_port(), free_port()
    sandbox = [sys.executable, "-m", "bench.proxy", "--sandbox"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(process([*sandbox, str(port)], port))
        stack.enter_context(process([*sandbox, str(slow), "--delay", str(SLOW_DELAY)], slow))
        urls: dict[str, tuple[str, str, list[int]]] = {}
        for name, mode in FLOORS.items():
            ports = free_port(), free_port()
            pids = []
            for listen, upstream in zip(ports, (port, slow), strict=True):
                argv = [sys.executable, "-m", "bench.floor", str(listen), str(upstream), *mode]
                pids.append(stack.enter_context(process(argv, listen)).pid)
            urls[name] = (f"http://127.0.0.1:{ports[0]}/", f"http://127.0.0.1:{ports[1]}/", pids)
        nginx_pids = []
        nginx_urls = []
        for upstream in (port, slow):
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="wakeful-bench-"))
            listen = free_port()
            conf = Path(tmp) / "nginx.conf"
            conf.write_text(nginx_conf(NGINX_CONF, tmp, upstream=upstream, port=listen))
            nginx = ["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"]
            nginx_pids += with_children(stack.enter_context(process(nginx, listen)).pid)
            nginx_urls.append(f"http://127.0.0.1:{listen}/")
        urls["nginx"] = (nginx_urls[0], nginx_urls[1], nginx_pids)
        async with (
            ingress_on(port) as fast_url,
            ingress_on(slow) as slow_url,
            ingress_on(port, direct_path=False) as general_fast,
            ingress_on(slow, direct_path=False) as general_slow,
        ):
            urls["ingress"] = (fast_url, slow_url, [os.getpid()])
            urls[GENERAL] = (general_fast, general_slow, [os.getpid()])
            await run_hey(f"http://127.0.0.1:{slow}/", 1, RATE, SLOW_WORKERS)
            direct = await run_hey(f"http://127.0.0.1:{slow}/", seconds, RATE, SLOW_WORKERS)
            print(
                f"wrk -t1 {seconds}s; hey -c{SLOW_WORKERS} at {RATE} req/s {seconds}s against a "
                f"{SLOW_DELAY * 1000:.0f} ms sandbox, direct p95 {direct.p95_ms:.1f} ms\n"
                "each cell: CPU µs a request (user), involuntary context switches a request\n"
            )
            print(
                f"{'path':<12} {'wrk -c32':<22} | {'wrk -c1':<20} | {'-c32, new conns':<20} | "
                f"{'bursts':<20} | added at p95"
            )
            for round_ in range(rounds):
                for name in PATHS if round_ % 2 == 0 else reversed(PATHS):
                    fast, slow_path, pids = urls[name]
                    row = await shapes(fast, slow_path, Meter(pids), seconds, direct.p95_ms)
                    print(f"{name:<12} {row}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, args.seconds, args.rounds, backend_options={"use_uvloop": True})
