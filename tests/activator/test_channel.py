"""The lease channel (activator/channel.py) and its client (`ChannelLeases`), over a real
WebSocket through uvicorn: calls in flight together, a cancelled or abandoned acquire that
leaves no waiter and no lease behind, a lost channel, and frames that are not the protocol."""

from __future__ import annotations

import json
import random
import socket
import time

import anyio
import pytest
import websockets
import websockets.asyncio.client
import websockets.asyncio.server

from tests.support.activator import (
    TOKEN,
    Leading,
    Served,
    answered_alone,
    nothing_routable,
    serve_activator,
    set_status,
)
from tests.support.waiting import eventually
from wakeful.activator import channel, operations
from wakeful.activator.channel import MAX_OPS_PER_FRAME, PATH
from wakeful.activator.client import ChannelLeases
from wakeful.activator.client.channel import report_chunks
from wakeful.domain.leases import (
    CHANNEL_MAX_FRAME_BYTES,
    LeaseGone,
    LeaseGrant,
    Riders,
    Unauthorized,
    UnknownApp,
    Unreachable,
)
from wakeful.domain.logbatch import MAX_PATH, access_chunks
from wakeful.domain.models import SandboxStatus
from wakeful.domain.traffic import BUCKETS, AppTraffic
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio


def waiters(api: Served) -> int:
    return api.activator.snapshot()[0].waiters


def leased(api: Served) -> int:
    return api.activator.snapshot()[0].leased


async def test_many_calls_in_flight_share_the_channel_and_every_lease_comes_back(
    api: Served,
) -> None:
    async with ChannelLeases(api.url, TOKEN) as leases:

        async def one() -> None:
            grant = await leases.acquire("hello")
            renewed = await leases.renew(grant.lease_id, used=True)
            assert renewed.lease_id == grant.lease_id
            await leases.release(grant.lease_id)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                for _ in range(300):
                    tasks.start_soon(one)
        assert leased(api) == 0
        with pytest.raises(LeaseGone):
            await leases.renew("never-granted")
        with pytest.raises(UnknownApp):
            await leases.acquire("nope")


async def test_requests_riding_an_acquire_are_counted_as_they_join_and_leave(
    api: Served,
) -> None:
    """Issue 42: an ingress's misses share an acquire; the activator counts the requests
    riding it (its demand), told over the channel as they join and leave (`ride`)."""
    await nothing_routable(api)
    riders = Riders(2)
    async with ChannelLeases(api.url, TOKEN) as leases, anyio.create_task_group() as tasks:
        tasks.start_soon(lambda: leases.acquire("hello", riders=riders))
        with anyio.fail_after(10):
            await eventually(lambda: waiters(api) == 2)  # as many as rode it when it went
            riders.change(3)
            await eventually(lambda: waiters(api) == 5)
            riders.change(-4)
            await eventually(lambda: waiters(api) == 1)
        tasks.cancel_scope.cancel()
    with anyio.fail_after(10):
        await eventually(lambda: waiters(api) == 0)


async def test_a_cancelled_acquire_leaves_no_waiter_and_a_later_grant_is_handed_back(
    api: Served,
) -> None:
    await nothing_routable(api)  # the clock stands still (ACTIVATION_TIMEOUT): it waits on
    async with ChannelLeases(api.url, TOKEN) as leases:
        with anyio.move_on_after(0.3):
            await leases.acquire("hello")
        with anyio.fail_after(10):
            await eventually(lambda: waiters(api) == 0)
        # The channel still serves, and nothing is leased: no grant went unheld.
        grant = await _when_routable(api, leases)
        assert leased(api) == grant.size
        await leases.release(grant.lease_id)
        assert leased(api) == 0


async def test_a_lost_channel_fails_the_calls_in_flight_and_drops_their_waiters(
    api: Served,
) -> None:
    await nothing_routable(api)
    leases = ChannelLeases(api.url, TOKEN)
    failed: list[BaseException] = []

    async def parked() -> None:
        try:
            await leases.acquire("hello")
        except Unreachable as exc:
            failed.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            for _ in range(3):
                tasks.start_soon(parked)
            await eventually(lambda: waiters(api) == 3)
            await leases.aclose()  # the channel goes; the calls on it fail at once
    assert len(failed) == 3
    with anyio.fail_after(10):
        await eventually(lambda: waiters(api) == 0)


