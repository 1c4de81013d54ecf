"""Images in the control plane: the archives a CLI uploads for a deploy, the import of an
image into the blob store at deploy (`Images.resolve`), and its blobs served to nodes.

PUT /v1/images/archives          an image archive (`podman save`), streamed to disk; admin only
POST /v1/images/blobs/missing    which of the blobs named the store lacks; admin only
PUT /v1/images/blobs/{digest}    one blob of an image the CLI built, checked, into the store;
                                 admin only
GET /v1/blobs/{digest}           a blob of a stored image, streamed; nodes and admin

An archive is written to `incoming/` beside the image store as it arrives, never held in
memory, bounded by `max_bytes`, and named by its sha256: the deploy that follows names it
(`image_archive`), the import reads it with skopeo, and it is deleted then (or by the next
start's sweep, when no deploy came).

A built image arrives blob by blob: the CLI asks which of its blobs are `missing`, sends those
(each hashed as it arrives, refused unless it matches its digest, then claimed in the store so
the collector leaves it for the grace period), and deploys `built:APP` naming the manifest:
`import_built` checks it as a pulled image is checked. A rebuild that changed code alone sends
one layer, the config and the manifest.

A pull from a registry uses the login the control plane holds for the reference's registry
domain, when it holds one (`Logins`, `wakeful.secrets.registries.RegistryBook`): opened for
that import alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Protocol

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.requests import ClientDisconnect

from wakeful.deploy.appdir import BUILT
from wakeful.domain.models import BLOB_DIGEST, ImageRecord
from wakeful.oci import (
    BlobMissing,
    Credentials,
    ImageRefused,
    ImageStorageError,
    ImageStore,
    LoginUnusable,
    layout,
)
from wakeful.oci.resolve import parse_reference

UPLOAD_TIME = 900.0
"""Seconds one upload (an archive, a blob) may take in all: a client that sends a byte now and
then holds a slot no longer than that (408)."""
ARCHIVE_IDLE = 30.0
"""Seconds an archive upload may send nothing before it is refused (408)."""
_ARCHIVE = re.compile(r"^[0-9a-f]{64}$")
BLOB_UPLOADS = 4
"""Blob uploads received at once (past it, 503 + Retry-After)."""
MAX_WANTED = 256
"""Digests one `missing` question may name (an image has at most 128 layers)."""

BlobParam = Annotated[str, PathParam(pattern=BLOB_DIGEST, description="sha256:<hex>")]


class Logins(Protocol):
    """The registry logins the control plane holds."""

    async def credentials(self, domain: str) -> Credentials | None:
        """The login for the registry `domain` (`host[:port]`), or None; `LoginUnusable`."""
        ...


class Images:
    """What a deploy needs of images: archives received, references resolved and copied
    (with `logins`' credentials for the reference's registry, when it has some)."""

    def __init__(
        self,
        store: ImageStore,
        incoming: Path,
        max_bytes: int,
        logins: Logins | None = None,
        upload_time: float = UPLOAD_TIME,
    ) -> None:
        self.store = store
        self.incoming = incoming
        self.max_bytes = max_bytes
        self.logins = logins
        self.upload_time = upload_time
        self._receiving = 0

    def sweep(self) -> None:
        """Archives no deploy took (a CLI that stopped between its upload and its deploy), and
        what an import killed mid-way left in the store's workspace: at a leader's start, when
        no import of this control plane's runs."""
        shutil.rmtree(self.incoming, ignore_errors=True)
        shutil.rmtree(self.store.directory / ".tmp", ignore_errors=True)

    async def receive(self, request: Request) -> str:
        """The request's body, an image archive, written to `incoming/` while hashed."""
        partial, name = await self._spool(request, "image archive")
        try:
            await anyio.to_thread.run_sync(partial.replace, self.incoming / name)
            return name
        finally:
            await _forget(partial)

    async def receive_blob(self, request: Request, digest: str) -> None:
        """The request's body, one blob of an image the CLI built, into the store once its
        sha256 is `digest` (400 otherwise, nothing stored)."""
        if self._receiving >= BLOB_UPLOADS:
            raise HTTPException(
                503,
                {"error": "busy", "detail": f"{BLOB_UPLOADS} blob uploads are under way"},
                headers={"Retry-After": "1"},
            )
        self._receiving += 1
        try:
            partial, name = await self._spool(request, "blob")
            try:
                if f"sha256:{name}" != digest:
                    raise _bad(400, "digest mismatch", f"the body's sha256 is sha256:{name}")
                await self.store.add_blob(partial, digest)
            finally:
                await _forget(partial)
        finally:
            self._receiving -= 1

    async def import_local(self, ref: str, root: Path, manifest: str) -> ImageRecord:
        """The image `manifest` of the OCI layout `root` on this machine (one `wakeful up`
        built), its blobs copied into the store as an upload's are, then imported."""

        def wanted() -> list[str]:
            return [manifest, *layout.read_manifest(root, manifest, ref)[0].blobs]

        await anyio.to_thread.run_sync(
            lambda: self.incoming.mkdir(mode=0o700, parents=True, exist_ok=True)
        )
        for digest in await self.store.missing(await anyio.to_thread.run_sync(wanted)):
            copy = self.incoming / f"{digest.removeprefix('sha256:')}.copy"
            try:
                checked = await anyio.to_thread.run_sync(
                    _copy_checked, layout.blob_path(root, digest), copy
                )
                if checked != digest:
                    raise ImageRefused(f"image {ref}: blob {digest} does not match its digest")
                await self.store.add_blob(copy, digest)
            finally:
                await _forget(copy)
        return await self.store.import_built(ref, manifest)

    async def _spool(self, request: Request, what: str) -> tuple[Path, str]:
        """The body written to a file of `incoming/` (never held in memory, bounded by
        `max_bytes`) and the hex of its sha256; the caller moves or deletes the file."""
        await anyio.to_thread.run_sync(
            lambda: self.incoming.mkdir(mode=0o700, parents=True, exist_ok=True)
        )
        fd, name = await anyio.to_thread.run_sync(
            lambda: tempfile.mkstemp(dir=self.incoming, suffix=".part")
        )
        partial = Path(name)
        digest = hashlib.sha256()
        size = 0
        deadline = anyio.current_time() + self.upload_time
        try:
            with os.fdopen(fd, "wb") as file:
                body = aiter(request.stream())
                while True:
                    if anyio.current_time() > deadline:
                        raise _bad(408, "upload too slow", f"not done in {self.upload_time:g} s")
                    with anyio.move_on_after(ARCHIVE_IDLE) as idle:
                        try:
                            chunk = await anext(body, None)
                        except ClientDisconnect:  # nobody reads the answer: no traceback
                            raise _bad(400, "upload cut short", "the client went away") from None
                    if idle.cancel_called:
                        raise _bad(408, "upload stalled", f"no bytes for {ARCHIVE_IDLE:g} s")
                    if chunk is None:
                        break
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise _bad(413, f"{what} too large", f"the bound is {self.max_bytes} bytes")
                    digest.update(chunk)
                    await anyio.to_thread.run_sync(file.write, chunk)
        except BaseException:
            await _forget(partial)
            raise
        return partial, digest.hexdigest()

    async def pull(self, ref: str, archive: Path | None = None) -> ImageRecord:
        """`ref` pinned and its blobs in the store: pulled from its registry with its login
        (when one is set), or read from the archive file `archive`."""
        credentials = None
        if archive is None and self.logins is not None:
            credentials = await self.logins.credentials(parse_reference(ref).domain)
        return await self.store.import_image(ref, archive=archive, credentials=credentials)

    async def resolve(
        self, ref: str, archive: str | None, manifest: str | None = None, app: str = ""
    ) -> ImageRecord:
        """`pull`, the archive named by an upload's name (`receive`; deleted then), or the
        image built by the CLI whose blobs were uploaded (`built:APP` for the app `app`, its
        manifest named)."""
        if ref.startswith(BUILT) or manifest is not None:
            if ref != f"{BUILT}{app}" or manifest is None:
                raise ImageRefused(
                    f"image {ref}: an uploaded image is named built:{app or 'APP'} (the app's "
                    "own name), with its manifest"
                )
            return await self.store.import_built(ref, manifest)
        path = None
        if ref.startswith(("oci-archive:", "docker-archive:")):
            if archive is None or not _ARCHIVE.match(archive):
                raise ImageRefused(f"image {ref}: the archive was not uploaded with the deploy")
            path = self.incoming / archive
            if not await anyio.Path(path).is_file():
                raise ImageRefused(f"image {ref}: no uploaded archive {archive} (upload it again)")
        try:
            record = await self.pull(ref, path)
        except (ImageStorageError, LoginUnusable):  # 503: the upload stays for the retry
            raise
        except BaseException:
            await _forget(path)
            raise
        await _forget(path)
        return record


