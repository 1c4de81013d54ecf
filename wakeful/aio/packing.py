"""Packing an app directory into an artifact, and unpacking one into a directory: the file and
tar side of the artifact format, whose rules are `wakeful.domain.artifacts`.

A pack is a gzip'd tar of the directory's regular files (no links, devices, or the usual build
litter), with fixed owners and times, so its sha256 names its content. Unpacking refuses any
member that would land outside the destination.

An archive from outside is hostile input. It is read header by header, each checked against
the bounds before the next is looked for (`_members`): a million empty headers are refused at
the 100,001st, a member that claims 4 GiB before a byte of it is inflated. And the tar stream
is read through `_capped` (`wakeful.aio.capped`): no more inflated bytes in all than the
bounds allow, and no single read larger than `MAX_READ` (tarfile reads a pax or GNU long-name
header whole, so a header that claims gigabytes would otherwise be read into memory).
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import tarfile
import zlib
from pathlib import Path

from wakeful.aio.capped import CappedStream
from wakeful.domain.artifacts import (
    MAX_ARTIFACT_BYTES,
    MAX_MEMBERS,
    MAX_NAME_BYTES,
    MAX_UNPACKED_BYTES,
    SKIP_DIRS,
    ArtifactError,
    Member,
    check_bounds,
    check_upload,
)


def pack(
    directory: Path, *, skip: frozenset[str] = SKIP_DIRS, max_bytes: int = MAX_ARTIFACT_BYTES
) -> bytes:
    """The regular files under `directory` (not in a directory named in `skip`), packed.
    `ArtifactError` when they add up to more than `max_bytes` (before or after compression) or
    `MAX_MEMBERS` files, or a path is longer than `MAX_NAME_BYTES`; `OSError` when a file or
    directory cannot be read (never a silent gap). A missing `directory` packs to an empty
    archive. Symbolic links are never followed and, like FIFOs, sockets and devices, left out.
    Walked by directory descriptor, so a tree deeper than PATH_MAX is read all the same; the
    tar goes through gzip as it is written, so only the compressed bytes are held."""
    raw = io.BytesIO()
    total = members = 0
    walked = os.fwalk(directory, onerror=_raise) if os.path.lexists(directory) else iter(())
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for root, dirs, files, root_fd in walked:
            dirs[:] = sorted(d for d in dirs if d not in skip)
            inside = os.path.relpath(root, directory)
            for name in sorted(files):
                relative = name if inside == "." else f"{inside}/{name}"
                found = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                if not stat.S_ISREG(found.st_mode):
                    continue  # a link, FIFO, socket or device: never opened
                if len(os.fsencode(relative)) > MAX_NAME_BYTES:
                    raise ArtifactError(
                        f"{relative[:80]}... is a path of more than {MAX_NAME_BYTES} bytes"
                    )
                total += found.st_size
                members += 1
                if total > max_bytes:
                    raise ArtifactError(f"{directory} holds more than {max_bytes} bytes")
                if members > MAX_MEMBERS:
                    raise ArtifactError(f"{directory} holds more than {MAX_MEMBERS} files")
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd = os.open(name, flags, dir_fd=root_fd)
                with os.fdopen(fd, "rb") as handle:
                    info = tarfile.TarInfo(relative)
                    info.size = found.st_size
                    info.mode = 0o755 if found.st_mode & 0o100 else 0o644
                    tar.addfile(info, handle)
    packed = raw.getvalue()
    if len(packed) > max_bytes:
        raise ArtifactError(f"{directory} packs to {len(packed)} bytes; the bound is {max_bytes}")
    return packed


def _raise(error: OSError) -> None:
    raise error


def unpack(
    data: bytes,
    destination: Path,
    max_bytes: int = MAX_UNPACKED_BYTES,
    owner: int | None = None,
) -> None:
    """Write the artifact's files into the directory `destination`: each file with
    only its owner's permission bits, each directory made 0700, all of them `owner`'s (uid and
    gid) when given. Refused whole, before anything is written, when a member is not a regular
    file inside `destination` or the whole is over its bounds; a name given twice is refused
    too. Written here rather than by `tarfile.extractall`, which a start paid for twice (its
    own checks and times, then a walk to set owners and modes)."""
    destination = destination.resolve()
    try:
        with tarfile.open(fileobj=_capped(data, max_bytes), mode="r:") as tar:
            members = _members(tar, max_bytes)
            destination.mkdir(mode=0o700, parents=True, exist_ok=True)
            targets = []
            for member in members:
                target = (destination / member.name).resolve()
                if not member.isfile() or not target.is_relative_to(destination):
                    raise ArtifactError(f"refusing artifact member {member.name!r}")
                targets.append(target)
            made = {destination}
            for member, target in zip(members, targets, strict=True):
                _make_parents(target.parent, made, owner)
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(target, flags, member.mode & 0o700)
                with os.fdopen(fd, "wb") as out:
                    if owner is not None:
                        os.fchown(fd, owner, owner)
                    shutil.copyfileobj(source, out)
    except FileExistsError as exc:
        raise ArtifactError(f"corrupt artifact: {exc.filename} is in it twice") from exc
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise ArtifactError(f"corrupt artifact: {exc}") from exc


def _make_parents(directory: Path, made: set[Path], owner: int | None) -> None:
    if directory in made:
        return
    _make_parents(directory.parent, made, owner)
    directory.mkdir(mode=0o700, exist_ok=True)
    if owner is not None:
        os.chown(directory, owner, owner)
    made.add(directory)


def validate(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> None:
    """A corrupt upload is refused before it is stored (`check_upload`): a member that is not
    a regular file inside the archive, a name given twice, or more than `max_bytes`
    unpacked."""
    try:
        with tarfile.open(fileobj=_capped(data, max_bytes), mode="r:") as tar:
            members = _members(tar, max_bytes)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise ArtifactError(f"corrupt artifact: {exc}") from exc
    check_upload([_member(m) for m in members], max_bytes)


def _member(info: tarfile.TarInfo) -> Member:
    return Member(info.name, info.isfile(), info.size)


def _members(tar: tarfile.TarFile, max_bytes: int) -> list[tarfile.TarInfo]:
    """Every member, each header checked against the bounds before the next is read."""
    members: list[tarfile.TarInfo] = []
    size = 0
    while (info := tar.next()) is not None:
        members.append(info)
        size += info.size
        if size > max_bytes or len(members) > MAX_MEMBERS:
            check_bounds([_member(m) for m in members], max_bytes)  # raises, saying which
    return members


def _capped(data: bytes, max_bytes: int) -> CappedStream:
    """The tar stream inside a gzip'd archive, refused (`ArtifactError`) past what an archive
    within `max_bytes` and `MAX_MEMBERS` can hold: every member's data, rounded up to blocks,
    and for each a header, a pax header and its data; the end blocks and the record's
    padding; and for any read over `MAX_READ`."""
    ceiling = max_bytes + (MAX_MEMBERS + 1) * 4 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE
    inflated = gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb")
    return CappedStream(inflated, ceiling, lambda reason: ArtifactError(f"archive {reason}"))
