"""A registry that answers the manifest, then stalls mid-blob: the import fails with a
timeout naming its setting, within its deadline, and leaves the store usable."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream

from tests.oci.layouts import Layout, layer
from wakeful.oci import ImageStore, RegistryTimeout

pytestmark = pytest.mark.anyio

Handler = Callable[[SocketStream], Awaitable[None]]


def stalling_registry(source: Layout, stall: set[str]) -> Handler:
    """A registry serving `source`'s manifests and blobs over plain HTTP (a TLS hello is
    hung up on, so skopeo falls back to HTTP): a blob in `stall` gets its headers and half
    its bytes, then nothing."""

    async def handle(stream: SocketStream) -> None:
        async with stream:
            buffer = bytearray()
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        buffer += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                    if buffer[:1] == b"\x16":  # a TLS ClientHello
                        return
                head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
                buffer = bytearray(rest)
                method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
                await answer(stream, method, target)

    async def answer(stream: SocketStream, method: str, target: str) -> None:
        kind, _, name = target.rpartition("/")
        kind = kind.rpartition("/")[2]
        if target == "/v2/":
            status, body, media = "200 OK", b"{}", "application/json"
        elif kind == "manifests":
            digest = source.tagged(name) if not name.startswith("sha256:") else name
            status, body, media = (
                "200 OK",
                source.read(digest),
                "application/vnd.oci.image.manifest.v1+json",
            )
        elif kind == "blobs":
            status, body, media = "200 OK", source.read(name), "application/octet-stream"
        else:
            status, body, media = "404 Not Found", b"{}", "application/json"
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {media}\r\nContent-Length: {len(body)}\r\n"
            f"Docker-Content-Digest: {digest}\r\n\r\n"
        )
        await stream.send(head.encode())
        if method == "HEAD":
            return
        if kind == "blobs" and name in stall:
            await stream.send(body[: len(body) // 2])
            await anyio.sleep(math.inf)
        await stream.send(body)

    return handle


async def test_a_registry_stalling_mid_blob_times_out_within_the_deadline(
    source: Layout, tmp_path: Path
) -> None:
    big = layer({"data": bytes(range(256)) * 4096})
    image = source.image([layer({"a": b"a"}), big])
    source.tag("1", image)
    stalled = source.manifest_of(image)["layers"][1]["digest"]
    images = ImageStore(tmp_path / "images", timeout=2.0)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, stalling_registry(source, {stalled}))
        started = time.monotonic()
        with anyio.fail_after(30), pytest.raises(RegistryTimeout) as err:
            await images.import_image(f"127.0.0.1:{port}/shop:1")
        took = time.monotonic() - started
        group.cancel_scope.cancel()
    message = str(err.value)
    assert message.startswith(f"pulling 127.0.0.1:{port}/shop:1: timed out after 2 s")
    assert "WAKEFUL_IMAGE_PULL_TIMEOUT" in message
    assert "\n" not in message
    assert took < 10, f"the timeout came {took:.1f} s after the start, its deadline is 2 s"
    assert not images.has(stalled)
    leftovers = [path.name for path in images.directory.iterdir()]
    assert sorted(leftovers) == [".lock", ".tmp", "blobs", "index.json", "oci-layout"]
    assert [entry.name for entry in (images.directory / ".tmp").iterdir()] == []
    # The lock was given back: the collector runs at once.
    with anyio.fail_after(5):
        await images.remove_unreferenced(set(), before=0)