async def test_a_new_channel_is_opened_after_the_last_one_was_lost(api: Served) -> None:
    async with ChannelLeases(api.url, TOKEN) as leases:
        grant = await leases.acquire("hello")
        link = leases._link
        assert link is not None
        await link.close()  # lost, as when the activator restarts
        renewed = await leases.renew(grant.lease_id)  # the lease outlived its channel
        assert renewed.lease_id == grant.lease_id and leases._link is not link
        await leases.release(grant.lease_id)


async def test_a_wrong_token_and_an_absent_activator_are_typed_errors(api: Served) -> None:
    async with ChannelLeases(api.url, "wrong") as leases:
        with pytest.raises(Unauthorized):
            await leases.acquire("hello")
    async with ChannelLeases(f"http://127.0.0.1:{free_port()}", TOKEN, failover=0) as leases:
        with pytest.raises(Unreachable) as refused:
            await leases.acquire("hello")
    assert refused.value.retry_after >= 1


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("not json", "invalid operation"),
        (b"\x00binary", "frames are JSON text"),
        ('[{"op": "shutdown"}]', "invalid operation"),
        (json.dumps([{"op": "é" * 100}]), "invalid operation"),  # a reason cut by bytes
        ('{"id": 1, "op": "release", "lease": "x"}', "invalid operation"),
        (json.dumps([{"op": "cancel", "of": 1}] * (MAX_OPS_PER_FRAME + 1)), "more than"),
    ],
    ids=["not-json", "binary", "unknown-op", "non-ascii", "not-a-list", "too-many"],
)
async def test_a_frame_that_is_not_the_protocol_closes_only_its_channel(
    api: Served, frame: str | bytes, reason: str
) -> None:
    url = api.url.replace("http", "ws", 1) + PATH
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with websockets.asyncio.client.connect(url, additional_headers=headers) as hostile:
        await hostile.send(frame)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            with anyio.fail_after(10):
                await hostile.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1007 and reason in closed.value.rcvd.reason
    async with ChannelLeases(api.url, TOKEN) as leases:  # the activator serves on
        grant = await leases.acquire("hello")
        await leases.release(grant.lease_id)


async def _when_routable(api: Served, leases: ChannelLeases) -> LeaseGrant:
    await set_status(api.store, "sb-1", SandboxStatus.RUNNING)
    with anyio.fail_after(10):
        return await leases.acquire("hello")


async def test_callers_cancelled_at_any_moment_leave_nothing_leased(api: Served) -> None:
    """A caller cancelled in the very step its grant is read (its future cancelled, the answer
    in hand) once dropped the grant: the activator counted it until its TTL. Callers give up
    at scattered moments while the sandbox flaps, so grants come in bursts to parked callers;
    whatever was granted comes back."""
    rng = random.Random(7)
    async with ChannelLeases(api.url, TOKEN) as leases:
        stop = anyio.Event()

        async def flap() -> None:
            while not stop.is_set():
                for status in (SandboxStatus.BOOTING, SandboxStatus.RUNNING):
                    await set_status(api.store, "sb-1", status)
                    await anyio.sleep(rng.uniform(0, 0.03))

        async def caller() -> None:
            while not stop.is_set():
                grant = None
                with anyio.move_on_after(rng.uniform(0, 0.02)):
                    grant = await leases.acquire("hello")
                if grant is not None:
                    await anyio.sleep(rng.uniform(0, 0.005))
                    await leases.release(grant.lease_id)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(flap)
            for _ in range(100):
                tasks.start_soon(caller)
            await anyio.sleep(3)
            stop.set()
        await set_status(api.store, "sb-1", SandboxStatus.RUNNING)
        with anyio.fail_after(10):
            await eventually(lambda: leased(api) == 0 and waiters(api) == 0)


async def test_an_invalid_operation_is_answered_alone_and_its_neighbours_go_on(
    api: Served,
) -> None:
    """As a 422 over HTTP: one bad operation (a name the ingress would never send) once
    closed the channel, failing every call in flight on it."""
    url = api.url.replace("http", "ws", 1) + PATH
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with websockets.asyncio.client.connect(url, additional_headers=headers) as raw:
        frame = [
            {"id": 1, "op": "acquire", "app": "Bad_Name"},
            {"id": 2, "op": "acquire", "app": "hello", "requests": 3},
        ]
        await raw.send(json.dumps(frame))
        answers: dict[int, dict[str, object]] = {}
        with anyio.fail_after(10):
            while len(answers) < 2:
                answers |= {a["id"]: a for a in json.loads(await raw.recv())}
        assert answers[1]["error"] == "invalid request" and "0.acquire.app" in str(answers[1])
        assert "grant" in answers[2]
        await raw.send(
            json.dumps([{"id": 3, "op": "release", "lease": answers[2]["grant"]["lease_id"]}])
        )  # type: ignore[index]
        assert json.loads(await raw.recv()) == [{"id": 3, "released": True}]


