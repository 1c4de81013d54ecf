"""An image the CLI built, sent blob by blob through the control API (issue 37): only what the
store lacks is asked for, a blob is stored only when its bytes match its digest, and a deploy of
`built:APP` names a manifest whose every blob is there, or is refused with nothing written."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.activator import serving
from tests.support.images import OciLayout, busybox_image
from wakeful.activator.api import create_app
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.deploy.api import deploy_router
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.images import Images, images_router
from wakeful.deploy.service import Deployer
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.models import ImageRecord, Role, Version
from wakeful.oci import ImageStore
from wakeful.store import Store, open_store
from wakeful.store.tokenbook import TokenBook

pytestmark = pytest.mark.anyio
ADMIN, NODE = "admin-token", "node-token"
MAX_BLOB = 8 << 20
UPLOAD_TIME = 3.0
"""Seconds one upload may take here: far more than any test's upload needs."""


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with open_store("memory://") as store:
        yield store


@pytest.fixture
def image_store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "artifacts" / "images", timeout=60)


@pytest.fixture
async def api(
    tmp_path: Path, store: Store, image_store: ImageStore
) -> AsyncIterator[httpx.AsyncClient]:
    registry = CollectorRegistry()
    settings = ActivatorSettings(store_url="memory://", token=ADMIN)
    activator = Activator(store, settings, registry)
    artifacts = LocalArtifacts(tmp_path / "artifacts", max_bytes=64 * 1024)
    deployer = Deployer(store, artifacts, timeout=2, hosts=settings.host_rules())
    images = Images(
        image_store, tmp_path / "artifacts" / "incoming", MAX_BLOB, upload_time=UPLOAD_TIME
    )
    async with activator.running(), anyio.create_task_group() as tasks:
        keeper = StateKeeper(store, artifacts, registry=registry)
        routes = [
            deploy_router(store, deployer, artifacts, keeper, tasks, images=images),
            images_router(images),
        ]
        tokens = TokenBook.of({ADMIN: Role.ADMIN, NODE: Role.NODE})
        app = create_app(activator, tokens, registry, routes)
        async with (
            serving(app) as url,
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}) as client,
        ):
            yield client


@pytest.fixture
def built(tmp_path: Path) -> tuple[OciLayout, ImageRecord]:
    layout = OciLayout(tmp_path / "built")
    return layout, busybox_image(layout, "site")


def blobs_of(record: ImageRecord) -> list[str]:
    return [record.config_digest, *(layer.digest for layer in record.layers), record.manifest]


def definition(name: str = "site") -> dict[str, object]:
    return {"name": name, "spec": {"image": f"built:{name}"}}


async def send_all(api: httpx.AsyncClient, layout: OciLayout, digests: list[str]) -> None:
    for digest in digests:
        assert (await send(api, layout, digest)).status_code == 201


async def deploy_built(api: httpx.AsyncClient, record: ImageRecord, **extra: str) -> httpx.Response:
    body = {"definition": definition(), "image_manifest": record.manifest, **extra}
    return await api.post("/v1/deploys", json=body)


async def send(api: httpx.AsyncClient, layout: OciLayout, digest: str) -> httpx.Response:
    return await api.put(
        f"/v1/images/blobs/{digest}", content=layout.blob_path(digest).read_bytes()
    )


async def test_only_missing_blobs_are_asked_for_and_a_built_image_deploys(
    api: httpx.AsyncClient,
    store: Store,
    image_store: ImageStore,
    built: tuple[OciLayout, ImageRecord],
) -> None:
    layout, record = built
    wanted = blobs_of(record)
    asked = await api.post("/v1/images/blobs/missing", json={"blobs": wanted})
    assert asked.status_code == 200 and asked.json()["missing"] == wanted
    first = wanted[0]
    assert (await send(api, layout, first)).status_code == 201
    again = await api.post("/v1/images/blobs/missing", json={"blobs": wanted})
    assert again.json()["missing"] == wanted[1:]
    await send_all(api, layout, wanted[1:])
    deployed = await deploy_built(api, record, made="Containerfile")
    assert deployed.status_code == 202, deployed.text
    version = await store.get(keys.version("site", "v1"), Version)
    assert version is not None and version.value.image is not None
    assert (version.value.image.ref, version.value.image.digest) == ("built:site", record.manifest)
    assert version.value.made == "Containerfile"
    apps = (await api.get("/v1/apps")).json()
    assert apps[0]["made"] == {"v1": "Containerfile"}
    assert apps[0]["images"] == {"v1": f"built:site@{record.manifest}"}
    assert image_store.has(record.manifest)


async def test_a_blob_that_does_not_match_its_digest_is_refused_and_not_stored(
    api: httpx.AsyncClient, image_store: ImageStore, tmp_path: Path
) -> None:
    claimed = "sha256:" + hashlib.sha256(b"what was promised").hexdigest()
    answer = await api.put(f"/v1/images/blobs/{claimed}", content=b"something else")
    assert answer.status_code == 400
    assert answer.json()["error"] == "digest mismatch"
    assert not image_store.has(claimed)
    assert list((tmp_path / "artifacts" / "incoming").iterdir()) == []


async def test_a_blob_over_the_bound_is_refused_as_it_arrives(
    api: httpx.AsyncClient, image_store: ImageStore
) -> None:
    data = b"x" * (MAX_BLOB + 1)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    answer = await api.put(f"/v1/images/blobs/{digest}", content=data)
    assert answer.status_code == 413
    assert not image_store.has(digest)