def _copy_checked(source: Path, target: Path) -> str:
    """`source` copied to `target`; the copy's digest."""
    digest = hashlib.sha256()
    with source.open("rb") as reader, target.open("wb") as writer:
        while chunk := reader.read(1 << 20):
            digest.update(chunk)
            writer.write(chunk)
    return f"sha256:{digest.hexdigest()}"


async def _forget(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError), anyio.CancelScope(shield=True):
            await anyio.Path(path).unlink()


@contextlib.contextmanager
def _store_errors() -> Iterator[None]:
    """The image store's disk failing (full, gone read-only): 503, to be tried again."""
    try:
        yield
    except (ImageStorageError, OSError) as exc:
        raise HTTPException(
            503,
            {"error": "image store unavailable", "detail": str(exc)},
            headers={"Retry-After": "5"},
        ) from exc


def _bad(status: int, error: str, detail: str) -> HTTPException:
    return HTTPException(status, {"error": error, "detail": detail})


class Wanted(BaseModel):
    model_config = ConfigDict(extra="forbid")

    blobs: list[Annotated[str, StringConstraints(pattern=BLOB_DIGEST)]] = Field(
        max_length=MAX_WANTED
    )


def images_router(images: Images) -> APIRouter:
    router = APIRouter()

    @router.put("/v1/images/archives", status_code=201)
    async def upload_archive(request: Request) -> dict[str, str]:
        return {"archive": await images.receive(request)}

    @router.post("/v1/images/blobs/missing")
    async def missing(body: Wanted) -> dict[str, list[str]]:
        with _store_errors():
            return {"missing": await images.store.missing(body.blobs)}

    @router.put("/v1/images/blobs/{digest}", status_code=201)
    async def upload_blob(digest: BlobParam, request: Request) -> dict[str, str]:
        with _store_errors():
            await images.receive_blob(request, digest)
        return {"blob": digest}

    @router.get("/v1/blobs/{digest}")
    async def blob(digest: BlobParam) -> StreamingResponse:
        chunks = images.store.chunks(digest)
        try:  # the first chunk read now: a missing blob is a 404, not a broken stream
            first = await anext(chunks, b"")
        except BlobMissing as exc:
            raise _bad(404, "unknown blob", str(exc)) from exc

        async def body() -> AsyncIterator[bytes]:
            yield first
            async for chunk in chunks:
                yield chunk

        return StreamingResponse(body(), media_type="application/octet-stream")

    return router
