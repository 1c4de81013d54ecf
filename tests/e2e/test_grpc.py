"""gRPC under `wakeful up`, with the shipped example (examples/grpc-greeter, built as a Python
stack image, `protocol = "h2c"`, `[health] grpc = true`) and grpcio's own client speaking h2c
to the ingress's plain listener: the first call wakes the app from zero; each of gRPC's four
call shapes passes through as it is sent (nothing buffered to the end); a deadline ends a call
on time; a cancelled call gives its capacity back; an open stream, even a silent one, keeps its
app awake, and once it ends the app goes to zero; an unknown host is a gRPC error, not a broken
connection; a call's status is in the ingress's metrics and in `wakeful logs --access`.

One `wakeful up` for the module: building the image is the slow part (a minute the first
time). The ingress here hands back a cached lease after 1 s without calls
(`WAKEFUL_LEASE_IDLE_TTL`, 30 s by default), so the pool's `leased` counts the calls in flight
within a second or two, not the lease the cache would otherwise keep for later calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import pytest

from tests.support import podman
from tests.support.up import Up, cli_async, eventually_pool, no_sandbox_left, start_up, stop_up

pytestmark = pytest.mark.anyio
GREETER = Path(__file__).resolve().parents[2] / "examples" / "grpc-greeter"
APP = "grpc-greeter"
DELAY = 5.0
"""The app's scale_down_delay (the smallest allowed)."""
LEASE_IDLE_TTL = 1.0
"""Seconds the ingress keeps a cached lease that carries no call (`WAKEFUL_LEASE_IDLE_TTL`)."""


def _load_greeter() -> tuple[Any, Any]:
    """The example's messages and stubs, from its greeter.proto (as client.py loads them)."""
    sys.path.insert(0, str(GREETER))
    try:
        loaded: tuple[Any, Any] = grpc.protos_and_services("greeter.proto")
        return loaded
    finally:
        sys.path.remove(str(GREETER))


protos, services = _load_greeter()


