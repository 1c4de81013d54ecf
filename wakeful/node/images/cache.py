"""The node's cache of root filesystems: one unpacked, read-only tree per image and owner.

Theory of operation. `tree(image, owner)` returns `root/trees/<manifest hex>-<owner|any>`,
making it on a miss: the manifest, config and layer blobs are fetched and checked
(`blobs.Layout`), the manifest must list the layers the version pinned and every layer's
headers must pass the rules of `scan` (nothing is unpacked before all of them have), umoci
unpacks into `root/tmp/`, the walk of `unpack.settle` makes the tree safe and the owner's,
and only then is it renamed into `root/trees/`. A failure removes the temporary tree and
raises `ImageError` naming the image's ref; no half-made tree is ever under `trees/`.

Only one make per key runs: a second caller waits for the first (`_Flight`) and then finds
the tree, or gets the same error. If the maker is cancelled, a waiter makes it instead.

Bounded: the trees' bytes (their files, from the walk; a make reserves what its headers add
up to while it runs) stay within `max_cache_bytes`. Room is made by removing unused trees,
least recently used first (`eviction.to_evict`); a tree a sandbox holds (`acquire` until
`release`, or `using`) is never removed, and an image that does not fit beside the held ones
is refused. Blobs stay while a tree of their image does (another owner's tree of it needs no
fetch) and go with its last tree.

The cache starts empty: what a previous agent left under `root` is removed at first use, as
the agent clears its sandboxes (nothing of ours runs then, and a tree on disk is not trusted).
Only the event loop's task changes the bookkeeping; the blocking work runs in worker threads
or in umoci's process.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from wakeful.domain.models.images import ImageRecord
from wakeful.oci.scan import Budget, check_manifest, scan_layer

from .blobs import BlobSource, Layout, hex_of
from .errors import ImageError
from .eviction import Held, to_evict
from .layered import base_key, copy_tree, unpack_run
from .unpack import run_umoci, settle, umoci_path

log = logging.getLogger(__name__)

MAX_MANIFEST_BYTES = 4 << 20
"""A manifest or config blob is small (kilobytes): no more of one is fetched."""


def tree_key(image: ImageRecord, owner: int | None) -> str:
    return f"{hex_of(image.manifest)}-{'any' if owner is None else owner}"


@dataclass(frozen=True)
class CacheStats:
    """What `wakeful nodes` shows of a node's image cache."""

    images: int
    """Trees on disk (one per image and owner)."""
    bytes: int
    """Their files' bytes (what `max_cache_bytes` bounds)."""
    blob_bytes: int
    in_use: int
    hits: int
    """Calls served a tree that was there, or that another call was making."""
    misses: int
    """Makes started (a failed or cancelled one too)."""


@dataclass
class _Tree:
    key: str
    manifest: str
    path: Path
    size: int
    last_used: int
    pins: int = 0


@dataclass
class _Flight:
    """A make under way: the waiters' event, and its error once it failed."""

    manifest: str
    done: anyio.Event = field(default_factory=anyio.Event)
    error: ImageError | None = None


