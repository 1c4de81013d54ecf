"""What the image cache raises: one error, whose message a person can act on."""

from __future__ import annotations


class ImageError(Exception):
    """An image this node cannot turn into a root filesystem. The message names the image
    (its ref), the blob or layer, and the reason: `image registry.example/shop:1 layer
    sha256:ab...: entry "../x" leaves the root`. Nothing of a failed unpack is left behind."""
