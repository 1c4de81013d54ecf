"""A tar stream read with bounds: what an archive or an image layer is read through, so that a
hostile one can neither inflate past what its bounds hold nor make one read take gigabytes
(tarfile reads a pax or long-name header whole: one that claims gigabytes would be read into
memory). It seeks only forward, as tarfile does when it skips a member's data.

Used by `wakeful.aio.packing` (artifacts and state archives) and `wakeful.oci.scan` (image
layers); each raises its own error, given as `refuse`.
"""

from __future__ import annotations

import io
from collections.abc import Callable

MAX_READ = 8 << 20
"""The most one read may ask for: a file's data is read in small pieces, a header whole."""


class CappedStream(io.RawIOBase):
    """`raw` (already inflated, when it was compressed), refused with `refuse(reason)` past
    `ceiling` bytes in all and for any single read over `MAX_READ`."""

    def __init__(
        self, raw: io.BufferedIOBase, ceiling: int, refuse: Callable[[str], Exception]
    ) -> None:
        self._raw = raw
        self._ceiling = ceiling
        self._refuse = refuse

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._raw.tell()

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > MAX_READ:
            raise self._refuse(f"a header asks for a read of {size} bytes at once")
        self._within(self._raw.tell() + size)
        return self._raw.read(size)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise self._refuse("it is never read from its end")
        target = offset if whence == io.SEEK_SET else self._raw.tell() + offset
        self._within(target)
        return self._raw.seek(target)

    def _within(self, position: int) -> None:
        if position > self._ceiling:
            raise self._refuse(f"inflates past {self._ceiling} bytes: more than its bounds hold")

    def close(self) -> None:
        self._raw.close()
        super().close()
