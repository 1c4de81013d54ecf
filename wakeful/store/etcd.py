"""The production store: etcd v3 through `etcd3aio` (grpc.aio).

A thin adapter: every key lives under `namespace`; every single-key write is an etcd txn
comparing `mod_revision` (`create_revision == 0` for "absent"); the client library's
exceptions become `store.errors` here and nowhere else. A broken watch stream is re-opened
(`_watch_stream`, as etcd3aio's own watch would) from the revision after the last one it
delivered, so a watch survives an etcd restart without a gap; when etcd has compacted that
revision away, the watch yields `Resync`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
from etcd3aio import (
    Etcd3Client,
    EtcdConnectionError,
    EtcdError,
    EtcdPermissionDeniedError,
    EtcdTransientError,
)
from etcd3aio._protobuf import (
    Compare,
    RequestOp,
    WatchCreateRequest,
    WatchRequest,
    WatchResponse,
)
from etcd3aio.kv import KVService, prefix_range_end
from etcd3aio.watch import WatchService

from .base import Delete, Event, RawOp, RawPut, Require, Resync, StoreBase, WatchItem
from .errors import (
    Conflict,
    Forbidden,
    LeaseNotFound,
    StoreError,
    TLSConfigError,
    Unavailable,
)

_DELETE_EVENT = 1  # mvccpb.Event.EventType.DELETE
_WATCH_BACKOFF = 0.25  # seconds before the first re-open of a broken watch stream, doubling
log = logging.getLogger(__name__)


@contextlib.contextmanager
def _translated(operation: str) -> Iterator[None]:
    try:
        yield
    except (EtcdConnectionError, EtcdTransientError) as exc:
        raise Unavailable(f"etcd {operation}: {exc}") from exc
    except TimeoutError as exc:  # etcd3aio bounds each call and its retries with asyncio.timeout
        raise Unavailable(f"etcd {operation}: no answer in time") from exc
    except grpc.aio.AioRpcError as exc:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.NOT_FOUND and "lease" in details:
            raise LeaseNotFound(f"etcd {operation}: {details}") from exc
        raise StoreError(f"etcd {operation}: {exc.code().name} {details}") from exc
    except EtcdPermissionDeniedError as exc:  # the piece's role (`wakeful etcd-auth`)
        raise Forbidden(f"etcd {operation}: {exc}") from exc
    except EtcdError as exc:
        raise StoreError(f"etcd {operation}: {exc}") from exc


T = TypeVar("T")


async def _isolated(call: Awaitable[T]) -> T:
    """One etcd call, run in a task of its own and waited for. grpc raises CancelledErrors of
    its own making when a call is cancelled (its response runs in another task; a locally
    cancelled call raises a fresh one), and an anyio cancel scope does not recognise those as
    its own: a timeout around a call to an etcd member that just died let a CancelledError
    through, which ended an activator's election loop without a word. Waiting through a
    shield, a cancelled caller gets its own CancelledError, which its scope turns into the
    timeout it asked for; the abandoned call is cancelled and its outcome consumed."""
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(_consumed)
        raise


def _consumed(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _watch_stream(
    service: WatchService, create: WatchCreateRequest, max_backoff: float
) -> AsyncIterator[WatchResponse]:
    """etcd3aio's `WatchService.watch`, less its leak: a stream that etcd broke (UNAVAILABLE:
    etcd stopped) is re-opened from the revision after the last one delivered, as there, but
    each stream's requests come from `_requests`, which ends with its stream. etcd3aio's
    request generator waits on a future that nothing resolves, and grpc cancels the task that
    drives it only when the call is cancelled before it ends (`cancel()` of a finished call does
    nothing): each broken stream left that task pending for ever, and the garbage collector
    then said "Task was destroyed but it is pending!" and, closing the generator it was
    running, "aclose(): asynchronous generator is already running"."""
    backoff = _WATCH_BACKOFF
    while True:
        over = asyncio.Event()
        call = service._stub.Watch(
            _requests(WatchRequest(create_request=create), over),
            metadata=service._metadata or None,
        )
        try:
            async for response in call:
                if response.compact_revision > 0:
                    create.start_revision = response.compact_revision + 1
                elif response.header.revision > 0:
                    create.start_revision = response.header.revision + 1
                backoff = _WATCH_BACKOFF
                yield response
            return
        except grpc.aio.AioRpcError as exc:
            if not service._is_transient_error(exc):
                raise
            log.warning(
                "watch: transient error (%s), reconnecting in %.2f s", exc.code().name, backoff
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
        finally:
            call.cancel()
            over.set()  # the request generator ends, and grpc's task that drives it with it


async def _requests(request: WatchRequest, over: asyncio.Event) -> AsyncIterator[WatchRequest]:
    """A watch stream's requests: `request`, then nothing until the stream is `over`."""
    yield request
    await over.wait()


