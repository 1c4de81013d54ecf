"""What an image import raises: one line a person can act on, naming the image and the reason,
never a credential.

    ImageError                the import failed; nothing was recorded
    ├── ImageRefused          the image itself is not acceptable (its reference, platform,
    │                         layers, media types, size, schema 1): a 4xx, retrying won't help
    ├── RegistryError         skopeo could not get it (refused credentials, no such image or
    │   │                     tag, a digest that does not match, TLS, an unreadable archive)
    │   └── RegistryTimeout   the pull passed its deadline (a stalled registry)
    ├── SkopeoMissing         no skopeo on this machine
    ├── LoginUnusable         the control plane holds a login for the registry and cannot
    │                         open it (its key is not here): a 503, not the image's fault
    ├── ImageStorageError     the blob store cannot take it (a full disk, an I/O error)
    └── BlobMissing           a blob asked for by digest is not stored
"""

from __future__ import annotations


class ImageError(Exception):
    """An image could not be imported; the message is one line for a person."""


class ImageRefused(ImageError):
    """The image (or its reference) is not one wakeful runs."""


class RegistryError(ImageError):
    """skopeo failed to read the image from its registry or archive."""


class RegistryTimeout(RegistryError):
    """The pull took longer than its deadline."""


class SkopeoMissing(ImageError):
    """skopeo is not installed."""


class LoginUnusable(ImageError):
    """A registry login the control plane holds does not open (its key is missing)."""


class ImageStorageError(ImageError):
    """The image store could not be written (the import can be retried later)."""


class BlobMissing(ImageError, FileNotFoundError):
    """No blob of that digest is stored (never imported, or collected)."""
