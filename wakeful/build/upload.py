"""A built image sent to the control plane's image store blob by blob: asked which blobs it
lacks, only those are sent (the manifest last, once every blob it names is there), so a rebuild
that changed the code alone sends one layer, the config and the manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wakeful.oci import layout
from wakeful.remote import ControlClient


@dataclass(frozen=True)
class Sent:
    blobs: int
    """Blobs the image has (its manifest, config and layers)."""
    sent: int
    """Of those, the ones the control plane lacked and was sent."""
    bytes: int
    """Bytes sent."""


ROUNDS = 3
"""Times the control plane is asked again what it lacks once the blobs were sent."""


def upload(api: ControlClient, root: Path, manifest: str, ref: str) -> Sent:
    """The image whose manifest is `manifest` in the OCI layout `root`, uploaded. Once all is
    sent, the control plane is asked again (which claims every blob it holds anew): an upload
    longer than the collector's grace may have lost its first blobs, which go again."""
    wanted = [*layout.read_manifest(root, manifest, ref)[0].blobs, manifest]  # the manifest last
    sent = size = 0
    for _ in range(ROUNDS):
        missing = set(api.missing_blobs(wanted))
        if not missing:
            break
        for digest in wanted:
            if digest in missing:
                path = layout.blob_path(root, digest)
                size += path.stat().st_size
                api.put_blob(digest, path)
                sent += 1
    return Sent(len(wanted), sent, size)
