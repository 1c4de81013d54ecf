"""Artifact garbage collection: stored artifacts no version references any more are deleted,
and so are image blobs no version's image needs (`wakeful.oci.ImageStore.remove_unreferenced`,
under the same grace period).

Versions (`versions/{app}/{version}`) reference artifacts, and stateful apps' records
(`states/{app}`) their latest state archive (kept in the same directory); versions go when
their app is deleted (`Deployer.delete`), an archive when a newer one supersedes it, and an
upload whose deploy (or release) never happened never gets a reference. The collector runs
after each app deletion and every `artifact_gc_interval` seconds in the control plane
(`wakeful.bootstrap.control_plane`), so an unreferenced artifact stays on disk at most
`grace` + one interval.

It never deletes an artifact that any version references, nor one uploaded or claimed by a
deploy (`LocalArtifacts.keep`) less than `grace` seconds ago: that is an upload in flight whose
version is not written yet. When some version record does not validate, what it references is
unknown, and the collector deletes nothing that round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.domain import keys
from wakeful.domain.models import AppState, Version
from wakeful.oci import ImageStore, referenced_blobs
from wakeful.store import Store, StoreError

log = logging.getLogger(__name__)

DEFAULT_GRACE = 600.0
"""Seconds an unreferenced artifact is kept after its upload (or a deploy's claim)."""
DEFAULT_INTERVAL = 60.0


class ArtifactCollector:
    def __init__(
        self,
        store: Store,
        artifacts: LocalArtifacts,
        *,
        grace: float = DEFAULT_GRACE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: the same wall clock as `artifacts`' (it wrote the upload times)."""
        self._store = store
        self._artifacts = artifacts
        self._grace = grace
        self._clock = clock
        self.images: ImageStore | None = None
        """The image store, whose blobs no version's image needs are collected too."""
        self._image_blobs: set[str] = set()

    async def collect(self) -> list[str]:
        """One pass; returns the digests it deleted. Raises `StoreError` when the versions
        cannot be listed (then nothing is deleted)."""
        referenced = await self._referenced()
        if referenced is None:
            return []
        before = self._clock() - self._grace
        removed = []
        for digest, touched in await self._artifacts.stored():
            if digest in referenced or touched >= before:
                continue
            if await self._artifacts.remove_idle(digest, before):
                removed.append(digest)
        if self.images is not None:
            removed += await self.images.remove_unreferenced(self._image_blobs, before)
        partials = await self._artifacts.remove_partials()
        if removed or partials:
            log.info(
                "deleted %d unreferenced artifact(s) and %d partial upload(s): %s",
                len(removed),
                partials,
                ", ".join(removed),
            )
        return removed

    async def _referenced(self) -> set[str | None] | None:
        """Every digest a version or a stateful app's record names; None when some record
        does not validate (what it names is unknown, so nothing may be deleted)."""
        versions = await self._store.list(keys.VERSIONS, Version)
        states = await self._store.list(keys.STATES, AppState)
        invalid = [*versions.invalid, *states.invalid]
        if invalid:
            log.warning(
                "not collecting artifacts: records %s do not validate, so what they reference "
                "is unknown",
                ", ".join(invalid),
            )
            return None
        self._image_blobs = referenced_blobs(
            item.value.image for item in versions.items if item.value.image is not None
        )
        referenced: set[str | None] = {item.value.artifact for item in versions.items}
        return referenced | {item.value.archive for item in states.items}

    async def collect_quietly(self) -> list[str]:
        """`collect`, with a store or disk failure logged: the next pass tries again."""
        try:
            return await self.collect()
        except (StoreError, OSError) as exc:
            log.warning("artifact collection failed, trying again later: %s", exc)
            return []

    async def run(self, interval: float = DEFAULT_INTERVAL) -> None:
        while True:
            await anyio.sleep(interval)
            await self.collect_quietly()
