"""Benchmark one sandbox start on its own: `ProcessRuntime.start` to the app's first accepted
TCP connection, for each way a node starts a sandbox, against the app spawned directly.

    direct          `python3 app.py` (examples/hello), spawned by this process
    unisolated      ProcessRuntime() (`--isolation=none`: the parent-death-signal wrapper only)
    cold join       isolated; the chain joins the sandbox's cgroups itself (warm_slots=0)
    warm slot       isolated; a warm slot already in its cgroups takes the start (warm_slots=1)

Samples of the four kinds alternate, so all see the same machine. The app's directory is a
fresh copy per start (as a node unpacks one). Needs bubblewrap; the last two need root (cgroups);
without root they are skipped. Figures only, no assertions. From the repository root:

    .venv/bin/python -m bench.spawn [--runs 15]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.spawn")

import argparse
import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from bench.coldstart import APP_PYTHON, HELLO, pct
from wakeful.domain.models import Resources
from wakeful.node.jail.detect import detect_jail
from wakeful.node.jail.uids import UidTable
from wakeful.node.sandbox.local import ProcessRuntime
from wakeful.node.sandbox.runtime import Identity
from wakeful.node.secrets import BASE_ENV
from wakeful.store.testing import free_port


async def accepted(port: int, exited: Callable[[], bool]) -> None:
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if exited():
                raise RuntimeError("the app exited before it listened") from None
            await asyncio.sleep(0.0005)
            continue
        writer.close()
        return


async def direct(data: Path) -> float:
    port = free_port()
    env = {**BASE_ENV, "PORT": str(port), "HOST": "127.0.0.1"}
    started = time.perf_counter()
    app = await asyncio.create_subprocess_exec(
        APP_PYTHON, "app.py", cwd=HELLO, env=env, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        await accepted(port, lambda: app.returncode is not None)
        return time.perf_counter() - started
    finally:
        app.kill()
        await app.wait()


def through(runtime: ProcessRuntime) -> Callable[[Path], Awaitable[float]]:
    async def once(data: Path) -> float:
        sandbox = f"bench-{uuid.uuid4().hex[:8]}"
        workdir = data / "sandboxes" / sandbox / "app"
        shutil.copytree(HELLO, workdir)
        port = free_port()
        env = {**BASE_ENV, "PORT": str(port), "HOST": "127.0.0.1"}
        started = time.perf_counter()
        process = await runtime.start(
            [APP_PYTHON, "app.py"],
            env,
            workdir,
            workdir.parent / "output.log",
            Identity(sandbox, "bench", Resources()),
        )
        pump = asyncio.create_task(process.pump())
        exited = asyncio.create_task(process.wait())
        try:
            await accepted(port, exited.done)
            return time.perf_counter() - started
        finally:
            await process.stop(5)
            await pump
            await exited

    return once


@contextlib.asynccontextmanager
async def kept_warm(runtime: ProcessRuntime) -> AsyncIterator[None]:
    task = asyncio.create_task(runtime.keep_warm())
    try:
        if runtime.slots is not None:
            await asyncio.wait_for(runtime.slots.filled(), 30)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def main(runs: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="wakeful-spawn-"))
    os.chmod(data, 0o700)
    kinds: dict[str, Callable[[Path], Awaitable[float]]] = {
        "direct": direct,
        "unisolated": through(ProcessRuntime()),
    }
    runtimes = []
    if shutil.which("bwrap") and os.geteuid() == 0:
        jail = detect_jail(data)
        uids = UidTable(data / "uids.json", claims=data / "claims")
        cold = ProcessRuntime(jail=jail, uids=uids)
        homes = data / "sandboxes"
        warm = ProcessRuntime(jail=jail, uids=uids, warm_slots=1, slot_homes=homes)
        kinds["cold join"], kinds["warm slot"] = through(cold), through(warm)
        runtimes.append(warm)
        print(f"isolation: {jail.describe()}")
    else:
        print("isolated kinds skipped: they need bubblewrap and root")
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        async with contextlib.AsyncExitStack() as stack:
            for runtime in runtimes:
                await stack.enter_async_context(kept_warm(runtime))
            for _ in range(runs):
                for kind, once in kinds.items():
                    samples[kind].append(await once(data))
                    if runtimes and runtimes[0].slots is not None:
                        await asyncio.wait_for(runtimes[0].slots.filled(), 30)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    base = pct(samples["direct"], 0.5)
    print(f"\nstart -> first TCP accept, examples/hello, {runs} runs each (ms)")
    print(f"{'':14}{'p50':>8}{'p99':>8}{'p50 - direct':>14}")
    for kind, values in samples.items():
        p50, p99 = pct(values, 0.5) * 1000, pct(values, 0.99) * 1000
        print(f"{kind:14}{p50:8.1f}{p99:8.1f}{p50 - base * 1000:14.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    asyncio.run(main(parser.parse_args().runs))
