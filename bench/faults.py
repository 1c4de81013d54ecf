"""The fault suite (issue 13): faults injected into the multi-process mode on a real etcd while
a prober asks a warm app at a fixed rate; after each, a fresh cold app is asked to wake.

The cluster: three etcd members, two activators (one leads), two nodes, two ingresses behind
Debian's nginx as the load balancer, every piece a `wakeful` process of its own, restarted
after a fault as a supervisor would. The warm app (the sample app, `min_instances = 2`) is asked
through nginx at `--rate` requests per second all along. Each scenario:

1. `activator-sigterm`, `activator-sigkill`: the leading activator (a standby runs);
2. `etcd-sigkill`: every etcd member killed at once (the store gone, as when a single-member
   etcd dies), restarted after 5 s (2 s short); `etcd-member-sigkill`: the leading member of
   three, restarted after as long;
3. `ingress-sigkill`: one ingress replica (nginx sends the rest to the other);
4. `sandbox-sigkill`: one of the warm app's sandboxes; `node-sigkill`: a node agent (its
   sandboxes are replaced on the other node once its record expires);
5. `deploy-under-load`: a new version of the warm app rolled out;
6. `flood`: 10x the activator's waiter bound at once on a cold app whose sandboxes take 20
   requests at most (`hard_limit`; the admitted are served, the rest get 503 with
   Retry-After; the ingress's and activator's memory stay flat);
7. `aborted-downloads`: downloads of 256 KiB, a fifth of them cut off mid-body by the client.

For each it prints: requests the prober sent while it ran, the failed ones by kind, how long
until a cold app asked as the fault healed answered (`wake`), and what leaked: leases still
held or waiters still parked once traffic stopped for the lease idle TTL. At the end, the
cluster is stopped and any process left under its directory is reported.

From the repository root (needs `apt-get install etcd-server nginx`):

    python -m bench.faults [--short] [--only NAME ...] [--rate 50]

`--short` is what CI runs (`tests/e2e/test_faults.py`): every scenario once, smaller numbers.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.faults")

import argparse
import collections
import contextlib
import functools
import os
import resource
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx

from bench.cluster import (
    LEASE_IDLE_TTL,
    MAX_WAITERS,
    Cluster,
    Piece,
    cluster,
    leadership,
    leads,
    left_behind,
)
from wakeful.node.testing import sandbox_pids

FLOOD_CAP = 20
"""The flood's app's `concurrency.hard_limit`."""


# -- the prober -------------------------------------------------------------------------------


class Prober:
    """Asks the warm app through the load balancer at a fixed rate (open loop: a slow answer
    does not delay the next request), recording each outcome: an HTTP status, or
    `connect`, `reset`, `timeout`."""

    def __init__(self, proxy: str, rate: float) -> None:
        self.proxy = proxy
        self.rate = rate
        self.outcomes: list[str] = []

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        async with (
            httpx.AsyncClient(base_url=self.proxy, timeout=60, limits=limits) as client,
            anyio.create_task_group() as tasks,
        ):
            gap = 1 / self.rate
            next_at = time.monotonic()
            while True:
                tasks.start_soon(self._one, client)
                next_at += gap
                await anyio.sleep(max(0.0, next_at - time.monotonic()))

    async def _one(self, client: httpx.AsyncClient) -> None:
        try:
            answer = await client.get("/", headers={"Host": "warm.localhost"})
            outcome = str(answer.status_code)
        except httpx.ConnectError:
            outcome = "connect"
        except httpx.TimeoutException:
            outcome = "timeout"
        except httpx.HTTPError:
            outcome = "reset"
        self.outcomes.append(outcome)


# -- scenarios --------------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    requests: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    wake: float | None = None
    """Seconds from the fault healing until a cold app asked then answered 200."""
    leaked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    grown: float | None = None
    """MiB the ingresses' and activators' largest RSS grew by over the scenario (the flood)."""


async def wake(c: Cluster, app: str, within: float = 60.0) -> float | None:
    """Ask `app` (retrying as a client told Retry-After would) until it answers 200."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=c.proxy, timeout=60) as client:
        while time.monotonic() - started < within:
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get("/", headers={"Host": f"{app}.localhost"})
                if answer.status_code == 200:
                    return time.monotonic() - started
            await anyio.sleep(0.2)
    return None


