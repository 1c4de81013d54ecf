"""The artifact format: a packed app directory, named by its content (the same directory
always packs to the same bytes), and the rules every pack, upload and unpack keeps.

A pack is a gzip'd tar of the directory's regular files; its sha256 (`digest_of`) names it.
An archive is refused whole when it would unpack past its bounds (`check_bounds`: a
compression bomb under `MAX_ARTIFACT_BYTES` must not fill a node's disk) and, on upload, when a
member is not a regular file inside it or a name comes twice (`check_upload`). The rules are
functions of the archive's members (`Member`); reading and writing tar files and directories is
`wakeful.aio.packing`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ARTIFACT_BYTES = 100 * 1024 * 1024
MAX_UNPACKED_BYTES = 2 * 1024 * 1024 * 1024
"""What an artifact may expand to: a compression bomb under MAX_ARTIFACT_BYTES must not fill
a node's disk when it is unpacked."""
MAX_MEMBERS = 100_000
SKIP_DIRS = frozenset({".git", "__pycache__", ".wakeful", ".venv", "node_modules", ".mypy_cache"})
MAX_NAME_BYTES = 2048
"""The longest path a packed file may have inside its directory: the node unpacks it under
its own data directory, and the whole must stay under the kernel's PATH_MAX (4096)."""


class ArtifactError(ValueError):
    """Bytes that are not what they should be, or refused: trying again will not help."""


class ArtifactUnavailable(OSError):
    """The store of artifacts and archives cannot be reached or written now: try again."""


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Member:
    """One entry of an archive, as the rules see it."""

    name: str
    regular: bool
    """A regular file (not a directory, link, device or FIFO)."""
    size: int


def check_bounds(members: Sequence[Member], max_bytes: int) -> None:
    """`ArtifactError` when the members add up to more than `max_bytes` or `MAX_MEMBERS`."""
    size = sum(member.size for member in members)
    if size > max_bytes or len(members) > MAX_MEMBERS:
        raise ArtifactError(
            f"artifact unpacks to {size} bytes in {len(members)} files; the bounds are "
            f"{max_bytes} bytes and {MAX_MEMBERS} files"
        )


def check_upload(members: Sequence[Member], max_bytes: int = MAX_UNPACKED_BYTES) -> None:
    """`ArtifactError` for an upload refused before it is stored: over its bounds, a member
    that is not a regular file inside the archive (an absolute name, a `..`), or a name given
    twice."""
    check_bounds(members, max_bytes)
    names = set()
    for member in members:
        if not member.regular or member.name.startswith("/") or ".." in member.name.split("/"):
            raise ArtifactError(f"refusing artifact member {member.name!r}")
        if member.name in names:
            raise ArtifactError(f"{member.name!r} is in the archive twice")
        names.add(member.name)
