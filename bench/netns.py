"""Benchmark what a network namespace per sandbox (wakeful.node.jail.netns) adds: to a start,
and to every request (the pasta hop), against the same app in the host's namespace.

    host netns   bwrap + setpriv to a sandbox uid + `busybox httpd -p PORT`, a free host port
    own netns    `open_sandbox_net`, then the same chain entered into it, `httpd -p 80`,
                 reached through pasta's host port

Start: from "start" (the namespace's, or the app's in the host netns) to the first HTTP answer
through the port the ingress would dial (a TCP connect is not enough: pasta accepts before the
app listens). Samples alternate. Requests: sequential HTTP/1.0 GETs, one connection each
(httpd closes), then `wrk -t1 -c8` when installed; pasta's CPU time from /proc. Root, pasta,
bwrap, busybox. Figures only. From the repository root:

    .venv/bin/python -m bench.netns [--runs 30] [--requests 2000]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.netns")

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from bench.coldstart import pct
from bench.procfs import cpu_seconds
from wakeful.node.jail.netns import TUN, SandboxNet, open_sandbox_net
from wakeful.node.jail.uids import UID_BASE
from wakeful.store.testing import free_port

APP_UID = UID_BASE + 78_001
NET_UID = UID_BASE + 78_002
REQUEST = b"GET / HTTP/1.0\r\nHost: bench\r\n\r\n"


def chain(www: Path, port: int) -> list[str]:
    return [
        "bwrap",
        "--unshare-pid",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--bind",
        str(www),
        "/tmp",
        "--",
        "setpriv",
        f"--reuid={APP_UID}",
        f"--regid={APP_UID}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        "busybox",
        "httpd",
        "-f",
        "-p",
        str(port),
        "-h",
        "/tmp",
    ]


async def get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(REQUEST)
        return await reader.read()
    finally:
        writer.close()


async def answered(port: int, app: asyncio.subprocess.Process) -> None:
    while True:
        with contextlib.suppress(OSError):
            if (await get(port)).split(b"\r\n", 1)[0].endswith(b" 200 OK"):
                return
        if app.returncode is not None:
            raise RuntimeError("the app exited before it answered")
        await asyncio.sleep(0.0005)


@contextlib.asynccontextmanager
async def app_in_host(www: Path) -> AsyncIterator[int]:
    port = free_port()
    app = await asyncio.create_subprocess_exec(*chain(www, port))
    try:
        await answered(port, app)
        yield port
    finally:
        app.kill()
        await app.wait()


@contextlib.asynccontextmanager
async def app_in_netns(www: Path) -> AsyncIterator[tuple[int, SandboxNet]]:
    port = free_port()
    net = await open_sandbox_net(host="127.0.0.1", host_port=port, app_port=80, net_uid=NET_UID)
    try:
        app = await asyncio.create_subprocess_exec(*net.enter_prefix(), *chain(www, 80))
        try:
            await answered(port, app)
            yield port, net
        finally:
            app.kill()
            await app.wait()
    finally:
        await net.close()


async def starts(www: Path, runs: int) -> tuple[list[float], list[float], list[float]]:
    host, own, opened = [], [], []
    for _ in range(runs):
        started = time.perf_counter()
        async with app_in_host(www):
            host.append(time.perf_counter() - started)
        started = time.perf_counter()
        port = free_port()
        net = await open_sandbox_net(host="127.0.0.1", host_port=port, app_port=80, net_uid=NET_UID)
        opened.append(time.perf_counter() - started)
        try:
            app = await asyncio.create_subprocess_exec(*net.enter_prefix(), *chain(www, 80))
            await answered(port, app)
            own.append(time.perf_counter() - started)
            app.kill()
            await app.wait()
        finally:
            await net.close()
    return host, own, opened


async def sequential(port: int, count: int) -> list[float]:
    took = []
    for _ in range(count):
        started = time.perf_counter()
        await get(port)
        took.append(time.perf_counter() - started)
    return took


def wrk(port: int) -> str:
    if shutil.which("wrk") is None:
        return "wrk not installed (apt-get install wrk)"
    done = subprocess.run(
        ["wrk", "-t1", "-c8", "-d5s", "--latency", f"http://127.0.0.1:{port}/"],
        capture_output=True,
        text=True,
        check=False,
    )
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    p50 = re.search(r"50%\s+(\S+)", done.stdout)
    p99 = re.search(r"99%\s+(\S+)", done.stdout)
    if not (rate and p50 and p99):
        return f"wrk said: {done.stdout.strip()[-200:]}"
    return f"{float(rate[1]):8.0f} req/s   p50 {p50[1]:>8}  p99 {p99[1]:>8}"


def site(tmp: Path) -> Path:
    www = tmp / "www"
    www.mkdir(mode=0o755)
    (www / "index.html").write_text("hello\n")
    (www / "index.html").chmod(0o644)
    return www


def row(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{name:<34} p50 {pct(ms, 0.5):7.2f} ms   p95 {pct(ms, 0.95):7.2f} ms"


async def main(runs: int, requests: int) -> None:
    if os.geteuid() != 0:
        sys.exit("needs root (the sandbox uids, pasta as its own uid)")
    mode = stat.S_IMODE(TUN.stat().st_mode)
    if mode & 0o006 != 0o006:
        sys.exit(f"{TUN} is {mode:04o}: chmod 0666 {TUN} (as udev makes it)")
    with tempfile.TemporaryDirectory() as tmp:
        www = site(Path(tmp))
        host, own, opened = await starts(www, runs)
        print(f"start to first HTTP answer, {runs} runs each")
        print(row("  host netns (app alone)", host))
        print(row("  own netns (namespace + app)", own))
        print(row("    of which open_sandbox_net", opened))
        print(f"\n{requests} sequential requests, a connection each")
        async with app_in_host(www) as port:
            direct = await sequential(port, requests)
            direct_wrk = wrk(port)
        async with app_in_netns(www) as (port, net):
            before = cpu_seconds(net.pasta.pid)
            through = await sequential(port, requests)
            pasta_cpu = cpu_seconds(net.pasta.pid) - before
            through_wrk = wrk(port)
        print(row("  host netns", direct))
        print(row("  own netns (pasta)", through))
        print(f"  pasta CPU: {pasta_cpu * 1e6 / requests:.0f} us per request")
        print("\nwrk -t1 -c8 -d5s")
        print(f"  host netns        {direct_wrk}")
        print(f"  own netns (pasta) {through_wrk}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.requests))
