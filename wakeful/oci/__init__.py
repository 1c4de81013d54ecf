"""OCI images as the control plane and the nodes handle them, through Debian's tools (skopeo
copies, the node's umoci unpacks): a component may import this; it imports only `aio`, the
store and the domain.

- `errors`: the exception tree (`ImageError` and what it splits into).
- `resolve`: pure: a reference parsed, a manifest or index checked and its platform's manifest
  picked, an image's config turned into an `ImageRecord`.
- `skopeo`: running skopeo under a deadline, with credentials in a private auth file and TLS
  chosen by the registry's host.
- `layout`: the synchronous file work on an OCI image layout (index.json, blobs, pruning).
- `store`: `ImageStore`, the control plane's layout: `import_image`, blobs by digest, the
  collector's `remove_unreferenced`.
"""

from .errors import (
    BlobMissing,
    ImageError,
    ImageRefused,
    ImageStorageError,
    LoginUnusable,
    RegistryError,
    RegistryTimeout,
    SkopeoMissing,
)
from .skopeo import Credentials, RegistryAccess
from .store import ImageStore, referenced_blobs

__all__ = [
    "BlobMissing",
    "Credentials",
    "ImageError",
    "ImageRefused",
    "ImageStorageError",
    "ImageStore",
    "LoginUnusable",
    "RegistryAccess",
    "RegistryError",
    "RegistryTimeout",
    "SkopeoMissing",
    "referenced_blobs",
]