async def test_acquires_past_the_bound_in_flight_are_refused_and_the_rest_still_wait(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One channel holds at most MAX_IN_FLIGHT acquires at once (10,000; 3 here, as a pool's
    1,000 waiters would refuse first): past it an acquire is answered at once, "no capacity"
    with a retry hint, and those already waiting are unharmed."""
    monkeypatch.setattr(channel, "MAX_IN_FLIGHT", 3)
    await nothing_routable(api)  # acquires wait: the clock stands still
    url = api.url.replace("http", "ws", 1) + PATH
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with websockets.asyncio.client.connect(url, additional_headers=headers) as raw:
        await raw.send(json.dumps([{"id": n, "op": "acquire", "app": "hello"} for n in range(5)]))
        with anyio.fail_after(10):
            refused = json.loads(await raw.recv())
            await eventually(lambda: waiters(api) == 3)
        assert {a["id"] for a in refused} == {3, 4}
        assert all(a["error"] == "no capacity" and a["retry_after"] == 1 for a in refused)
        await raw.send(json.dumps([{"id": 10 + n, "op": "cancel", "of": n} for n in range(3)]))
        answers: list[dict[str, object]] = []
        with anyio.fail_after(10):
            while len(answers) < 3:
                answers += json.loads(await raw.recv())
        assert sorted(a["id"] for a in answers) == [0, 1, 2]  # type: ignore[type-var]
        assert all(a["error"] == "cancelled" for a in answers)
    assert waiters(api) == 0


async def test_more_operations_at_once_than_a_frame_takes_all_get_answered(api: Served) -> None:
    """The ingress splits what queued up into frames of at most MAX_OPS_PER_FRAME: one frame
    past it closed the channel, failing every call on it."""
    async with ChannelLeases(api.url, TOKEN) as leases:
        grant = await leases.acquire("hello")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                for _ in range(MAX_OPS_PER_FRAME + 500):
                    tasks.start_soon(leases.renew, grant.lease_id)
        await leases.release(grant.lease_id)
    assert leased(api) == 0


async def test_an_ingress_that_stops_reading_then_drops_leaves_nothing_behind(
    api: Served,
) -> None:
    """Past MAX_UNSENT unread answers the channel stops reading; when the connection then
    dies, the channel must still end: its parked acquire leaves the waiters, its grants go
    back. (Its reader once waited for room for ever.)"""
    await nothing_routable(api)
    host, port = api.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    url = api.url.replace("http", "ws", 1) + PATH
    headers = {"Authorization": f"Bearer {TOKEN}"}
    raw = await websockets.asyncio.client.connect(
        url, sock=sock, additional_headers=headers, max_queue=1, compression=None
    )
    await raw.send(json.dumps([{"id": 0, "op": "acquire", "app": "hello"}]))
    with anyio.fail_after(10):
        await eventually(lambda: waiters(api) == 1)
    with anyio.move_on_after(5):  # renews of no lease: answers it never reads
        for frame in range(80):
            renews = [
                {"id": frame * 1000 + n + 1, "op": "renew", "lease": "x" * 200} for n in range(1000)
            ]
            await raw.send(json.dumps(renews))
    raw.transport.abort()
    with anyio.fail_after(10):
        await eventually(lambda: waiters(api) == 0)


async def test_callers_do_not_queue_behind_each_others_attempts_to_open_the_channel() -> None:
    """An activator that accepts connections and never answers: each call fails within its
    own deadline. (Each caller once took its turn at a 10 s open attempt, the fourth failing
    after 40 s.)"""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        async with ChannelLeases(
            f"http://127.0.0.1:{port}", TOKEN, timeout=1, failover=0
        ) as leases:
            failed: list[BaseException] = []

            async def call() -> None:
                try:
                    await leases.acquire("hello")
                except Unreachable as exc:
                    failed.append(exc)

            with anyio.fail_after(9):  # under the 10 s of one open attempt
                async with anyio.create_task_group() as tasks:
                    for _ in range(4):
                        tasks.start_soon(call)
    assert len(failed) == 4


async def test_an_activator_that_takes_over_adopts_the_leases_held_before_it_grants_any(
    api: Served,
) -> None:
    """Invariant 20: the leases an ingress holds keep their capacity on the activator that
    takes over (reported on its first channel there), and that one grants nothing until its
    adoption window ends: none is lost, none granted twice."""
    leading = Leading(api.url)
    async with ChannelLeases(api.url, TOKEN, locate=leading.locate) as leases:
        held = await leases.acquire("hello")
        async with serve_activator(api.store, adopt_for=3600) as heir:
            await leading.move_to(heir.url, leases)  # the leader is gone
            renewed = await leases.renew(held.lease_id)  # on the heir: adopted, not gone
            assert renewed.lease_id == held.lease_id
            assert leased(heir) == held.size
            granted: list[LeaseGrant] = []

            async def acquire() -> None:
                granted.append(await leases.acquire("hello"))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(acquire)
                await anyio.sleep(0.3)
                assert not granted  # the adoption window: nothing granted yet
                heir.activator.open_admission()
                with anyio.fail_after(10):
                    await eventually(lambda: bool(granted))
            assert leased(heir) == held.size + granted[0].size
            await leases.release(held.lease_id)
            await leases.release(granted[0].lease_id)
            assert leased(heir) == 0


async def test_a_lease_on_a_sandbox_that_is_gone_is_not_adopted(api: Served) -> None:
    leading = Leading(api.url)
    async with ChannelLeases(api.url, TOKEN, locate=leading.locate) as leases:
        held = await leases.acquire("hello")
        async with serve_activator(api.store) as heir:
            await set_status(api.store, "sb-1", SandboxStatus.STOPPED)
            await eventually(lambda: not heir.activator.snapshot()[0].ready)
            await leading.move_to(heir.url, leases)
            with pytest.raises(LeaseGone):
                await leases.renew(held.lease_id)
            assert leased(heir) == 0


async def test_an_activator_that_stops_leading_sends_its_parked_acquires_elsewhere(
    api: Served,
) -> None:
    """Deposed, it grants nothing more and closes its channels, so the ingress makes its
    acquires again on the new leader: they fail here as `Unreachable` (retried), never as an
    answer the ingress would pass on as a 503."""
    await nothing_routable(api)
    async with ChannelLeases(api.url, TOKEN, failover=0) as leases:
        failed: list[BaseException] = []

        async def parked() -> None:
            try:
                await leases.acquire("hello")
            except Exception as exc:
                failed.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(parked)
                await eventually(lambda: waiters(api) == 1)
                api.activator.stop_granting()
        assert len(failed) == 1 and isinstance(failed[0], Unreachable), failed
        assert "lost" in str(failed[0])
        with pytest.raises(Unreachable):  # a new channel here is closed at once too
            await leases.acquire("hello")
    assert waiters(api) == 0 and leased(api) == 0


async def test_held_leases_are_reported_at_once_when_the_channel_goes_not_at_the_next_call(
    api: Served,
) -> None:
    """An idle cached lease makes no call for a third of a lease TTL; the activator that took
    over must still count it within its adoption window: the client opens a new channel as
    soon as the old one is lost, and reports what it holds there."""
    leading = Leading(api.url)
    async with ChannelLeases(api.url, TOKEN, locate=leading.locate) as leases:
        held = await leases.acquire("hello")
        async with serve_activator(api.store, adopt_for=3600) as heir:
            await leading.move_to(
                heir.url, leases
            )  # the leader is gone; nothing is asked of the client after
            with anyio.fail_after(10):
                await eventually(lambda: leased(heir) == held.size)
            await leases.release(held.lease_id)


async def test_traffic_reports_reach_the_ring_and_bad_ones_are_answered_alone(
    api: Served,
) -> None:
    """What an ingress answered per app, beside its lease calls: counted for the apps the
    activator knows, and a report that is not the protocol is refused without closing the
    channel."""
    buckets = [0] * BUCKETS
    buckets[3] = 8  # 5-10 ms
    buckets[6] = 2  # 50-100 ms
    async with ChannelLeases(api.url, TOKEN) as leases:
        grant = await leases.acquire("hello")  # the channel is open: reports go on it
        leases.report(
            {
                "hello": AppTraffic(requests=10, errors=1, buckets=buckets),
                "unknown": AppTraffic(requests=5, buckets=[5] + [0] * (BUCKETS - 1)),
            }
        )

        def measured(app: str, what: str) -> list[float]:
            series = api.activator.traffic.series(app, time.time())
            return [value for value in series[what] if value is not None]

        with anyio.fail_after(10):
            await eventually(lambda: bool(measured("hello", "p99_ms")))
        assert measured("hello", "p50_ms") == [pytest.approx(8.12, abs=0.01)]  # 5/8 into 5-10
        assert 50 < measured("hello", "p99_ms")[0] <= 100
        assert measured("unknown", "p50_ms") == []
        await leases.release(grant.lease_id)
    good = {"requests": 1, "errors": 0, "buckets": [1] + [0] * (BUCKETS - 1)}
    answers = await answered_alone(
        api,
        [
            {"id": 1, "op": "traffic", "apps": {"hello": {**good, "buckets": [1]}}},
            {"id": 2, "op": "traffic", "apps": {"Bad_Name": good}},
            {"id": 3, "op": "traffic", "apps": {f"a{i}": good for i in range(1001)}},
            {"id": 4, "op": "traffic", "apps": {"hello": {**good, "requests": -1}}},
            {"id": 5, "op": "traffic", "apps": {"hello": good}},
        ],
    )
    assert answers[5] == {"id": 5, "recorded": 1}


async def test_a_report_of_many_apps_goes_in_frames_the_activator_takes(api: Served) -> None:
    """Frames are cut by size, not only by count: 5,000 apps' report in one batch would pass
    the activator's 1 MiB frame bound and close the channel, failing every call on it."""
    buckets = [1] + [0] * (BUCKETS - 1)
    report = {
        f"app-with-a-long-name-{i:05d}": AppTraffic(requests=1, buckets=buckets)
        for i in range(5000)
    }
    async with ChannelLeases(api.url, TOKEN) as leases:
        grant = await leases.acquire("hello")
        link = leases._link
        leases.report(report | {"hello": AppTraffic(requests=3, buckets=[3] + [0] * (BUCKETS - 1))})
        with anyio.fail_after(10):
            await eventually(lambda: api.activator.traffic.requests("hello") == 3)
        await leases.release(grant.lease_id)
        assert leases._link is link and link is not None and link.alive  # the same channel


def test_a_report_of_many_versions_is_cut_so_no_operation_nears_a_frame_s_bound() -> None:
    """Issue 39: each app's counts carry its versions' too; cut by counts, not apps, so that
    500 apps of 49 versions each (a split's 16 and 32 tags beside the active one) at the
    largest counts never make an operation the activator would refuse."""
    most = 1 << 40
    counts = {"requests": most, "errors": most, "buckets": [most] * BUCKETS}
    versions = {f"v{n}": counts for n in range(49)}
    report = {
        f"app-{i:05d}": AppTraffic.model_validate({**counts, "versions": versions})
        for i in range(500)
    }
    chunks = report_chunks(report)
    assert [app for chunk in chunks for app in chunk] == list(report)  # each once, in order
    for chunk in chunks:
        operation = {"id": 1, "op": "traffic", "apps": chunk}
        assert len(json.dumps(operation)) < CHANNEL_MAX_FRAME_BYTES / 4
        assert operations.Traffic.model_validate(operation)  # what the activator takes


async def test_access_lines_reach_the_sink_and_bad_ones_are_answered_alone(api: Served) -> None:
    """An ingress's access lines, beside its lease calls: given to the activator's sink for
    the apps it knows, a gRPC call's with its status (other lines without the field); a line
    that is not the protocol is refused without closing the channel, and nothing of its
    operation is written."""
    got: list[tuple[str, list[dict[str, object]]]] = []
    api.activator.access_sink = lambda ingress, lines: got.append((ingress, lines))
    line = {"ts": 1.0, "app": "hello", "method": "GET", "path": "/", "status": 200}
    line |= {"bytes": 2, "ms": 1.5}
    async with ChannelLeases(api.url, TOKEN) as leases:
        grant = await leases.acquire("hello")  # the channel is open: lines go on it
        call = {**line, "method": "POST", "path": "/a.B/C", "grpc_status": 14}
        assert leases.access("edge-1", [line, {**line, "app": "unknown"}, call])
        with anyio.fail_after(10):
            await eventually(lambda: bool(got))
        assert got[0][0] == "edge-1"
        assert [(g["app"], g["path"], g["sample"]) for g in got[0][1]] == [
            ("hello", "/", 1),
            ("hello", "/a.B/C", 1),
        ]
        assert "grpc_status" not in got[0][1][0] and got[0][1][1]["grpc_status"] == 14
        await leases.release(grant.lease_id)
    assert not ChannelLeases(api.url, TOKEN).access("edge-1", [line])  # no channel: kept
    got.clear()
    answers = await answered_alone(
        api,
        [
            {"id": 1, "op": "access", "ingress": "e", "lines": [{**line, "status": 42}]},
            {"id": 2, "op": "access", "ingress": "e", "lines": [{**line, "method": "G T"}]},
            {"id": 3, "op": "access", "ingress": "e", "lines": [{**line, "path": "/" * 3000}]},
            {"id": 4, "op": "access", "ingress": "e", "lines": [line] * 1001},
            {"id": 5, "op": "access", "ingress": "e", "lines": [{**line, "ts": 1e300}]},
            {"id": 6, "op": "access", "ingress": "e", "lines": [{**line, "grpc_status": 100}]},
            {"id": 7, "op": "access", "ingress": "e", "lines": [{**line, "grpc_status": -1}]},
            {"id": 8, "op": "access", "ingress": "e", "lines": [line, line]},
        ],
    )
    assert answers[8] == {"id": 8, "recorded": 2}
    assert [len(lines) for _, lines in got] == [2]


def test_access_lines_are_cut_so_no_operation_nears_a_frame_s_bound() -> None:
    longest = {"ts": 1.0, "app": "a" * 63, "version": "v" * 63, "sandbox": "s" * 128}
    longest |= {"method": "M" * 32, "path": "/" * MAX_PATH, "status": 999, "bytes": 1 << 50}
    longest |= {"ms": 1e9, "wake": "start", "id": "i" * 200, "sample": 1 << 30}
    longest |= {"grpc_status": 99}
    lines: list[dict[str, object]] = [dict(longest) for _ in range(5000)]
    chunks = access_chunks(lines)
    assert sum(len(chunk) for chunk in chunks) == 5000
    for chunk in chunks:
        operation = {"id": 1, "op": "access", "ingress": "e" * 128, "lines": chunk}
        assert len(json.dumps(operation)) < CHANNEL_MAX_FRAME_BYTES / 2
        assert operations.Access.model_validate(operation)  # what the activator takes


async def test_rides_an_ingress_would_never_send_keep_the_channel_and_the_count(
    api: Served,
) -> None:
    """Rides for unknown ids, a renew's id, counts below one and past the wire's bound: the
    channel goes on, the renew is answered, the count stays within bounds, a cancel still
    clears the waiter (a hostile review of issue 42)."""
    await nothing_routable(api)
    url = api.url.replace("http", "ws", 1) + PATH
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with websockets.asyncio.client.connect(url, additional_headers=headers) as raw:
        await raw.send(json.dumps([{"id": 1, "op": "acquire", "app": "hello", "requests": 2}]))
        with anyio.fail_after(10):
            await eventually(lambda: waiters(api) == 2)
        rides = [
            {"op": "ride", "of": 99, "by": 5},  # unknown
            {"op": "ride", "of": 1, "by": -1000},  # below one
            {"op": "ride", "of": 1, "by": 1000},  # to the wire's bound
            {"op": "ride", "of": 1, "by": -999},
            {"id": 2, "op": "renew", "lease": "nope", "used": False},
            {"op": "ride", "of": 2, "by": 7},  # a renew's id
            {"op": "ride", "of": 10**30, "by": 1},
        ]
        await raw.send(json.dumps(rides))
        with anyio.fail_after(10):
            answer = json.loads(await raw.recv())
        assert [a["id"] for a in answer] == [2]
        with anyio.fail_after(10):
            await eventually(lambda: waiters(api) == 1)  # 0, then 1000, then 1
        await raw.send(json.dumps([{"op": "cancel", "of": 1}]))
        with anyio.fail_after(10):
            answer = json.loads(await raw.recv())
            await eventually(lambda: waiters(api) == 0)
        assert answer[0]["id"] == 1
