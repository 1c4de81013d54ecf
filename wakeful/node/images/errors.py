"""What the image cache raises: one error, whose message a person can act on. It is the
image error of `wakeful.oci` (the layer checks are shared with the control plane's import),
so one `except ImageError` covers a refusal found by either."""

from __future__ import annotations

from wakeful.oci.errors import ImageError

__all__ = ["ImageError"]
