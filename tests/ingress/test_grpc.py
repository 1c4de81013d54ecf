"""gRPC through the ingress: grpcio's client over h2c, the greeter of examples/grpc-greeter as
the sandbox (a real grpcio server process), its app declared `protocol = "h2c"`. The four call
shapes (a bidirectional call interleaved, so nothing may be read ahead); a status and its
message passed through in trailers; a deadline; a deadline spent waiting for a sandbox,
answered by the ingress in gRPC's terms; a cancelled call freeing its lease and stopping the
sandbox's work; the upstream bound counting streams; errors for gRPC clients; each call
counted and logged by the status it ended with."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import h2.errors
import httpx
import pytest

from tests.support.h2sandbox import H2Sandbox
from tests.support.ingress import Stack, sandbox_processes, stack
from tests.support.waiting import eventually
from wakeful.domain.models import AppSpec, Concurrency

pytestmark = pytest.mark.anyio

GREETER = Path(__file__).resolve().parents[2] / "examples" / "grpc-greeter"
sys.path.insert(0, str(GREETER))  # where grpc finds greeter.proto
protos, services = grpc.protos_and_services("greeter.proto")

H2C = {
    "spec": AppSpec(
        command=["serve"],
        protocol="h2c",
        concurrency=Concurrency(requests_per_instance=50, max_instances=20),
    )
}


@pytest.fixture
def greeter() -> Iterator[Callable[[], int]]:
    """Start greeter sandboxes; returns each one's port."""
    yield from sandbox_processes(GREETER / "server.py")


def channel(s: Stack, host: str = "hello.localhost") -> grpc.aio.Channel:
    """A channel to the ingress that names the app by its authority (the Host it routes)."""
    return grpc.aio.insecure_channel(
        "{}:{}".format(*s.ingress.address), options=[("grpc.default_authority", host)]
    )


def stub(ch: grpc.aio.Channel) -> Any:
    return services.GreeterStub(ch)


async def test_the_four_call_shapes_pass_through(greeter: Callable[[], int]) -> None:
    async with stack({"s1": greeter()}, pool_update=H2C) as s, channel(s) as ch:
        call = stub(ch)
        reply = await call.SayHello(protos.HelloRequest(name="ann"), timeout=10)
        assert reply.message == "hello ann"
        counted = [r.message async for r in call.CountTo(protos.CountRequest(count=5), timeout=10)]
        assert counted == ["1", "2", "3", "4", "5"]

        async def names() -> AsyncIterator[Any]:
            for name in ("a", "b", "c"):
                yield protos.HelloRequest(name=name)

        assert (await call.HelloAll(names(), timeout=10)).message == "hello a, b, c"
        chat = call.Chat(timeout=10)
        for name in ("x", "y", "z"):  # one out, its answer back, before the next goes
            await chat.write(protos.HelloRequest(name=name))
            assert (await chat.read()).message == f"hello {name}"
        await chat.done_writing()
        assert await chat.code() == grpc.StatusCode.OK
        assert s.sample("requests_total", app="hello", status_class="2xx") == 4