async def settled(c: Cluster, apps: set[str], within: float) -> list[str]:
    """What of `apps` still holds a lease or a waiter after `within` seconds without traffic
    (empty when nothing leaked)."""
    deadline = time.monotonic() + within
    while True:
        pools = await anyio.to_thread.run_sync(c.pools)
        held = [
            f"{p['pool']}: {p['leased']} leased, {p['waiters']} waiting"
            for p in pools
            if p["app"] in apps and (p["leased"] or p["waiters"])
        ]
        if not held or time.monotonic() > deadline:
            return held
        await anyio.sleep(0.5)


async def restarted(piece: Piece) -> None:
    """As a supervisor would: the piece started again once it is gone."""
    await anyio.to_thread.run_sync(piece.start)


async def kill_leader(c: Cluster, signum: int) -> Callable[[], Awaitable[None]]:
    leader = await anyio.to_thread.run_sync(c.leader)
    assert leader is not None, "no activator leads"
    await anyio.to_thread.run_sync(leader.signal, signum)
    return lambda: restarted(leader)


async def kill_etcd(c: Cluster, outage: float) -> Callable[[], Awaitable[None]]:
    """Every member at once: the store is gone, as when a single-member etcd dies."""
    for member in c.etcd.members:
        member.kill()
    await anyio.sleep(outage)
    await anyio.to_thread.run_sync(c.etcd.start)

    async def nothing() -> None:
        return None

    return nothing


async def kill_etcd_member(c: Cluster, outage: float) -> Callable[[], Awaitable[None]]:
    """The member the others follow: the other two keep the quorum and elect another."""
    member = await anyio.to_thread.run_sync(c.etcd.leader)
    member.kill()
    await anyio.sleep(outage)
    await anyio.to_thread.run_sync(member.start)

    async def nothing() -> None:
        return None

    return nothing


async def kill_ingress(c: Cluster) -> Callable[[], Awaitable[None]]:
    await anyio.to_thread.run_sync(c.ingresses[0].signal, signal.SIGKILL)
    return lambda: restarted(c.ingresses[0])


async def kill_sandbox(c: Cluster) -> Callable[[], Awaitable[None]]:
    pids = sandbox_pids(c.root / "n1") or sandbox_pids(c.root / "n2")
    assert pids, "no sandbox runs"
    with contextlib.suppress(ProcessLookupError):
        os.kill(min(pids), signal.SIGKILL)  # the outermost process of one sandbox

    async def nothing() -> None:
        return None

    return nothing


async def kill_node(c: Cluster) -> Callable[[], Awaitable[None]]:
    node = c.nodes[0]
    await anyio.to_thread.run_sync(node.signal, signal.SIGKILL)
    return lambda: restarted(node)


async def deploy_new_version(c: Cluster) -> Callable[[], Awaitable[None]]:
    where = c.root / "apps" / "warm"
    (where / "VERSION").write_text(uuid.uuid4().hex)  # a new artifact: a new version
    await anyio.to_thread.run_sync(c.cli, "deploy", str(where))

    async def nothing() -> None:
        return None

    return nothing


async def run_scenario(
    c: Cluster,
    prober: Prober,
    name: str,
    fault: Callable[[], Awaitable[Callable[[], Awaitable[None]]]],
    after: float,
) -> Row:
    row = Row(name)
    cold = await anyio.to_thread.run_sync(c.cold_app)
    first = len(prober.outcomes)
    changes = leadership(c)
    heal = await fault()
    row.wake = await wake(c, cold)
    await anyio.sleep(after)
    await heal()
    outcomes = prober.outcomes[first:]
    row.requests = len(outcomes)
    row.failed = dict(collections.Counter(o for o in outcomes if o != "200"))
    row.leaked = await settled(c, {cold}, within=LEASE_IDLE_TTL + 10)
    leading = [
        piece.name
        for piece, url in zip(c.activators, c.activator_urls, strict=True)
        if await anyio.to_thread.run_sync(leads, url)
    ]
    if len(leading) != 1:  # none: nothing can wake; two: a split brain
        row.failed[f"activators leading: {len(leading)}"] = 1
    changed = leadership(c) - changes
    if changed:
        row.notes.append(", ".join(f"{k}: {v}" for k, v in sorted(changed.items())))
    if name in ("sandbox-sigkill", "node-sigkill"):
        nodes = (await anyio.to_thread.run_sync(c.admin, "GET", "/v1/nodes")).json()
        row.notes.append(
            "sandboxes by node after: " + ", ".join(f"{n['name']} {n['sandboxes']}" for n in nodes)
        )
    return row


