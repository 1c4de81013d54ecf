"""Other nodes' addresses refused to this node's sandboxes.

The ingress dials a sandbox at its node's address, so every sandbox port of every node is
open to whoever can reach that address, other nodes' sandboxes included. `NFT_RULES` refuses a
sandbox uid this machine's own addresses; `PeerFence` keeps two nft sets (`peers4`, `peers6`)
equal to the addresses the other registered nodes advertise (`nodes/{name}`.address), from a
watch on `nodes/`, so a sandbox cannot reach another node's sandboxes either. Started by the
agent only where its network rules are installed (root, nftables).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
from anyio.abc import TaskStatus

from wakeful.domain import keys
from wakeful.domain.backoff import Backoff, Retries
from wakeful.domain.models import Node
from wakeful.store import Item, Store
from wakeful.store.reflector import reflect

from .network import control_names, fence_control, fence_peers, peer_addresses

log = logging.getLogger(__name__)
RETRY_FIRST, RETRY_MAX = 1.0, 30.0
"""Seconds before a failed fence is tried again, doubling."""


class PeerFence:
    def __init__(
        self,
        store: Store,
        own_name: str,
        apply: Callable[[Sequence[str]], str | None] = fence_peers,
        retry: tuple[float, float] = (RETRY_FIRST, RETRY_MAX),
    ) -> None:
        self._store = store
        self._own = keys.node(own_name)
        self._apply = apply
        self._retry = retry
        self._hosts: dict[str, str] = {}
        self._changed = anyio.Event()
        self._listed = False
        self.applied: list[str] | None = None
        """The addresses the sets hold, once a fence was applied."""

    def replace(self, items: list[Item[Node]], revision: int) -> None:
        self._hosts = {item.key: item.value.address for item in items if item.key != self._own}
        self._listed = True
        self._changed.set()

    def put(self, item: Item[Node]) -> None:
        if item.key != self._own and self._hosts.get(item.key) != item.value.address:
            self._hosts[item.key] = item.value.address
            self._changed.set()

    def delete(self, key: str, revision: int) -> None:
        if self._hosts.pop(key, None) is not None:
            self._changed.set()

    async def _follow(self) -> None:
        await reflect(self._store, keys.NODES, Node, self, what="peer fence")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow `nodes/` and re-fence on every change of an address, until cancelled;
        started (`task_status`) once the first listing is fenced, or could not be: the agent
        starts no sandbox before. A failure is logged and retried, never raised: the fence
        must not take the agent and its sandboxes down."""
        started = False
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._follow)
            retries = Retries(Backoff(*self._retry))
            while True:
                fenced = await self._fence()
                if not started and self._listed:  # the first listing, fenced or tried
                    started = True
                    task_status.started()
                if fenced:
                    retries.succeeded()
                    await self._changed.wait()
                else:
                    with anyio.move_on_after(retries.failed()):
                        await self._changed.wait()

    async def _fence(self) -> bool:
        """Apply the addresses known now; False when that failed (retry later)."""
        self._changed = anyio.Event()
        if not self._listed:
            return True
        hosts = sorted(set(self._hosts.values()))
        try:
            addresses = await anyio.to_thread.run_sync(peer_addresses, hosts)
            if addresses == self.applied:
                return True
            failed = await anyio.to_thread.run_sync(self._apply, addresses)
        except Exception as exc:
            failed = f"{type(exc).__name__}: {exc}"
        if failed is not None:
            log.warning("cannot refuse other nodes to sandboxes (retrying): %s", failed)
            return False
        self.applied = addresses
        log.info("other nodes refused to sandboxes: %s", ", ".join(addresses) or "none")
        return True


CONTROL_REFRESH = 10.0
"""Seconds between resolutions of the control plane's names (`ControlFence`)."""


class ControlFence:
    """Keeps the control sets (`control4`, `control6`) equal to the addresses the control
    plane's URLs (the store's, the activators') resolve to now. Installed once at start, a
    fence on an address goes stale when a name moves: a container restarted on a new address
    (etcd, an activator under docker-compose) was then open to sandboxes, etcd without
    authentication among them. Resolved at start and every `interval` seconds, and applied
    every pass (whoever replaced the sets meanwhile, they are ours again); a failure is logged
    and tried again at the next, never raised. A name that resolves to nothing keeps the
    addresses it had (a DNS failure must not open the fence), each name on its own."""

    def __init__(
        self,
        urls: Sequence[str],
        resolve: Callable[[Sequence[str]], dict[str, list[tuple[str, int]]]] = control_names,
        apply: Callable[[Sequence[tuple[str, int]]], str | None] = fence_control,
        interval: float = CONTROL_REFRESH,
    ) -> None:
        self._urls = tuple(urls)
        self._resolve = resolve
        self._apply = apply
        self._interval = interval
        self._names: dict[str, list[tuple[str, int]]] = {}
        self.applied: list[tuple[str, int]] | None = None
        """The endpoints the sets hold, once applied."""

    async def run(self) -> None:
        while True:
            await self.refresh()
            await anyio.sleep(self._interval)

    async def refresh(self) -> None:
        try:
            found = await anyio.to_thread.run_sync(self._resolve, self._urls)
            for name, endpoints in found.items():
                if endpoints or name not in self._names:
                    self._names[name] = endpoints
            wanted = sorted({e for endpoints in self._names.values() for e in endpoints})
            failed = await anyio.to_thread.run_sync(self._apply, wanted)
            if failed is not None:
                log.warning("cannot refresh the control plane's fence: %s", failed)
                return
            if wanted != self.applied:
                log.info("control plane refused to sandboxes: %s", wanted)
            self.applied = wanted
        except Exception as exc:  # logged, tried again at the next pass
            log.warning("cannot refresh the control plane's fence: %s", exc)