async def test_a_status_and_its_message_come_back_in_trailers(greeter: Callable[[], int]) -> None:
    async with stack({"s1": greeter()}, pool_update=H2C) as s, channel(s) as ch:
        missing = ch.unary_unary("/greeter.Greeter/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await missing(b"", timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED  # the sandbox's own
        assert "Method not found" in (raised.value.details() or "")


async def test_a_deadline_ends_the_call_and_its_lease(greeter: Callable[[], int]) -> None:
    async with stack({"s1": greeter()}, pool_update=H2C) as s, channel(s) as ch:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub(ch).SayHello(protos.HelloRequest(name="late", delay=5), timeout=0.5)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 3
        await eventually(lambda: s.sample("requests_in_flight", app="hello") == 0, 5)


async def _call_within_300ms(client: httpx.AsyncClient) -> httpx.Response:
    """An empty SayHello over h2c, its `grpc-timeout` 300 ms (a client's own deadline)."""
    return await client.post(
        "/greeter.Greeter/SayHello",
        content=b"\x00\x00\x00\x00\x00",
        headers={
            "host": "hello.localhost",
            "content-type": "application/grpc",
            "te": "trailers",
            "grpc-timeout": "300m",
        },
    )


async def test_a_deadline_spent_waiting_for_a_sandbox_is_answered_in_grpcs_terms() -> None:
    """The app's only sandbox is booting: the call waits for it, and its grpc-timeout ends the
    wait with DEADLINE_EXCEEDED from the ingress (a client without a deadline of its own)."""
    async with (
        stack({"s1": None}, pool_update=H2C, access_log=True) as s,
        httpx.AsyncClient(base_url=s.url, http1=False, http2=True, timeout=30) as client,
    ):
        started = time.monotonic()
        answer = await _call_within_300ms(client)
        assert time.monotonic() - started < 3
        assert answer.status_code == 200 and answer.content == b""
        assert answer.headers["grpc-status"] == "4"  # DEADLINE_EXCEEDED
        assert "grpc-timeout" in answer.headers["grpc-message"]
        await eventually(lambda: s.sample("requests_queued", app="hello") == 0, 5)
        # Counted and logged by the code the ingress sent; the deadline was the client's own,
        # so the call counts as its giving up (499), never as the app's 5xx.
        await eventually(
            lambda: s.sample("grpc_calls_total", app="hello", code="DEADLINE_EXCEEDED") == 1, 5
        )
        [line] = s.ingress.access.take()
        assert (line["status"], line["grpc_status"]) == (499, 4)
        assert s.sample("requests_total", app="hello", status_class="4xx") == 1
        assert s.sample("requests_total", app="hello", status_class="5xx") == 0


async def test_a_deadline_that_passes_at_the_sandbox_counts_its_time_not_a_5xx() -> None:
    """The sandbox has the call and never answers: the call's own deadline is the client's
    bound (499, never the app's 5xx), but the time the sandbox held it is its upstream time,
    so a version that hangs its calls shows in the p99 a rollout's verdict compares."""

    def silent(conn: Any, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
        return None

    with H2Sandbox(silent) as sandbox:
        async with (
            stack({"s1": sandbox.port}, pool_update=H2C) as s,
            httpx.AsyncClient(base_url=s.url, http1=False, http2=True, timeout=30) as client,
        ):
            answer = await _call_within_300ms(client)
            assert answer.headers["grpc-status"] == "4"  # DEADLINE_EXCEEDED
            await eventually(lambda: s.sample("requests_in_flight", app="hello") == 0, 5)
            assert s.sample("requests_total", app="hello", status_class="4xx") == 1
            assert s.sample("requests_total", app="hello", status_class="5xx") == 0
            upstream = {"app": "hello", "phase": "upstream"}
            assert s.sample("request_phase_seconds_count", **upstream) == 1
            assert s.sample("request_phase_seconds_sum", **upstream) >= 0.25


async def test_a_cancelled_call_frees_its_lease_and_stops_the_sandbox(
    greeter: Callable[[], int],
) -> None:
    async with stack({"s1": greeter()}, pool_update=H2C) as s, channel(s) as ch:
        call = stub(ch).CountTo(protos.CountRequest(count=10_000, interval=0.01), timeout=30)
        assert (await call.read()).message == "1"
        assert s.sample("requests_in_flight", app="hello") == 1
        call.cancel()
        await eventually(lambda: s.sample("requests_in_flight", app="hello") == 0, 5)
        assert s.sample("requests_total", app="hello", status_class="4xx") == 1  # 499
        # The sandbox was told (RST_STREAM): its next call on the same connection is served.
        reply = await stub(ch).SayHello(protos.HelloRequest(name="again"), timeout=10)
        assert reply.message == "hello again"


async def test_the_upstream_bound_counts_streams(greeter: Callable[[], int]) -> None:
    async with (
        stack(
            {"s1": greeter()}, pool_update=H2C, upstream_connections_per_app=2, upstream_wait=0.3
        ) as s,
        channel(s) as ch,
    ):
        long = [
            stub(ch).CountTo(protos.CountRequest(count=1000, interval=0.05), timeout=30)
            for _ in range(2)
        ]
        for call in long:
            assert (await call.read()).message == "1"
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub(ch).SayHello(protos.HelloRequest(name="third"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "upstream busy" in (raised.value.details() or "")
        long[0].cancel()
        await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1, 5)
        reply = await stub(ch).SayHello(protos.HelloRequest(name="room"), timeout=10)
        assert reply.message == "hello room"
        long[1].cancel()
        await eventually(lambda: s.sample("requests_in_flight", app="hello") == 0, 5)


async def test_an_unknown_host_is_a_grpc_error_with_the_reason() -> None:
    async with stack(pool_update=H2C) as s, channel(s, "nope.localhost") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub(ch).SayHello(protos.HelloRequest(name="x"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert (
            raised.value.details() or ""
        ) == "unknown host: no app is served at host 'nope.localhost'"
        await anyio.lowlevel.checkpoint()


async def test_a_grpc_app_on_a_node_behind_nat_is_served_through_its_tunnel(
    greeter: Callable[[], int],
) -> None:
    """An h2c connection rides one of the node's tunnel streams, for as long as it lives;
    every call on it is a stream of that connection (`upstream.h2c` over `nodestreams`)."""
    from tests.ingress.test_nodestreams import tunnelled

    async with tunnelled({"sb-1": greeter()}, pool_update=H2C) as t:
        await eventually(lambda: t.client.reachable)
        async with channel(t.s) as ch:
            call = stub(ch)
            for name in ("a", "b", "c"):
                reply = await call.SayHello(protos.HelloRequest(name=name), timeout=10)
                assert reply.message == f"hello {name}"
            chat = call.Chat(timeout=10)
            for name in ("x", "y"):
                await chat.write(protos.HelloRequest(name=name))
                assert (await chat.read()).message == f"hello {name}"
            await chat.done_writing()
            assert await chat.code() == grpc.StatusCode.OK
            counted = call.CountTo(protos.CountRequest(count=1000, interval=0.01), timeout=10)
            assert (await counted.read()).message == "1"
            counted.cancel()
            await eventually(lambda: t.s.sample("requests_in_flight", app="hello") == 0, 5)


async def test_calls_to_a_waking_app_wait_for_it_and_are_all_answered(
    greeter: Callable[[], int],
) -> None:
    """Seeds 000 and 001 for streams: twenty calls on one connection to an app whose sandbox
    is booting are twenty queued requests (counted as queued, not in flight), and each is
    answered once it is ready."""
    port = greeter()
    async with stack({"s1": None}, pool_update=H2C) as s, channel(s) as ch:
        calls = [stub(ch).SayHello(protos.HelloRequest(name=str(i)), timeout=20) for i in range(20)]
        waiting = asyncio.gather(*calls)
        await eventually(lambda: s.sample("requests_queued", app="hello") == 20, 10)
        assert s.sample("requests_in_flight", app="hello") == 0
        await s.put_sandbox("s1", port)
        replies = await waiting
        assert sorted(r.message for r in replies) == sorted(f"hello {i}" for i in range(20))
        await eventually(lambda: s.sample("requests_queued", app="hello") == 0, 5)


def calls(s: Stack) -> dict[tuple[str, str], float]:
    """The ingress's `wakeful_ingress_grpc_calls_total`, by (app, code)."""
    return {
        (sample.labels["app"], sample.labels["code"]): sample.value
        for family in s.registry.collect()
        if family.name == "wakeful_ingress_grpc_calls"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


async def test_each_call_is_counted_and_logged_by_the_status_it_ended_with(
    greeter: Callable[[], int],
) -> None:
    """A call answered 200 is OK or a failure by its grpc-status: in its trailers (a call
    that succeeded), in a trailers-only head (the sandbox's UNIMPLEMENTED), or CANCELLED for a
    client that left; the ingress's own error for an unknown host is counted under app '-'.
    A request that is not a call has neither a count nor the field."""
    async with stack({"s1": greeter()}, pool_update=H2C, access_log=True) as s:
        async with channel(s) as ch:
            reply = await stub(ch).SayHello(protos.HelloRequest(name="ann"), timeout=10)
            assert reply.message == "hello ann"
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await ch.unary_unary("/greeter.Greeter/NoSuchMethod")(b"", timeout=10)
            assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
            long = stub(ch).CountTo(protos.CountRequest(count=10_000, interval=0.01), timeout=30)
            assert (await long.read()).message == "1"
            long.cancel()
        async with channel(s, "nope.localhost") as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await stub(ch).SayHello(protos.HelloRequest(name="x"), timeout=10)
        plain = await s.client.get("/not-a-call")  # HTTP/1.1 to the grpcio server
        # A client can have its answer a moment before the ingress counts and logs it.
        await eventually(lambda: s.ingress.access.counts["kept"] == 4, 5)
        assert calls(s) == {
            ("hello", "OK"): 1,
            ("hello", "UNIMPLEMENTED"): 1,
            ("hello", "CANCELLED"): 1,
            ("-", "UNIMPLEMENTED"): 1,
        }
        lines = {str(line["path"]): line for line in s.ingress.access.take()}
    assert {path: line.get("grpc_status") for path, line in lines.items()} == {
        "/greeter.Greeter/SayHello": 0,
        "/greeter.Greeter/NoSuchMethod": 12,
        "/greeter.Greeter/CountTo": 1,
        "/not-a-call": None,
    }
    assert "grpc_status" not in lines["/not-a-call"]
    assert lines["/not-a-call"]["status"] == plain.status_code
    assert [lines[p]["status"] for p in lines if p.startswith("/greeter")] == [200, 200, 499]


@pytest.mark.parametrize(
    ("status", "code", "logged"),
    [
        (b"14", "UNAVAILABLE", (200, 14)),
        (b"42", "42", (200, 42)),  # a code gRPC does not name: by its number
        (None, "UNAVAILABLE", (502, 14)),  # no trailers: the sandbox reset the stream
        (b"", "UNAVAILABLE", (502, 14)),  # reset after a head saying OK: still cut off
    ],
)
async def test_a_status_in_trailers_after_a_message_is_counted_as_sent(
    status: bytes | None, code: str, logged: tuple[int, int]
) -> None:
    """A sandbox that answers a message, then a failure in its trailers: counted by its code,
    logged with it; one that breaks off after the message instead: the ingress cut its client
    off (502), counted UNAVAILABLE, whatever its head said (`grpc-status: 0` in a head that
    was not the end of the answer says nothing of how the call ended)."""

    def answer(conn: Any, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
        first = [(b":status", b"200"), (b"content-type", b"application/grpc")]
        if status == b"":
            first.append((b"grpc-status", b"0"))
        conn.send_headers(stream, first)
        conn.send_data(stream, b"\x00\x00\x00\x00\x02hi")
        if not status:
            conn.reset_stream(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)
            return
        conn.send_headers(
            stream, [(b"grpc-status", status), (b"grpc-message", b"later")], end_stream=True
        )

    with H2Sandbox(answer) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C, access_log=True) as s:
            async with channel(s) as ch:
                with pytest.raises(grpc.aio.AioRpcError):
                    await ch.unary_unary("/any.Service/Call")(b"", timeout=10)
            await eventually(lambda: calls(s) == {("hello", code): 1}, 5)
            [line] = s.ingress.access.take()
    assert (line["status"], line["grpc_status"]) == logged
