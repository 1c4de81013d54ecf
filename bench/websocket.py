"""Benchmark WebSockets through the ingress, against the same sandbox directly and through nginx
(one worker), in the same run.

- The sandbox: a WebSocket echo server on the `websockets` library (this module run with
  `--sandbox PORT`, a subprocess), compression off.
- The ingress: `ingress.Ingress` in this process on uvloop, the real `Activator` in-process on
  the memory store (as `bench/proxy.py` sets it up), app `bench` with one running sandbox.
- nginx: Debian's nginx as our own process, one worker, `proxy_pass` with the upgrade headers.
- The client: another subprocess (`--client`), so it does not share a loop with the ingress.

Two figures per path:
1. Echo round trips: one connection, `--messages` sequential 32-byte round trips (p50, p99);
   then 32 connections echoing at once (messages/s).
2. Idle WebSockets held: `--idle` connections opened and kept open with nothing sent; the
   memory the proxy's process gained per connection (RSS before and after, from /proc). Each
   one takes two of the proxy's file descriptors: the open-files limit must allow it.

Figures only, no assertions. From the repository root (needs `apt-get install nginx`):

    .venv/bin/python -m bench.websocket [--messages 5000] [--idle 5000]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.websocket")

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import ingress_on, nginx_conf, process
from wakeful.store.testing import free_port

NGINX_CONF = """
worker_processes 1;
worker_rlimit_nofile 40000;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 30000; }}
http {{
{http}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_set_header Host $host;
            proxy_read_timeout 3600s;
        }}
    }}
}}
"""


# -- the sandbox and the client (subprocesses) ---------------------------------------------


async def sandbox(port: int) -> None:
    from websockets.asyncio.server import ServerConnection, serve

    async def echo(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    async with serve(echo, "127.0.0.1", port, compression=None, max_queue=None):
        await asyncio.Future()


async def client(port: int, messages: int, idle: int) -> None:
    """Prints one JSON line per phase; waits for a line on stdin before closing the idle ones."""
    from websockets.asyncio.client import ClientConnection, connect

    def opened() -> connect:
        return connect(
            f"ws://bench.localhost:{port}/", host="127.0.0.1", port=port, compression=None
        )

    payload = b"x" * 32
    async with opened() as ws:
        for _ in range(200):  # warm up
            await ws.send(payload)
            await ws.recv()
        rtts = []
        for _ in range(messages):
            started = time.perf_counter()
            await ws.send(payload)
            await ws.recv()
            rtts.append(time.perf_counter() - started)
    rtts.sort()
    print(json.dumps({"p50": rtts[len(rtts) // 2], "p99": rtts[int(len(rtts) * 0.99)]}), flush=True)

    async def busy(ws: ClientConnection, until: float, counts: list[int]) -> None:
        n = 0
        while time.perf_counter() < until:
            await ws.send(payload)
            await ws.recv()
            n += 1
        counts.append(n)

    conns = [await opened() for _ in range(32)]
    counts: list[int] = []
    started = time.perf_counter()
    await asyncio.gather(*(busy(ws, started + 5, counts) for ws in conns))
    print(json.dumps({"rate": sum(counts) / (time.perf_counter() - started)}), flush=True)
    for ws in conns:
        await ws.close()

    held = []
    for _ in range(idle):
        held.append(await opened())
    print(json.dumps({"held": len(held)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for ws in held:
        await ws.close()


# -- the run ------------------------------------------------------------------------------


def first_child(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def measure(
    name: str, port: int, proxy_pid: int, messages: int, idle: int
) -> dict[str, float]:
    print(f"  {name} ...", flush=True)
    before = rss(proxy_pid)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.websocket",
        "--client",
        str(port),
        "--messages",
        str(messages),
        "--idle",
        str(idle),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    found: dict[str, float] = {}
    for _ in range(3):
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client for {name} ended early (exit {await proc.wait()})")
        found.update(json.loads(line))
    await asyncio.sleep(1)  # let the proxy settle with every connection open
    found["per_conn"] = (rss(proxy_pid) - before) / max(1, int(found["held"]))
    proc.stdin.write(b"done\n")
    await proc.stdin.drain()
    await proc.wait()
    return found


async def main(messages: int, idle: int) -> None:
    if shutil.which("nginx") is None:
        sys.exit("missing nginx: apt-get install nginx")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(
        f"{os.cpu_count()} CPUs; open files {hard}; {messages} round trips, {idle} idle WebSockets"
    )
    results: dict[str, dict[str, float]] = {}
    port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-ws-bench-") as tmp,
        process([sys.executable, "-m", "bench.websocket", "--sandbox", str(port)], port) as sb,
    ):
        results["direct"] = await measure("direct", port, sb.pid, messages, idle)
        async with ingress_on(port) as url:
            ingress_port = int(url.rstrip("/").rsplit(":", 1)[1])
            results["ingress"] = await measure("ingress", ingress_port, os.getpid(), messages, idle)
        nginx_port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(nginx_conf(NGINX_CONF, tmp, upstream=port, port=nginx_port))
        nginx = ["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"]
        with process(nginx, nginx_port) as master:
            worker = first_child(master.pid)
            results["nginx"] = await measure("nginx", nginx_port, worker, messages, idle)
    row = "{:<9} {:>12} {:>12} {:>14} {:>20}"
    print()
    print(row.format("path", "rtt p50 ms", "rtt p99 ms", "32 conns msg/s", "RSS per idle WS (KiB)"))
    for name, r in results.items():
        print(
            row.format(
                name,
                f"{r['p50'] * 1e3:.3f}",
                f"{r['p99'] * 1e3:.3f}",
                f"{r['rate']:,.0f}",
                f"{r['per_conn'] / 1024:.1f}" if name != "direct" else "(the sandbox's)",
            )
        )
    ing, ngx, direct = results["ingress"], results["nginx"], results["direct"]
    print()
    print(
        f"ingress adds {(ing['p50'] - direct['p50']) * 1e3:.3f} ms at p50 per round trip "
        f"(nginx {(ngx['p50'] - direct['p50']) * 1e3:.3f} ms); "
        f"echo rate {ing['rate'] / ngx['rate']:.2f}x nginx's"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--idle", type=int, default=5000)
    parser.add_argument("--sandbox", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sandbox:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2
        )
        asyncio.run(sandbox(args.sandbox))
    elif args.client:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2
        )
        asyncio.run(client(args.client, args.messages, args.idle))
    else:
        import uvloop

        uvloop.run(main(args.messages, args.idle))
