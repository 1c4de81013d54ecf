"""The control plane's image store: one OCI image layout (`<artifact dir>/images`) holding
every imported image's manifest, config and layers as blobs named by digest, which nodes
fetch as streams.

An import pins before it copies: it reads the manifest the reference names, takes its sha256
as the image's digest, picks the node platform's manifest from an index, and refuses (with
nothing copied) what `resolve.check` refuses. Only then does skopeo copy that manifest, by
digest, into the layout, under index.json's name `<hex of the digest>`; skopeo skips blobs
the layout has, so images sharing layers download them once. The record is read back from
what was stored (skopeo stores docker v2s2 as OCI, so `manifest` may differ from `digest`).

Imports and deletions hold one lock, an anyio lock within the process and an `fcntl` lock on
`.lock` across processes (two control planes may share the directory): skopeo rewrites
index.json, and a collector must never delete a blob between an import's copy and its touch.
Each blob's mtime is when an import last claimed it (`keep` would claim a record's blobs
again; a deploy imports, which claims them, instead); the collector
deletes what no record references only once that is older than its grace period. Files are
private: 0600 blobs in 0700 directories.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import anyio

from wakeful.domain.models import ImageRecord

from . import layout
from .archives import open_archive
from .errors import BlobMissing, ImageRefused, ImageStorageError, RegistryError
from .resolve import (
    DEFAULT_PLATFORM,
    MAX_CONFIG_BYTES,
    Index,
    Manifest,
    check,
    check_platform,
    digest_of,
    image_record,
    parse_manifest,
    parse_reference,
    pick,
)
from .scan import Budget, scan_layer
from .skopeo import Credentials, RegistryAccess, Skopeo

MAX_IMAGE_BYTES = 4 << 30
"""The default bound on an image's compressed size (`WAKEFUL_IMAGE_MAX_BYTES`)."""
PULL_TIMEOUT = 600.0
"""The default deadline of one import, in seconds (`WAKEFUL_IMAGE_PULL_TIMEOUT`)."""
ARCHIVES = ("oci-archive", "docker-archive")
CHUNK = 1 << 20


def referenced_blobs(records: Iterable[ImageRecord]) -> set[str]:
    """The blobs the records need: what `remove_unreferenced` must keep."""
    found: set[str] = set()
    for record in records:
        found.update((record.manifest, record.config_digest))
        found.update(layer.digest for layer in record.layers)
    return found