async def flood(c: Cluster) -> Row:
    """10x the waiter bound at once on a cold app."""
    row = Row("flood")
    # The sample app holds a thread per connection and a sandbox runs at most 256 (the default
    # `limits.processes`): without a cap, the first sandbox up would be handed the whole flood
    # (overflow leases) and break. Its `hard_limit` keeps each below that; the rest waits.
    cold = await anyio.to_thread.run_sync(functools.partial(c.cold_app, hard_limit=FLOOD_CAP))
    pieces = [*c.ingresses, *c.activators]
    before = {p.name: c.rss_kib(p) for p in pieces if p.alive}
    statuses: list[str] = []
    answers: collections.Counter[str] = collections.Counter()
    retry_after = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal retry_after
        try:
            answer = await client.get("/", headers={"Host": f"{cold}.localhost"})
            statuses.append(str(answer.status_code))
            if answer.status_code == 503 and answer.headers.get("retry-after"):
                retry_after += 1
            elif answer.status_code != 200:  # a failure: what it said, for the row
                answers[f"{answer.status_code} {answer.text[:160]!r}"] += 1
        except httpx.HTTPError as exc:
            statuses.append(type(exc).__name__)

    limits = httpx.Limits(max_connections=2000)
    async with (
        httpx.AsyncClient(base_url=c.proxy, timeout=120, limits=limits) as client,
        anyio.create_task_group() as tasks,
    ):
        for _ in range(10 * MAX_WAITERS * 2):  # two ingresses, each its own acquires
            tasks.start_soon(one, client)
    after = {p.name: c.rss_kib(p) for p in pieces if p.alive}
    row.requests = len(statuses)
    row.failed = dict(collections.Counter(s for s in statuses if s not in ("200", "503")))
    shed = statuses.count("503")
    row.notes.append(
        f"{statuses.count('200')} served, {shed} shed ({retry_after} with Retry-After)"
    )
    row.grown = grown = max(after[n] - before[n] for n in after) / 1024
    row.notes.append(f"RSS grew by at most {grown:.1f} MiB")
    if shed != retry_after:
        row.failed["503 without Retry-After"] = shed - retry_after
    if row.failed:
        row.notes += [f"{n}x {answer}" for answer, n in answers.most_common(5)]
        row.notes.append(await anyio.to_thread.run_sync(said_on_failure, c, cold))
    row.leaked = await settled(c, {cold}, within=LEASE_IDLE_TTL + 10)
    return row


def said_on_failure(c: Cluster, app: str, lines: int = 20) -> str:
    """What nginx's error log, the ingresses' warnings and `app`'s own log said last: where a
    failed request's status came from, shown beside the row that counted it."""
    log = c.root / "nginx-error.log"
    said = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
    for piece in c.ingresses:
        warned = [line for line in piece.output if "WARNING" in line or "ERROR" in line]
        said += [f"{piece.name}: {line}" for line in warned[-lines:]]
    try:
        said += c.cli("logs", app).splitlines()[-lines:]
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        said.append(f"wakeful logs {app}: {exc}")
    return "said:\n" + "\n".join(said)


async def aborted_downloads(c: Cluster, count: int) -> Row:
    """`count` downloads of 256 KiB, every fifth cut off by its client after the head."""
    row = Row("aborted-downloads")
    results: list[str] = []
    gate = anyio.Semaphore(32)

    async def one(client: httpx.AsyncClient, number: int) -> None:
        async with gate:
            try:
                async with client.stream(
                    "GET", "/bytes?n=262144", headers={"Host": "warm.localhost"}
                ) as answer:
                    if number % 5 == 0:
                        results.append("aborted")
                        return  # leaving the block closes the connection mid-body
                    size = sum([len(chunk) async for chunk in answer.aiter_bytes()])
                    results.append(
                        "200"
                        if answer.status_code == 200 and size == 262144
                        else f"{answer.status_code}/{size}"
                    )
            except httpx.HTTPError as exc:
                results.append(type(exc).__name__)

    async with (
        httpx.AsyncClient(base_url=c.proxy, timeout=60) as client,
        anyio.create_task_group() as tasks,
    ):
        for number in range(count):
            tasks.start_soon(one, client, number)
    row.requests = len(results)
    row.failed = dict(collections.Counter(r for r in results if r not in ("200", "aborted")))
    row.notes.append(f"{results.count('aborted')} aborted by their clients")
    return row


