"""Benchmark a traffic split's cost on the proxy's hot path (issue 39): CPU time per proxied
request with a 50/50 split between two versions against the same app with no split, in the
same process, runs alternated.

- Two trivial sandboxes (`bench.proxy`'s raw uvloop responder, subprocesses), one per version.
- The ingress and the real activator in this process (`bench.harness.serving`, memory store).
- Each run: wrk -t1 -c32 for `--seconds`; this process's CPU time (user + system, the ingress
  and the activator; wrk and the sandboxes are other processes) over the requests wrk counted.
  The split is switched by writing the app's record between runs, as `wakeful traffic` does.
- Runs alternate (none, split, none, split, ...): the machine's drift falls on both sides.

From the repository root (needs `apt-get install wrk`):

    python -m bench.split [--seconds 5] [--runs 3]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.split")

import argparse
import contextlib
import logging
import os
import platform
import re
import shutil
import statistics
import time

import anyio

from bench.harness import CONNECTIONS, HOST, process, serving
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.store import Store
from wakeful.store.testing import free_port
from wakeful.store.url import open_store

NO_SPLIT = App(name="bench", active_version="v1")
SPLIT = App(name="bench", active_version="v1", split={"v1": 50, "v2": 50})


async def seed(store: Store, ports: dict[str, int]) -> None:
    spec = AppSpec(
        command=["bench"],
        concurrency=Concurrency(requests_per_instance=1000, max_instances=1),
    )
    await store.put("apps/bench", NO_SPLIT)
    for version, port in ports.items():
        pool = f"bench-{version}"
        await store.put(
            f"pools/{pool}",
            Pool(name=pool, app="bench", version=version, spec=spec, desired_instances=1),
        )
        await store.put(
            f"sandboxes/sb-{version}",
            Sandbox(
                id=f"sb-{version}",
                pool=pool,
                app="bench",
                node="n1",
                status=SandboxStatus.RUNNING,
                ready=True,
                address=f"127.0.0.1:{port}",
            ),
        )


async def wrk(url: str, seconds: int) -> int:
    """Requests wrk completed (non-2xx counted as a failure of the run)."""
    done = await anyio.run_process(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "-H", f"Host: {HOST}", url],
        check=False,
    )
    out = done.stdout.decode()
    if "Non-2xx" in out or "Socket errors" in out:
        sys.exit(f"wrk saw errors:\n{out}")
    found = re.search(r"(\d+) requests in", out)
    if found is None:
        sys.exit(f"wrk said nothing usable:\n{out}\n{done.stderr.decode()}")
    return int(found.group(1))


async def main(seconds: int, runs: int) -> None:
    if shutil.which("wrk") is None:
        sys.exit("missing wrk: apt-get install wrk")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, wrk -t1 -c{CONNECTIONS} "
        f"{seconds}s per run, {runs} runs per side, alternated"
    )
    ports = {"v1": free_port(), "v2": free_port()}
    cost: dict[str, list[float]] = {"no split": [], "50/50 split": []}
    rates: dict[str, list[float]] = {"no split": [], "50/50 split": []}
    with contextlib.ExitStack() as sandboxes:
        for port in ports.values():
            sandboxes.enter_context(
                process([sys.executable, "-m", "bench.proxy", "--sandbox", str(port)], port)
            )
        async with open_store("memory://") as store:
            await seed(store, ports)
            async with serving(store) as ingress:
                url = "http://{}:{}/".format(*ingress.address)
                await wrk(url, 1)  # warm-up: connections, leases
                for _ in range(runs):
                    for name, record in (("no split", NO_SPLIT), ("50/50 split", SPLIT)):
                        await store.put("apps/bench", record)
                        await anyio.sleep(0.3)  # the routing table follows apps/
                        await wrk(url, 1)  # each side's leases cached before it counts
                        cpu = time.process_time()
                        requests = await wrk(url, seconds)
                        cpu = time.process_time() - cpu
                        cost[name].append(cpu / requests * 1e6)
                        rates[name].append(requests / seconds)
                        print(
                            f"  {name:12} {requests / seconds:9,.0f} req/s  "
                            f"{cpu / requests * 1e6:6.1f} us CPU/request",
                            flush=True,
                        )
    base = statistics.median(cost["no split"])
    print("medians:")
    for name in cost:
        median = statistics.median(cost[name])
        print(
            f"  {name:12} {statistics.median(rates[name]):9,.0f} req/s  {median:6.1f} us "
            f"CPU/request  ({median / base - 1:+.1%} against no split)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, args.seconds, args.runs, backend_options={"use_uvloop": True})