async def test_a_deploy_naming_a_blob_never_sent_is_refused_with_nothing_written(
    api: httpx.AsyncClient,
    store: Store,
    image_store: ImageStore,
    built: tuple[OciLayout, ImageRecord],
) -> None:
    layout, record = built
    skipped = record.layers[-1].digest
    await send_all(api, layout, [digest for digest in blobs_of(record) if digest != skipped])
    answer = await deploy_built(api, record)
    assert answer.status_code == 400
    assert skipped in answer.json()["detail"]
    assert await store.get(keys.version("site", "v1"), Version) is None
    index = json.loads((image_store.directory / "index.json").read_text())
    assert index["manifests"] == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(
            {"definition": definition()}, "with its manifest", id="built without a manifest"
        ),
        pytest.param(
            {
                "definition": {"name": "site", "spec": {"image": "example.com/site:1"}},
                "image_manifest": "sha256:" + "0" * 64,
            },
            "with its manifest",
            id="a manifest for a registry image",
        ),
    ],
)
async def test_built_images_and_manifests_go_together(
    api: httpx.AsyncClient, body: dict[str, object], reason: str
) -> None:
    answer = await api.post("/v1/deploys", json=body)
    assert answer.status_code == 400
    assert reason in answer.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/images/blobs/sha256:" + "a" * 64),
        ("POST", "/v1/images/blobs/missing"),
    ],
)
async def test_only_an_admin_token_uploads(api: httpx.AsyncClient, method: str, path: str) -> None:
    answer = await api.request(
        method, path, content=b"{}", headers={"Authorization": f"Bearer {NODE}"}
    )
    assert answer.status_code == 403


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def put(api: httpx.AsyncClient, data: bytes) -> str:
    digest = sha(data)
    answer = await api.put(f"/v1/images/blobs/{digest}", content=data)
    assert answer.status_code == 201, answer.text
    return digest


def manifest_of(config: tuple[str, int], layers: list[tuple[str, int]]) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config[0],
                "size": config[1],
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": s}
                for d, s in layers
            ],
        }
    ).encode()


NESTED = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("where", ["manifest", "config"])
async def test_a_deeply_nested_manifest_or_config_is_refused_not_a_500(
    api: httpx.AsyncClient, where: str
) -> None:
    if where == "manifest":
        manifest = await put(api, b'{"schemaVersion":2,"x":' + NESTED + b"}")
    else:
        config = b'{"x":' + NESTED + b"}"
        manifest = await put(api, manifest_of((await put(api, config), len(config)), []))
    answer = await api.post(
        "/v1/deploys", json={"definition": definition(), "image_manifest": manifest}
    )
    assert answer.status_code == 400, answer.text


async def test_a_blob_of_another_size_than_its_manifest_says_is_refused(
    api: httpx.AsyncClient, image_store: ImageStore, built: tuple[OciLayout, ImageRecord]
) -> None:
    layout, record = built
    await send_all(api, layout, blobs_of(record)[:-1])
    raw = json.loads(layout.blob_path(record.manifest).read_bytes())
    raw["layers"][0]["size"] = 1  # the manifest lies about its first layer
    lying = await put(api, json.dumps(raw).encode())
    answer = await api.post(
        "/v1/deploys", json={"definition": definition(), "image_manifest": lying}
    )
    assert answer.status_code == 400
    assert "its manifest says 1" in answer.json()["detail"]


async def test_a_refused_built_image_is_not_left_named_in_the_store(
    api: httpx.AsyncClient, image_store: ImageStore
) -> None:
    config = json.dumps({"architecture": "arm64", "os": "linux", "config": {}}).encode()
    manifest = await put(api, manifest_of((await put(api, config), len(config)), []))
    answer = await api.post(
        "/v1/deploys", json={"definition": definition(), "image_manifest": manifest}
    )
    assert answer.status_code == 400, answer.text
    index = json.loads((image_store.directory / "index.json").read_text())
    assert index["manifests"] == []


async def test_an_app_deploys_only_its_own_built_name(
    api: httpx.AsyncClient, built: tuple[OciLayout, ImageRecord]
) -> None:
    layout, record = built
    await send_all(api, layout, blobs_of(record))
    body = {
        "definition": {"name": "thief", "spec": {"image": "built:site"}},
        "image_manifest": record.manifest,
    }
    answer = await api.post("/v1/deploys", json=body)
    assert answer.status_code == 400
    assert "built:thief" in answer.json()["detail"]


async def test_asking_what_is_missing_claims_what_is_there(
    api: httpx.AsyncClient, image_store: ImageStore, built: tuple[OciLayout, ImageRecord]
) -> None:
    layout, record = built
    first = blobs_of(record)[0]
    await send_all(api, layout, [first])
    path = image_store.blob_path(first)
    os.utime(path, (1.0, 1.0))  # claimed long ago: the collector could take it
    await api.post("/v1/images/blobs/missing", json={"blobs": [first]})
    assert path.stat().st_mtime > 1.0  # claimed again: it stays for the deploy that follows


async def test_an_upload_that_drips_is_cut_off_at_its_deadline(
    api: httpx.AsyncClient, image_store: ImageStore
) -> None:
    async def drip() -> AsyncIterator[bytes]:
        for _ in range(int(UPLOAD_TIME * 4)):  # a byte every 0.5 s: twice the time allowed
            yield b"x"
            await anyio.sleep(0.5)

    answer = await api.put(f"/v1/images/blobs/{sha(b'x' * 12)}", content=drip())
    assert answer.status_code == 408
    assert answer.json()["error"] == "upload too slow"