def _checked_namespace(namespace: str) -> str:
    if not namespace.startswith("/") or not namespace.endswith("/"):
        raise ValueError(f"namespace must start and end with '/', got {namespace!r}")
    return namespace


class EtcdStore(StoreBase):
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        namespace: str = "/wakeful/",
        timeout: float = 5.0,
        ca_cert: bytes | None = None,
        cert_key: bytes | None = None,
        cert_chain: bytes | None = None,
        tls_server_name: str | None = None,
        watch_max_backoff: float = 2.0,
        dns_name: str | None = None,
    ) -> None:
        """`dns_name` (`host:port`): dial it through grpc's DNS resolver instead of the
        addresses in `endpoints`, so a member that comes back at another address (a container
        restarted) is found again: etcd3aio itself dials fixed addresses only."""
        if (cert_key is None) != (cert_chain is None):  # grpc would abort the process
            raise TLSConfigError("a client certificate needs both its chain and its key")
        self._ns = _checked_namespace(namespace)
        self._timeout = timeout
        self._watch_max_backoff = watch_max_backoff
        self._owns_client = True
        self._client = Etcd3Client(
            list(endpoints),
            watch_max_reconnect_backoff_seconds=watch_max_backoff,
            tls_server_name=tls_server_name,
            ca_cert=ca_cert,
            cert_key=cert_key,
            cert_chain=cert_chain,
        )
        if dns_name is not None:
            manager = self._client._manager  # etcd3aio has no setting for the target
            manager.target = f"dns:///{dns_name}"
            # Re-resolve at most once a second when connections fail (grpc's default: 30 s).
            manager.grpc_options.append(("grpc.dns_min_time_between_resolutions_ms", 1000))

    async def connect(self) -> None:
        await self._client.connect()
        with _translated("connect"):
            await self._kv.get(self._ns, timeout=self._timeout)

    def view(self, namespace: str) -> EtcdStore:
        """This connected store under another namespace, over the same client (one grpc
        channel). The view never closes the client: `aclose()` on it does nothing, and the
        client closes with this store. Tests use it to give each test its own namespace on one
        connection that lives, with its event loop, for the whole session."""
        view = copy.copy(self)
        view._ns = _checked_namespace(namespace)
        view._owns_client = False
        return view

    @property
    def client(self) -> Etcd3Client:
        """The connected etcd client, for what the `Store` protocol does not cover (users and
        roles: `wakeful.store.etcd_auth`)."""
        return self._client

    @property
    def _kv(self) -> KVService:
        if self._client.kv is None:
            raise Unavailable("etcd client is closed")
        return self._client.kv

    async def _get(self, key: str) -> tuple[bytes, int] | None:
        with _translated("get"):
            response = await _isolated(self._kv.get(self._ns + key, timeout=self._timeout))
        if not response.kvs:
            return None
        found = response.kvs[0]
        return bytes(found.value), int(found.mod_revision)

    async def _list(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]:
        full = self._ns + prefix
        with _translated("list"):
            response = await _isolated(
                self._kv.get(full, range_end=prefix_range_end(full), timeout=self._timeout)
            )
        strip = len(self._ns)
        rows = [
            (bytes(kv.key).decode()[strip:], bytes(kv.value), int(kv.mod_revision))
            for kv in response.kvs
        ]
        return rows, int(response.header.revision)

    async def _commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]:
        compare = [self._compare(check) for check in require]
        success = [self._op(op) for op in ops]
        failure = [KVService.txn_op_get(self._ns + check.key) for check in require]
        with _translated("txn"):
            response = await _isolated(
                self._kv.txn(compare, success, failure, timeout=self._timeout)
            )
        if not response.succeeded:
            for check, result in zip(require, response.responses, strict=True):
                kvs = result.response_range.kvs
                current = int(kvs[0].mod_revision) if kvs else 0
                if current != check.revision:
                    raise Conflict(check.key, current, check.revision)
            raise StoreError("etcd txn failed although every requirement held")
        deleted = sum(
            int(result.response_delete_range.deleted)
            for result in response.responses
            if result.HasField("response_delete_range")
        )
        return int(response.header.revision), deleted

    def _compare(self, check: Require) -> Compare:
        key = (self._ns + check.key).encode()
        if check.revision == 0:
            return Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=0)
        return Compare(
            result=Compare.EQUAL, target=Compare.MOD, key=key, mod_revision=check.revision
        )

    def _op(self, op: RawOp) -> RequestOp:
        if isinstance(op, Delete):
            return KVService.txn_op_delete(self._ns + op.key)
        assert isinstance(op, RawPut)
        return KVService.txn_op_put(self._ns + op.key, op.data, lease=op.lease or 0)

    async def _watch(self, prefix: str, from_revision: int | None) -> AsyncIterator[WatchItem]:
        if self._client.watch is None:
            raise Unavailable("etcd client is closed")
        full = self._ns + prefix
        strip = len(self._ns)
        stream = _watch_stream(
            self._client.watch,
            WatchCreateRequest(
                key=full.encode(),
                range_end=prefix_range_end(full),
                start_revision=from_revision or 0,
            ),
            self._watch_max_backoff,
        )
        try:
            with _translated("watch"):
                async for response in stream:
                    if response.compact_revision > 0 or response.canceled:
                        reason = (
                            f"etcd compacted history up to {response.compact_revision}"
                            if response.compact_revision > 0
                            else f"etcd cancelled the watch: {response.cancel_reason}"
                        )
                        yield Resync(int(response.header.revision), reason)
                        return
                    for event in response.events:
                        kv = event.kv
                        key = bytes(kv.key).decode()[strip:]
                        if event.type == _DELETE_EVENT:
                            yield Event("delete", key, int(kv.mod_revision), None)
                        else:
                            yield Event("put", key, int(kv.mod_revision), bytes(kv.value))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def grant(self, ttl: int) -> int:
        if ttl < 1:
            raise ValueError(f"ttl must be >= 1 second, got {ttl}")
        assert self._client.lease is not None
        with _translated("lease grant"):
            response = await _isolated(self._client.lease.grant(ttl, timeout=self._timeout))
        return int(response.ID)

    async def keep_alive(self, lease: int) -> None:
        await _isolated(self._keep_alive(lease))

    async def _keep_alive(self, lease: int) -> None:
        assert self._client.lease is not None
        call = self._client.lease.keep_alive(lease)
        try:
            with _translated("lease keep-alive"):
                async for response in call:
                    if response.TTL <= 0:
                        raise LeaseNotFound(f"lease {lease} does not exist or has expired")
                    return
        finally:
            call.cancel()
            # Wait for the cancellation to complete here, on this loop: left pending, grpc
            # delivers it later, possibly to a loop that has closed since.
            with contextlib.suppress(Exception):
                await call.code()
        raise Unavailable(f"etcd closed the keep-alive stream for lease {lease}")

    async def revoke(self, lease: int) -> None:
        assert self._client.lease is not None
        with contextlib.suppress(LeaseNotFound), _translated("lease revoke"):
            await _isolated(self._client.lease.revoke(lease, timeout=self._timeout))

    async def compact(self, revision: int) -> None:
        with _translated("compact"):
            try:
                await _isolated(self._kv.compact(revision, physical=True, timeout=self._timeout))
            except grpc.aio.AioRpcError as exc:
                if "compacted" not in (exc.details() or ""):
                    raise

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()