async def main(short: bool, only: list[str], rate: float) -> list[Row]:
    after = 3.0 if short else 10.0
    outage = 2.0 if short else 5.0
    downloads = 500 if short else 10_000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="wakeful-faults-") as tmp:
        root = Path(tmp)
        with cluster(root) as c:
            prober = Prober(c.proxy, rate)
            scenarios: list[tuple[str, Callable[[], Awaitable[Row]]]] = [
                (
                    "activator-sigterm",
                    lambda: run_scenario(
                        c,
                        prober,
                        "activator-sigterm",
                        lambda: kill_leader(c, signal.SIGTERM),
                        after,
                    ),
                ),
                (
                    "activator-sigkill",
                    lambda: run_scenario(
                        c,
                        prober,
                        "activator-sigkill",
                        lambda: kill_leader(c, signal.SIGKILL),
                        after,
                    ),
                ),
                (
                    "etcd-sigkill",
                    lambda: run_scenario(
                        c, prober, "etcd-sigkill", lambda: kill_etcd(c, outage), after
                    ),
                ),
                (
                    "etcd-member-sigkill",
                    lambda: run_scenario(
                        c,
                        prober,
                        "etcd-member-sigkill",
                        lambda: kill_etcd_member(c, outage),
                        after,
                    ),
                ),
                (
                    "ingress-sigkill",
                    lambda: run_scenario(
                        c, prober, "ingress-sigkill", lambda: kill_ingress(c), after
                    ),
                ),
                (
                    "sandbox-sigkill",
                    lambda: run_scenario(
                        c, prober, "sandbox-sigkill", lambda: kill_sandbox(c), after
                    ),
                ),
                (
                    "node-sigkill",
                    lambda: run_scenario(
                        c, prober, "node-sigkill", lambda: kill_node(c), after + 5
                    ),
                ),
                (
                    "deploy-under-load",
                    lambda: run_scenario(
                        c, prober, "deploy-under-load", lambda: deploy_new_version(c), after
                    ),
                ),
            ]
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(prober.run)
                await anyio.sleep(2)  # warm: both ingresses hold a lease
                for name, run in scenarios:
                    if only and name not in only:
                        continue
                    print(f"  {name} ...", flush=True)
                    rows.append(await run())
                tasks.cancel_scope.cancel()
            if not only or "flood" in only:
                print("  flood ...", flush=True)
                rows.append(await flood(c))
            if not only or "aborted-downloads" in only:
                print("  aborted-downloads ...", flush=True)
                rows.append(await aborted_downloads(c, downloads))
            final = Row("after all (traffic stopped)")
            final.leaked = await settled(
                c, {str(p["app"]) for p in c.pools()}, within=LEASE_IDLE_TTL + 15
            )
            rows.append(final)
        left = left_behind(root)
        if left:
            rows[-1].leaked += [f"process left: {line}" for line in left]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return rows


def print_table(rows: list[Row]) -> None:
    print()
    print(f"{'scenario':<28} {'requests':>8}  {'failed':<28} {'wake s':>7}  leaked / notes")
    for row in rows:
        failed = " ".join(f"{k}x{v}" for k, v in sorted(row.failed.items())) or "-"
        woke = "-" if row.wake is None else f"{row.wake:.1f}"
        extra = "; ".join(row.leaked) or "nothing leaked"
        if row.notes:
            extra += " | " + "; ".join(row.notes)
        print(f"{row.scenario:<28} {row.requests:>8}  {failed:<28} {woke:>7}  {extra}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="each scenario once, smaller")
    parser.add_argument("--only", nargs="*", default=[], help="scenario names")
    parser.add_argument("--rate", type=float, default=50.0, help="prober requests per second")
    args = parser.parse_args()
    found = anyio.run(main, args.short, args.only, args.rate)
    print_table(found)
