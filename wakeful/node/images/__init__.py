"""Root filesystems from OCI images: an image's blobs turned into an unpacked, read-only,
content-addressed tree on this node, checked before a byte is unpacked, bounded.

- `cache.py`: `ImageCache`, the trees by image and owner: one make per key, LRU eviction of
  trees no sandbox holds, `stats()`.
- `blobs.py`: `BlobSource` (what the control plane serves, by digest) and the local OCI layout
  the blobs are checked into.
- `scan.py`: the manifest against the version's record, and the rules every layer's tar
  headers must pass before umoci runs (names, links, whiteouts, bounds).
- `unpack.py`: umoci, then the walk that strips setuid bits and capabilities, removes FIFOs
  and devices, and gives the image user's files to the app's uid.
- `eviction.py`: which unused trees go to make room (pure).
- `errors.py`: `ImageError`. `testing.py`: `DirectoryBlobs`, a `BlobSource` over a layout.
"""

from .blobs import BlobSource
from .cache import CacheStats, ImageCache
from .errors import ImageError

__all__ = ["BlobSource", "CacheStats", "ImageCache", "ImageError"]
