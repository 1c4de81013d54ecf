"""wakeful: a self-hosted control plane for HTTP apps that scale to zero and back."""

from wakeful import native

NATIVE = native.guard()
"""Whether the ingress's compiled modules run ("compiled"), or their sources and why."""