class ImageStore:
    """Images in an OCI image layout at `directory`.

    `access`: how registries are reached (TLS, the CA); `platform`: what nodes run
    (`os/arch[/variant]`); `max_image_bytes`: the bound on one image's blobs; `timeout`:
    seconds one import may take; `clock`: wall-clock seconds, written as blob mtimes."""

    def __init__(
        self,
        directory: Path,
        *,
        access: RegistryAccess | None = None,
        platform: str = DEFAULT_PLATFORM,
        max_image_bytes: int = MAX_IMAGE_BYTES,
        max_unpacked: int = MAX_IMAGE_BYTES,
        max_files: int = 500_000,
        timeout: float = PULL_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ":" in str(directory):
            raise ValueError(f"image store {directory}: skopeo cannot name a path with ':'")
        self.directory = directory
        self.platform = check_platform(platform)
        self.max_image_bytes = max_image_bytes
        self.max_unpacked = max_unpacked
        self.max_files = max_files
        """What one image may unpack to, in bytes and entries (the nodes' bounds)."""
        self._skopeo = Skopeo(access or RegistryAccess(), directory / ".tmp", timeout)
        self._timeout = timeout
        self._clock = clock
        self._lock = anyio.Lock()

    async def import_image(
        self, ref: str, *, archive: Path | None = None, credentials: Credentials | None = None
    ) -> ImageRecord:
        """Pin `ref` to a digest, copy its image into the store and return its record.

        `ref` is a registry reference, or `oci-archive:NAME` / `docker-archive:NAME` with
        `archive` the file it names (the caller resolved NAME in the app's directory).
        `credentials` are for the reference's registry. ImageRefused, RegistryError (its
        RegistryTimeout after `timeout` seconds), SkopeoMissing or ImageStorageError; a
        refused or failed import leaves at most blobs nothing references."""
        deadline = anyio.current_time() + self._timeout
        transport, _, _ = ref.partition(":")
        if transport in ARCHIVES:
            return await self._import_archive(ref, transport, archive, deadline)
        if archive is not None:
            raise ImageRefused(f"image {ref!r}: an archive must be named oci-archive:NAME")
        reference = parse_reference(ref)
        what = f"pulling {ref}"

        async def inspect(source: str) -> bytes:
            return await self._skopeo.inspect_raw(
                source,
                host=reference.host,
                domain=reference.domain,
                credentials=credentials,
                deadline=deadline,
                what=what,
            )

        raw = await inspect(reference.source())
        digest = digest_of(raw)
        if reference.digest is not None and digest != reference.digest:
            raise RegistryError(f"{what}: the registry answered a manifest of digest {digest}")
        found = parse_manifest(raw, ref)
        chosen = digest
        if isinstance(found, Index):
            chosen = pick(found, self.platform, ref).digest
            raw = await inspect(reference.pinned(chosen))
            if digest_of(raw) != chosen:
                raise RegistryError(f"{what}: manifest {chosen} does not match its digest")
            found = parse_manifest(raw, ref)
            if isinstance(found, Index):
                raise ImageRefused(f"image {ref}: its {self.platform} entry is another index")
        check(found, ref, self.max_image_bytes)
        async with self._locked():
            await self._copy(
                reference.pinned(chosen),
                digest,
                host=reference.host,
                domain=reference.domain,
                credentials=credentials,
                deadline=self._after_lock(deadline),
                what=what,
            )
            record = await self._stored(ref, digest)
        return await self._scanned(record)

    async def _import_archive(
        self, ref: str, transport: str, archive: Path | None, deadline: float
    ) -> ImageRecord:
        """An archive is read whole from local disk, so an index in it is resolved by skopeo
        (`--override-*`) and its platform manifest checked once stored."""
        if archive is None:
            raise ImageRefused(f"image {ref!r}: the archive it names was not given")
        what = f"reading {ref}"
        try:  # read by us, strictly: skopeo would unpack it following its links (`archives`)
            opened = await anyio.to_thread.run_sync(
                open_archive, archive, transport, self.directory / ".tmp", self.max_image_bytes
            )
        except ImageRefused as exc:
            raise ImageRefused(f"image {ref}: {exc}") from None
        except OSError as exc:
            raise ImageStorageError(f"image {ref}: cannot read the archive: {exc}") from None
        try:
            return await self._import_layout(ref, f"oci:{opened}", what, deadline)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(shutil.rmtree, opened, True)

    async def _import_layout(
        self, ref: str, source: str, what: str, deadline: float
    ) -> ImageRecord:
        """The image of an OCI layout `source` (an archive read by `open_archive`)."""
        raw = await self._skopeo.inspect_raw(source, host=None, deadline=deadline, what=what)
        digest = digest_of(raw)
        found = parse_manifest(raw, ref)
        extra: tuple[str, ...] = ()
        if isinstance(found, Index):
            pick(found, self.platform, ref)  # refuses an archive without the platform
            os_name, arch, *variant = self.platform.split("/")
            extra = (f"--override-os={os_name}", f"--override-arch={arch}")
            extra += tuple(f"--override-variant={part}" for part in variant)
        else:
            check(found, ref, self.max_image_bytes)
        async with self._locked():
            await self._copy(
                source,
                digest,
                host=None,
                extra=extra,
                deadline=self._after_lock(deadline),
                what=what,
            )
            record = await self._stored(ref, digest)
        return await self._scanned(record)

    async def add_blob(self, source: Path, digest: str) -> None:
        """An uploaded blob (the file `source`, its sha256 checked to be `digest`, on the
        store's file system) into the store, claimed now: the collector leaves it for its
        grace period, in which the deploy naming it imports it (`import_built`)."""
        async with self._locked():
            await anyio.to_thread.run_sync(
                layout.add_blob, self.directory, source, digest, self._clock()
            )

    async def missing(self, digests: Iterable[str]) -> list[str]:
        """Those of `digests` the store does not hold (what an upload must send); the ones it
        holds are claimed now, so the collector leaves them until the deploy that follows."""
        wanted = list(digests)
        async with self._locked():
            held = await anyio.to_thread.run_sync(
                layout.claim, self.directory, wanted, self._clock()
            )
        return [digest for digest in wanted if digest not in held]

    async def import_built(self, ref: str, manifest: str) -> ImageRecord:
        """The image whose manifest `manifest` and every blob it names were uploaded
        (`add_blob`): named in index.json and checked as a pulled image is. ImageRefused
        when a blob is missing (not uploaded, or collected since), is not the size the
        manifest says, or the image breaks a rule; then index.json no longer names it."""
        name = manifest.removeprefix("sha256:")

        def named() -> None:
            found, raw = layout.read_manifest(self.directory, manifest, ref)
            check(found, ref, self.max_image_bytes)
            for blob in (found.config, *found.layers):
                try:
                    size = self.blob_path(blob.digest).stat().st_size
                except FileNotFoundError:
                    raise ImageRefused(
                        f"image {ref}: blob {blob.digest} was not uploaded (deploy again to "
                        "send it)"
                    ) from None
                if size != blob.size:
                    raise ImageRefused(
                        f"image {ref}: blob {blob.digest} holds {size} bytes; its manifest "
                        f"says {blob.size}"
                    )
            layout.name_manifest(self.directory, name, manifest, len(raw))

        async with self._locked():
            try:
                await anyio.to_thread.run_sync(named)
            except BlobMissing:
                raise ImageRefused(
                    f"image {ref}: its manifest {manifest} was not uploaded (deploy again)"
                ) from None
            except OSError as exc:
                raise ImageStorageError(f"image {ref}: cannot store it: {exc}") from None
            try:
                record = await self._stored(ref, manifest)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(layout.unname_manifest, self.directory, name)
                raise
        try:
            return await self._scanned(record)
        except BaseException:
            with anyio.CancelScope(shield=True):
                async with self._locked():
                    await anyio.to_thread.run_sync(layout.unname_manifest, self.directory, name)
            raise

    def _after_lock(self, deadline: float) -> float:
        """The copy's deadline: `timeout` from when the lock was taken, so that a deploy that
        waited behind another's long pull is not reported as a stalled registry."""
        return max(deadline, anyio.current_time() + self._timeout)

    async def _scanned(self, record: ImageRecord) -> ImageRecord:
        """`record`, once every layer's headers passed the rules a node applies before it
        unpacks (`scan`), outside the lock: a 4 GiB image's read holds up no other import.
        The blobs were claimed by `_stored` (the collector leaves them for the grace)."""
        budget = Budget(self.max_unpacked, self.max_files)

        def scan() -> None:
            for layer in record.layers:
                try:
                    scan_layer(self.blob_path(layer.digest), layer, budget)
                except ImageRefused as exc:
                    raise ImageRefused(f"image {record.ref} {exc}") from None

        try:
            await anyio.to_thread.run_sync(scan)
        except OSError as exc:
            raise ImageStorageError(f"image {record.ref}: cannot read it back: {exc}") from None
        return record

    async def _copy(
        self,
        source: str,
        digest: str,
        *,
        host: str | None,
        domain: str | None = None,
        credentials: Credentials | None = None,
        extra: tuple[str, ...] = (),
        deadline: float,
        what: str,
    ) -> None:
        """skopeo copies `source` into the layout as `<hex of digest>` (under the lock); what
        a failed or killed copy left half-written is deleted."""
        try:
            await self._skopeo.copy(
                source,
                f"oci:{self.directory}:{digest.removeprefix('sha256:')}",
                host=host,
                domain=domain,
                credentials=credentials,
                extra=extra,
                deadline=deadline,
                what=what,
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(layout.remove_debris, self.directory)
            raise

    async def _stored(self, ref: str, digest: str) -> ImageRecord:
        """The record of what the copy just stored, checked again (the stored manifest is
        the one nodes read), its blobs made private and claimed (under the lock)."""

        def read() -> tuple[str, Manifest, bytes]:
            manifest_digest = layout.tagged(self.directory, digest.removeprefix("sha256:"))
            if manifest_digest is None:
                raise ImageStorageError(f"image {ref}: skopeo stored no manifest for {digest}")
            manifest, _ = layout.read_manifest(self.directory, manifest_digest, ref)
            check(manifest, ref, self.max_image_bytes)
            stored = layout.sizes(self.directory, manifest.blobs)
            if stored > self.max_image_bytes:
                raise ImageRefused(
                    f"image {ref} takes {stored} bytes stored; the bound is "
                    f"{self.max_image_bytes} (WAKEFUL_IMAGE_MAX_BYTES)"
                )
            config = layout.read_blob(self.directory, manifest.config.digest, MAX_CONFIG_BYTES)
            layout.privatise(self.directory)
            return manifest_digest, manifest, config

        try:
            manifest_digest, manifest, config = await anyio.to_thread.run_sync(read)
        except OSError as exc:
            raise ImageStorageError(f"image {ref}: cannot read it back: {exc}") from None
        record = image_record(
            ref,
            digest=digest,
            manifest_digest=manifest_digest,
            manifest=manifest,
            config_raw=config,
            platform=self.platform,
        )
        now = self._clock()
        await anyio.to_thread.run_sync(
            layout.touch, self.directory, referenced_blobs([record]), now
        )
        return record

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        """The store's lock: this process's tasks, then other processes (`.lock`)."""
        async with self._lock:
            await anyio.to_thread.run_sync(layout.ensure, self.directory)
            fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        await anyio.sleep(0.05)  # another process imports or collects
                try:
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def blob_path(self, digest: str) -> Path:
        """The blob's file (to serve with sendfile); ValueError for a malformed digest."""
        return layout.blob_path(self.directory, digest)

    def has(self, digest: str) -> bool:
        try:
            return self.blob_path(digest).exists()
        except ValueError:
            return False

    async def chunks(self, digest: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        """The blob's bytes, `size` at a time, never held whole; BlobMissing if it is not
        stored. The reader checks the sha256 (the node does, against the record)."""
        try:
            handle = await anyio.open_file(self.blob_path(digest), "rb")
        except FileNotFoundError:
            raise BlobMissing(f"no blob {digest} in the image store") from None
        async with handle:
            while chunk := await handle.read(size):
                yield chunk

    async def keep(self, record: ImageRecord) -> bool:
        """Claim an image's blobs for a version about to be written: their grace period
        starts again. False if any is not stored (collected since its import)."""
        async with self._locked():
            return await anyio.to_thread.run_sync(
                layout.touch, self.directory, referenced_blobs([record]), self._clock()
            )

    async def stored(self) -> list[tuple[str, float]]:
        """Every stored blob's digest, with when it was last imported or claimed."""
        return await anyio.to_thread.run_sync(layout.scan, self.directory)

    async def remove_unreferenced(self, referenced: set[str], before: float) -> list[str]:
        """Delete the blobs not in `referenced` (see `referenced_blobs`) last claimed before
        `before`, and the index.json entries of deleted manifests; the deleted digests. A store
        no image was ever imported into is left unmade."""
        if not await anyio.Path(self.directory).exists():
            return []
        async with self._locked():
            return await anyio.to_thread.run_sync(layout.prune, self.directory, referenced, before)