class ImageCache:
    def __init__(
        self,
        root: Path,
        blobs: BlobSource,
        *,
        max_bytes: int,
        max_unpacked: int,
        max_files: int,
        max_cache_bytes: int,
    ) -> None:
        """`max_bytes` bounds one blob, `max_unpacked` and `max_files` one image's files
        (from its layers' headers), `max_cache_bytes` all trees together."""
        self.root = root
        self._layout = Layout(root / "layout", blobs, max_bytes)
        self._max_unpacked = max_unpacked
        self._max_files = max_files
        self._max_cache_bytes = max_cache_bytes
        self._trees: dict[str, _Tree] = {}
        self._bases: dict[str, _Tree] = {}
        self._base_lock = anyio.Lock()
        """Trees of all an image's layers but the last (`layered`), keyed `base-<chain>`: the
        next version of a rebuilt app is made from one. Never handed to a sandbox."""
        self._flights: dict[str, _Flight] = {}
        self._blobs_of: dict[str, frozenset[str]] = {}
        """The blobs of each manifest with a tree or a make under way."""
        self._scanned: dict[tuple[str, str], tuple[int, int]] = {}
        """The bytes and entries of each layer blob kept whose headers passed `scan_layer`
        (a blob is checked against its digest as it is fetched: the same bytes pass again)."""
        self._reserved = 0
        self._tick = 0
        self._hits = self._misses = 0
        self._ready = False
        self._ready_lock = anyio.Lock()

    async def tree(self, image: ImageRecord, owner: int | None) -> Path:
        """The unpacked root filesystem of `image`, its image user's files `owner`'s (uid and
        gid) when given. Not held: `acquire` a tree a sandbox runs in."""
        return await self._get(image, owner, pin=False)

    async def acquire(self, image: ImageRecord, owner: int | None) -> Path:
        """`tree`, held until `release`: it is not evicted meanwhile."""
        return await self._get(image, owner, pin=True)

    def release(self, image: ImageRecord, owner: int | None) -> None:
        """Let go of a tree `acquire` gave; one not held is logged (a bookkeeping slip must
        not stop what releases a sandbox's other holdings)."""
        tree = self._trees.get(tree_key(image, owner))
        if tree is None or tree.pins == 0:
            log.error("the tree of %s for %s was released but is not held", image.ref, owner)
            return
        tree.pins -= 1
        tree.last_used = self._next_tick()

    @asynccontextmanager
    async def using(self, image: ImageRecord, owner: int | None) -> AsyncIterator[Path]:
        """The tree, held for the block."""
        path = await self.acquire(image, owner)
        try:
            yield path
        finally:
            self.release(image, owner)

    def stats(self) -> CacheStats:
        blobs = {digest for digests in self._blobs_of.values() for digest in digests}
        return CacheStats(
            images=len(self._trees),
            bytes=sum(tree.size for tree in [*self._trees.values(), *self._bases.values()]),
            blob_bytes=sum(self._layout.sizes.get(digest, 0) for digest in blobs),
            in_use=sum(1 for tree in self._trees.values() if tree.pins),
            hits=self._hits,
            misses=self._misses,
        )

    async def _get(self, image: ImageRecord, owner: int | None, *, pin: bool) -> Path:
        key = tree_key(image, owner)
        await self._prepare()
        while (tree := self._trees.get(key)) is None:
            flight = self._flights.get(key)
            if flight is None:  # held (when `pin`) before anything else may evict it
                return (await self._lead(image, owner, key, pin)).path
            await flight.done.wait()
            if flight.error is not None:
                raise ImageError(str(flight.error))
        else:
            self._hits += 1
        tree.last_used = self._next_tick()
        tree.pins += pin
        return tree.path

    async def _lead(self, image: ImageRecord, owner: int | None, key: str, pin: bool) -> _Tree:
        flight = self._flights[key] = _Flight(image.manifest)
        self._misses += 1
        digests = frozenset(
            [image.manifest, image.config_digest, *(x.digest for x in image.layers)]
        )
        self._blobs_of[image.manifest] = self._blobs_of.get(image.manifest, frozenset()) | digests
        try:
            tree = self._trees[key] = await self._make(image, owner, key)
            tree.last_used = self._next_tick()
            tree.pins += pin  # before the awaits below, where another make may make room
        except (ImageError, OSError) as exc:
            reason = exc if isinstance(exc, ImageError) else f"could not be unpacked here ({exc})"
            flight.error = ImageError(f"image {image.ref} {reason}")
            log.warning("cannot unpack an image: %s", flight.error)
            raise flight.error from exc
        finally:
            del self._flights[key]
            flight.done.set()
            with anyio.CancelScope(shield=True):
                await self._drop_unneeded_blobs()
        return tree

    async def _make(self, image: ImageRecord, owner: int | None, key: str) -> _Tree:
        umoci_path()  # before anything is fetched: a node without umoci says so at once
        manifest = await self._layout.ensure(image.manifest, limit=MAX_MANIFEST_BYTES)
        check_manifest(image, await anyio.Path(manifest).read_bytes())
        await self._layout.ensure(image.config_digest, limit=MAX_MANIFEST_BYTES)
        paths = [await self._layout.ensure(x.digest, x.size) for x in image.layers]
        await self._layout.name(image.manifest)
        budget = Budget(self._max_unpacked, self._max_files)
        for path, layer in zip(paths, image.layers, strict=True):
            counted = self._scanned.get((layer.digest, layer.media_type))
            if counted is not None:  # its headers passed before: its counts alone are added
                reason = budget.add(*counted)
                if reason is not None:
                    raise ImageError(f"layer {layer.digest}: {reason}")
                continue
            size, files = budget.size, budget.files
            await anyio.to_thread.run_sync(scan_layer, path, layer, budget)
            self._scanned[layer.digest, layer.media_type] = (
                budget.size - size,
                budget.files - files,
            )
        need = budget.size
        self._make_room(need)
        self._reserved += need
        temporary = self.root / "tmp" / f"{key}.{secrets.token_hex(4)}"
        try:
            await self._unpack(image, temporary)
            size = await anyio.to_thread.run_sync(settle, temporary, owner, image.config.user)
            target = self.root / "trees" / key
            await anyio.to_thread.run_sync(os.replace, temporary, target)
        finally:
            self._reserved -= need
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_remove, temporary)
        return _Tree(key, image.manifest, target, size, self._next_tick())

    async def _unpack(self, image: ImageRecord, temporary: Path) -> None:
        """umoci's unpack of `image` into `temporary`: from the base its layers but the last
        share with the images before it (`layered`), else every layer."""
        key = base_key(image)
        if key is None:
            await run_umoci(self._layout.path, hex_of(image.manifest), temporary)
            return
        config = await anyio.Path(self._layout.blob(image.config_digest)).read_bytes()
        base = await self._base(image, key, config)
        base.pins += 1  # not evicted while it is copied
        try:
            await copy_tree(base.path, temporary)
        finally:
            base.pins -= 1
        last = slice(len(image.layers) - 1, None)
        await unpack_run(
            image, last, temporary, blob=self._layout.blob, config=config, scratch=self._scratch()
        )

    async def _base(self, image: ImageRecord, key: str, config: bytes) -> _Tree:
        """The base tree of all `image`'s layers but the last, unpacked when there is none
        (its bytes counted and bounded with the trees'). One base is made at a time: two
        images sharing one may ask for it at once."""
        async with self._base_lock:
            found = self._bases.get(key)
            if found is None:
                found = await self._make_base(image, key, config)
        found.last_used = self._next_tick()
        return found

    async def _make_base(self, image: ImageRecord, key: str, config: bytes) -> _Tree:
        layers = image.layers[:-1]
        need = sum(self._scanned.get((x.digest, x.media_type), (x.size, 0))[0] for x in layers)
        self._make_room(need)
        self._reserved += need
        temporary = self.root / "tmp" / f"{key}.{secrets.token_hex(4)}"
        target = self.root / "bases" / key
        try:
            run = slice(0, len(layers))
            scratch = self._scratch()
            await unpack_run(
                image, run, temporary, blob=self._layout.blob, config=config, scratch=scratch
            )
            await anyio.to_thread.run_sync(os.replace, temporary, target)
        finally:
            self._reserved -= need
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_remove, temporary)
        base = self._bases[key] = _Tree(key, image.manifest, target, need, 0)
        return base

    def _scratch(self) -> Path:
        return self.root / "tmp" / f"scratch.{secrets.token_hex(4)}"

    def _make_room(self, need: int) -> None:
        """Remove the unused trees the eviction rule picks (no await: the choice and the
        bookkeeping are one step); each is renamed out of `trees/` at once and deleted later
        (`_drop_unneeded_blobs` runs after every make)."""
        every = [*self._trees.values(), *self._bases.values()]
        held = [Held(t.key, t.size, t.last_used, t.pins > 0) for t in every]
        used = sum(t.size for t in every) + self._reserved
        chosen = to_evict(held, used, need, self._max_cache_bytes)
        if chosen is None:
            in_use = sum(t.size for t in self._trees.values() if t.pins)
            raise ImageError(
                f"needs {need} bytes of the node's image cache, which holds at most "
                f"{self._max_cache_bytes} ({in_use} held by running sandboxes, "
                f"{self._reserved} by other unpacks)"
            )
        for key in chosen:
            tree = self._bases.pop(key) if key in self._bases else self._trees.pop(key)
            log.info("image cache: evicting %s (%d bytes)", key, tree.size)
            # One rename: a make of the same key may rename its tree here right after.
            tree.path.rename(self.root / "tmp" / f"evicted-{key}.{secrets.token_hex(4)}")

    async def _drop_unneeded_blobs(self) -> None:
        """Delete the evicted trees, and the blobs no tree or make needs (only those other
        kept manifests do not share)."""
        alive = {tree.manifest for tree in self._trees.values()}
        alive |= {flight.manifest for flight in self._flights.values()}
        gone = [manifest for manifest in self._blobs_of if manifest not in alive]
        if not gone:
            await anyio.to_thread.run_sync(_remove_evicted, self.root / "tmp")
            return
        kept = {d for m, digests in self._blobs_of.items() if m not in gone for d in digests}
        dropped = {d for m in gone for d in self._blobs_of.pop(m)} - kept
        await self._layout.unname(gone)
        await self._layout.remove(dropped)
        self._scanned = {key: n for key, n in self._scanned.items() if key[0] not in dropped}
        await anyio.to_thread.run_sync(_remove_evicted, self.root / "tmp")

    async def _prepare(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if not self._ready:
                await anyio.to_thread.run_sync(self._empty)
                self._ready = True

    def _empty(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in ("trees", "bases", "tmp"):
            shutil.rmtree(self.root / name, ignore_errors=True)
            (self.root / name).mkdir(mode=0o700)
        self._layout.prepare()

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick


def _remove(path: Path) -> None:
    if path.exists() or path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)


def _remove_evicted(tmp: Path) -> None:
    for leftover in tmp.glob("evicted-*"):
        shutil.rmtree(leftover, ignore_errors=True)