@pytest.fixture(scope="module")
def greeter_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """`wakeful up` of a copy of the example with a 5 s scale_down_delay: it builds the image
    (podman, the stack's base made by scripts/base-image) before it serves."""
    reason = podman.usable()
    if reason is not None:
        pytest.skip(reason)
    env = {
        **podman.env(),
        "WAKEFUL_BUILD_CACHE": str(tmp_path_factory.mktemp("build-cache")),
        "WAKEFUL_LEASE_IDLE_TTL": f"{LEASE_IDLE_TTL:g}",
    }
    done = subprocess.run(
        ["bash", str(podman.ROOT / "scripts" / "base-image"), "python"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    root = tmp_path_factory.mktemp("grpc")
    app = shutil.copytree(GREETER, root / APP)
    toml = (app / "wakeful.toml").read_text()
    assert 'scale_down_delay = "60s"' in toml
    (app / "wakeful.toml").write_text(toml.replace('"60s"', f'"{DELAY:g}s"'))
    up = start_up(root, app, within=600, env=env)
    try:
        yield up
    finally:
        stop_up(up)


@contextlib.asynccontextmanager
async def greeter(up: Up, host: str = f"{APP}.localhost") -> AsyncIterator[Any]:
    """A stub on a channel of its own to the ingress's plain listener (h2c), the app chosen
    by the call's authority."""
    target = up.proxy.removeprefix("http://")
    options = [("grpc.default_authority", host)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        yield services.GreeterStub(channel)


def hello(name: str, delay: float = 0.0) -> Any:
    return protos.HelloRequest(name=name, delay=delay)


async def in_flight(up: Up) -> float:
    """The ingress's calls of the app being proxied to a sandbox, from its /metrics."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{up.admin}/metrics")).text
    found = re.search(rf'^wakeful_ingress_requests_in_flight{{app="{APP}"}} (\S+)$', text, re.M)
    assert found is not None, "no in-flight gauge for the app in the ingress's /metrics"
    return float(found.group(1))


async def nothing_in_flight(up: Up, within: float) -> None:
    """No call of the app in flight at the ingress within `within` seconds."""
    async with asyncio.timeout(within):
        while True:
            if not await in_flight(up):
                return
            await asyncio.sleep(0.02)


async def at_zero(up: Up, within: float = 30) -> None:
    """The app deployed, at zero instances, and no sandbox process left."""
    async with asyncio.timeout(within):
        while True:
            pool = next((p for p in await up.pools() if p["app"] == APP), None)
            if pool is not None and pool["desired_instances"] == 0 and pool["live"] == 0:
                break
            await asyncio.sleep(0.1)
    await no_sandbox_left(up)


async def woken(stub: Any, name: str) -> tuple[Any, float]:
    """A SayHello that wakes the app: its reply and the seconds from the call to its answer.
    The answer's Server-Timing says it waited for a start (`wake;...;desc="start"`)."""
    started = time.monotonic()
    call = stub.SayHello(hello(name), timeout=60)
    reply = await call
    took = time.monotonic() - started
    timing = dict(await call.initial_metadata()).get("server-timing", "")
    assert re.search(r'wake;dur=[0-9.]+;desc="start"', timing), timing
    assert reply.message == f"hello {name}"
    assert reply.instance
    return reply, took


async def image_unpacked(up: Up, within: float = 120) -> None:
    """The node's image cache holds the app's image (the deploy's warming is done)."""
    async with httpx.AsyncClient(base_url=up.api) as client, asyncio.timeout(within):
        while True:
            answer = await client.get("/v1/nodes", headers={"Authorization": f"Bearer {up.token}"})
            answer.raise_for_status()
            if any((node.get("image_cache") or {}).get("images") for node in answer.json()):
                return
            await asyncio.sleep(0.2)


async def test_the_first_call_wakes_the_app_from_zero(greeter_up: Up) -> None:
    # The deploy's warming is let finish first: a boot longer than the app's 5 s
    # scale_down_delay (an unpack on a loaded machine) can see the sandbox scaled down as soon
    # as it is ready, before its first activity is written (the idle monitor counts from its
    # creation): a known gap, not this test's subject.
    await image_unpacked(greeter_up)
    await at_zero(greeter_up)
    async with greeter(greeter_up) as stub:
        _, took = await woken(stub, "cold")
    pool = await greeter_up.pool(APP)
    assert (pool["desired_instances"], pool["ready"]) == (1, 1), pool
    print(f"the first call answered in {took:.3f} s")
    assert took < 60, took


async def test_the_four_call_shapes_pass_through_as_sent(greeter_up: Up) -> None:
    async with greeter(greeter_up) as stub:
        unary = await stub.SayHello(hello("ann"), timeout=30)
        assert unary.message == "hello ann"

        # Server streaming: every message, in order, each as the sandbox sends it.
        started = time.monotonic()
        arrivals: list[tuple[str, float]] = []
        count = protos.CountRequest(count=5, interval=0.3)
        async for reply in stub.CountTo(count, timeout=30):
            arrivals.append((reply.message, time.monotonic() - started))
        assert [message for message, _ in arrivals] == ["1", "2", "3", "4", "5"]
        assert arrivals[-1][1] - arrivals[0][1] > 0.9, arrivals  # not all at once at the end

        # Client streaming: the sandbox reads all the client sent, then answers once.
        async def names() -> AsyncIterator[Any]:
            for name in ("ann", "bob", "cy"):
                yield hello(name)
                await asyncio.sleep(0.05)

        many = await stub.HelloAll(names(), timeout=30)
        assert many.message == "hello ann, bob, cy"

        # Bidirectional, in lockstep: each answer comes before the next message is sent,
        # so neither direction is held back for more.
        chat = stub.Chat(timeout=30)
        for name in ("ann", "bob", "cy", "di", "eve"):
            await chat.write(hello(name))
            async with asyncio.timeout(5):
                reply = await chat.read()
            assert reply.message == f"hello {name}"
        await chat.done_writing()
        assert await chat.read() == grpc.aio.EOF
        assert await chat.code() == grpc.StatusCode.OK


async def test_a_deadline_ends_the_call_on_time(greeter_up: Up) -> None:
    async with greeter(greeter_up) as stub:
        await stub.SayHello(hello("awake"), timeout=30)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.SayHello(hello("slow", delay=5), timeout=0.5)
        took = time.monotonic() - started
        assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, failed.value
        assert 0.4 < took < 1.5, took
        # The ingress let the call go with its client (the sandbox still sleeps on it).
        await nothing_in_flight(greeter_up, 1)
        again = await stub.SayHello(hello("after"), timeout=5)
        assert again.message == "hello after"


async def test_a_cancelled_stream_gives_its_lease_back(greeter_up: Up) -> None:
    async with greeter(greeter_up) as stub:
        long = protos.CountRequest(count=1000, interval=0.2)
        call = stub.CountTo(long, timeout=60)
        first = await call.read()
        assert first.message == "1"
        assert await in_flight(greeter_up) == 1
        pool = await greeter_up.pool(APP)
        assert int(pool["leased"]) >= 1, pool  # type: ignore[call-overload]
        assert call.cancel()
        assert await call.code() == grpc.StatusCode.CANCELLED
        cancelled = time.monotonic()
    # The ingress ends the call at once; its cached lease goes back once idle (1 s here),
    # while the sandbox still runs (not because it left). Had the call held on, the stream
    # had 200 s to run, and its lease with it.
    await nothing_in_flight(greeter_up, 1)
    await eventually_pool(
        greeter_up, lambda p: p["leased"] == 0 and p["ready"] == 1, LEASE_IDLE_TTL + 2, APP
    )
    print(f"the lease went back {time.monotonic() - cancelled:.3f} s after the cancel")


async def test_an_unknown_host_is_a_grpc_error(greeter_up: Up) -> None:
    async with greeter(greeter_up, "nope.localhost") as stub:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.SayHello(hello("anyone"), timeout=10)
    error = failed.value
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED, error  # the ingress's 404
    assert error.details() == "unknown host: no app is served at host 'nope.localhost'"
    assert any(key == "x-request-id" for key, _ in error.trailing_metadata())


async def test_an_open_stream_keeps_the_app_awake_and_its_end_lets_it_sleep(
    greeter_up: Up,
) -> None:
    async with greeter(greeter_up) as stub:
        chat = stub.Chat(timeout=120)
        await chat.write(hello("first"))
        first = await chat.read()
        # Silent for three scale-down delays: the idle monitor ticks every second meanwhile.
        await asyncio.sleep(3 * DELAY)
        pool = await greeter_up.pool(APP)
        assert (pool["desired_instances"], pool["ready"]) == (1, 1), pool
        assert int(pool["leased"]) >= 1, pool  # type: ignore[call-overload]
        await chat.write(hello("again"))
        again = await chat.read()
        assert (again.message, again.instance) == ("hello again", first.instance)
        await chat.done_writing()
        assert await chat.read() == grpc.aio.EOF
        assert await chat.code() == grpc.StatusCode.OK
    await eventually_pool(
        greeter_up, lambda p: p["desired_instances"] == 0 and p["live"] == 0, 30, APP
    )
    await no_sandbox_left(greeter_up)


async def test_a_wake_with_the_image_unpacked_answers_within_2_s(greeter_up: Up) -> None:
    await image_unpacked(greeter_up)
    await at_zero(greeter_up)
    async with greeter(greeter_up) as stub:
        _, took = await woken(stub, "again")
    print(f"a wake with the image unpacked answered in {took:.3f} s")
    assert took < 2, took


async def calls_by_code(up: Up) -> dict[str, float]:
    """The ingress's `wakeful_ingress_grpc_calls_total` of the app, by code (every worker's)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{up.admin}/metrics")).text
    counted: dict[str, float] = {}
    for labels, value in re.findall(
        r"^wakeful_ingress_grpc_calls_total\{(.*)\} (\S+)$", text, re.M
    ):
        if f'app="{APP}"' in labels:
            code = re.search(r'code="([^"]*)"', labels)
            assert code is not None, labels
            counted[code.group(1)] = counted.get(code.group(1), 0.0) + float(value)
    return counted


async def test_a_call_s_status_is_counted_and_in_wakeful_logs(greeter_up: Up) -> None:
    """An OK call and a failing one (the sandbox's UNIMPLEMENTED), each by its X-Request-Id:
    counted by code at the ingress, and `wakeful logs --access` shows each line's status, from
    the ingress through the activator and the log directory (`wakeful up` hands the lines over
    in-process: the lease channel's schema is tests/activator/test_channel.py's)."""
    run = f"grpc-{time.time_ns()}"
    before = await calls_by_code(greeter_up)
    target = greeter_up.proxy.removeprefix("http://")
    options = [("grpc.default_authority", f"{APP}.localhost")]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stub = services.GreeterStub(channel)
        await stub.SayHello(hello("logged"), timeout=60, metadata=[("x-request-id", f"{run}-ok")])
        missing = channel.unary_unary("/greeter.Greeter/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await missing(b"", timeout=30, metadata=[("x-request-id", f"{run}-missing")])
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED

    def added(after: dict[str, float]) -> list[float]:
        return [after.get(code, 0) - before.get(code, 0) for code in ("OK", "UNIMPLEMENTED")]

    deadline = time.monotonic() + 10  # counted as a call ends: a moment after its answer
    while True:
        after = await calls_by_code(greeter_up)
        if min(added(after)) >= 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert added(after) == [1, 1], (before, after)

    ids = {f"{run}-ok", f"{run}-missing"}
    args = ("logs", APP, "--access", "--since", "5m")
    async with asyncio.timeout(60):
        while True:
            done = await cli_async(greeter_up, *args, "--json")
            assert done.returncode == 0, done.stdout + done.stderr
            found = {r.get("id"): r for r in map(json.loads, done.stdout.splitlines())}
            if ids <= found.keys():
                break
            await asyncio.sleep(0.2)
    assert (found[f"{run}-ok"]["status"], found[f"{run}-ok"]["grpc_status"]) == (200, 0)
    assert (found[f"{run}-missing"]["status"], found[f"{run}-missing"]["grpc_status"]) == (200, 12)
    shown = (await cli_async(greeter_up, *args)).stdout
    [ok] = [line for line in shown.splitlines() if f"id={run}-ok" in line]
    [missing_line] = [line for line in shown.splitlines() if f"id={run}-missing" in line]
    assert " 200 " in ok and " grpc=OK " in ok, ok
    assert " grpc=UNIMPLEMENTED " in missing_line, missing_line
