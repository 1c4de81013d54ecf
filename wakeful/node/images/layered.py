"""An image's tree made from a base shared with the images before it: all its layers but the
last, unpacked once and kept (`bases/<chain>`), copied, and its last layer unpacked over the copy.

A rebuilt app differs from its previous version in its last layer alone (the code copied after
the dependencies): with a base kept, a new version's tree costs a copy (`cp -a`, xattrs and
all: umoci's ownership records go along) and one small layer, instead of every layer again.
umoci applies the last layer's whiteouts and opaque directories to the copy as it would have
over its own unpack of the layers below. A base is never handed to a sandbox: the walk that
makes a tree safe (`unpack.settle`) runs over each tree made from it.

umoci unpacks a chosen run of layers from a scratch layout of its own: the layer blobs linked
from the node's layout, and a config and a manifest naming only those layers (the config's
`rootfs.diff_ids` cut to match, which umoci checks each layer's contents against).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import anyio

from wakeful.aio.spawn import run_tool
from wakeful.domain.models.images import ImageRecord

from .errors import ImageError
from .unpack import run_umoci

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"


def base_key(image: ImageRecord) -> str | None:
    """The key of the base all of `image`'s layers but the last make (None: one layer)."""
    if len(image.layers) < 2:
        return None
    chain = "\n".join(layer.digest for layer in image.layers[:-1])
    return "base-" + hashlib.sha256(chain.encode()).hexdigest()


def _scratch_layout(
    scratch: Path, blob: Callable[[str], Path], config: bytes, image: ImageRecord, run: slice
) -> None:
    """A layout at `scratch` holding the layers `run` of `image` as one image named `run`."""
    body = json.loads(config)
    rootfs = body.get("rootfs") if isinstance(body, dict) else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(image.layers):
        raise ImageError("its config does not list one diff_id per layer")
    body["rootfs"] = {"type": "layers", "diff_ids": diff_ids[run]}
    blobs = scratch / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    layers = image.layers[run]
    for layer in layers:
        os.link(blob(layer.digest), blobs / layer.digest.removeprefix("sha256:"))
    config_digest, config_size = put(json.dumps(body).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
        "layers": [
            {"mediaType": layer.media_type, "digest": layer.digest, "size": layer.size}
            for layer in layers
        ],
    }
    manifest_digest, manifest_size = put(json.dumps(manifest).encode())
    entry = {
        "mediaType": MANIFEST_TYPE,
        "digest": manifest_digest,
        "size": manifest_size,
        "annotations": {"org.opencontainers.image.ref.name": "run"},
    }
    (scratch / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (scratch / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')


async def unpack_run(
    image: ImageRecord,
    run: slice,
    rootfs: Path,
    *,
    blob: Callable[[str], Path],
    config: bytes,
    scratch: Path,
) -> None:
    """The layers `run` of `image` unpacked by umoci into `rootfs` (over what it holds)."""
    try:
        await anyio.to_thread.run_sync(_scratch_layout, scratch, blob, config, image, run)
        await run_umoci(scratch, "run", rootfs)
    except (OSError, ValueError) as exc:
        raise ImageError(f"could not be unpacked here ({exc})") from exc
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(scratch, ignore_errors=True))


async def copy_tree(source: Path, target: Path) -> None:
    """`source` copied to the new directory `target`: modes, owners, xattrs, links as links."""
    done = await run_tool(["cp", "-a", "--reflink=auto", "--", str(source), str(target)])
    if done.returncode != 0:
        raise ImageError(f"could not copy its base tree: {done.last_line()}")
