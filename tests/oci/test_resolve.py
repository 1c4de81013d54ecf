"""The import's decisions, without skopeo: references, manifests, platforms, records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from wakeful.oci import Credentials, RegistryAccess
from wakeful.oci.errors import ImageRefused
from wakeful.oci.resolve import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    Index,
    Manifest,
    Reference,
    check,
    digest_of,
    image_record,
    is_loopback,
    parse_manifest,
    parse_reference,
    pick,
)
from wakeful.oci.skopeo import auth_file, summary, tls_flags

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
D = "sha256:" + "a" * 64
E = "sha256:" + "e" * 64


def desc(media_type: str = LAYER, digest: str = D, size: int = 10, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": size, **extra}


def manifest(layers: list[dict[str, Any]], **extra: Any) -> bytes:
    body = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", E, 100),
        "layers": layers,
        **extra,
    }
    return json.dumps(body).encode()


def index(*platforms: str, media_type: str = OCI_INDEX) -> bytes:
    entries = []
    for n, platform in enumerate(platforms):
        os_name, arch, *variant = platform.split("/")
        found = {
            "os": os_name,
            "architecture": arch,
            **({"variant": variant[0]} if variant else {}),
        }
        entries.append(desc(DOCKER_MANIFEST, f"sha256:{n:064x}", 500, platform=found))
    return json.dumps({"schemaVersion": 2, "mediaType": media_type, "manifests": entries}).encode()


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        pytest.param(
            "shop",
            Reference("docker.io", "library/shop", None, None),
            id="a bare name is docker hub's library",
        ),
        pytest.param(
            "registry.example.com/team/shop:1.4",
            Reference("registry.example.com", "team/shop", "1.4", None),
            id="a host, a path and a tag",
        ),
        pytest.param(
            "localhost:5000/shop",
            Reference("localhost:5000", "shop", None, None),
            id="localhost with a port",
        ),
        pytest.param(
            f"127.0.0.1:5000/shop@{D}", Reference("127.0.0.1:5000", "shop", None, D), id="by digest"
        ),
        pytest.param(
            f"docker://[::1]:5000/a/b:t@{D}",
            Reference("[::1]:5000", "a/b", "t", D),
            id="ipv6, tag and digest",
        ),
    ],
)
def test_references_are_read_as_docker_reads_them(ref: str, expected: Reference) -> None:
    assert parse_reference(ref) == expected


@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        pytest.param("Shop:1", "repository name must be lowercase", id="upper case"),
        pytest.param("shop@sha256:abc", "sha256:<64 hex digits>", id="a short digest"),
        pytest.param("shop:-x", "not a valid tag", id="a tag starting with a dash"),
        pytest.param("reg.example.com/", "repository name", id="no path"),
        pytest.param(
            "bad_host.example.com:99999999/x", "not a registry host", id="a port too long"
        ),
    ],
)
def test_malformed_references_are_refused_naming_them(ref: str, reason: str) -> None:
    with pytest.raises(ImageRefused, match=reason) as err:
        parse_reference(ref)
    assert repr(ref) in str(err.value)


def test_pulls_go_by_the_pinned_digest() -> None:
    reference = parse_reference("127.0.0.1:5000/team/shop:1")
    assert reference.source() == "docker://127.0.0.1:5000/team/shop:1"
    assert reference.pinned(D) == f"docker://127.0.0.1:5000/team/shop@{D}"
    assert reference.host == "127.0.0.1"
    assert parse_reference("[::1]:5000/x").host == "::1"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost.example.com", False),
        ("10.0.0.1", False),
        ("registry.example.com", False),
    ],
)
def test_only_loopback_by_its_text_may_go_without_verified_tls(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    flags = tls_flags(host, RegistryAccess(), None, src=True)
    assert flags == (["--src-tls-verify=false"] if loopback else ["--src-tls-verify=true"])


def test_a_ca_is_a_cert_dir_and_archives_have_no_tls() -> None:
    from pathlib import Path

    assert tls_flags("reg.example.com", RegistryAccess(), Path("/c"), src=False) == [
        "--tls-verify=true",
        "--cert-dir=/c",
    ]
    assert tls_flags(None, RegistryAccess(), Path("/c"), src=True) == []
    assert tls_flags("127.0.0.1", RegistryAccess(verify_loopback=True), None, src=True) == [
        "--src-tls-verify=true"
    ]


def test_the_digest_is_the_sha256_of_the_raw_bytes() -> None:
    assert (
        digest_of(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(
            manifest([desc()] * 10_000), "has 10000 layers; the bound is 128$", id="10,000 layers"
        ),
        pytest.param(
            json.dumps({"schemaVersion": 1, "fsLayers": [], "name": "x"}).encode(),
            "docker schema 1 image; push it again",
            id="schema 1",
        ),
        pytest.param(b"\x89PNG", "not JSON", id="not JSON"),
        pytest.param(b"[]", "not a JSON object", id="a list"),
        pytest.param(
            manifest([desc(digest="sha512:" + "a" * 128)]),
            "sha256:<64 hex digits>",
            id="a sha512 layer",
        ),
        pytest.param(manifest([desc(size=-1)]), "has size -1", id="a negative size"),
        pytest.param(
            json.dumps(
                {"schemaVersion": 2, "mediaType": "application/vnd.cncf.helm.config"}
            ).encode(),
            "is not an image manifest",
            id="a helm chart",
        ),
    ],
)
def test_manifests_refused_before_anything_is_copied(raw: bytes, reason: str) -> None:
    with pytest.raises(ImageRefused, match=reason) as err:
        parse_manifest(raw, "reg.example.com/shop:1")
    assert str(err.value).startswith("image reg.example.com/shop:1")


def test_the_layer_count_bound_itself_is_taken() -> None:
    found = parse_manifest(manifest([desc()] * 128), "shop")
    assert isinstance(found, Manifest) and len(found.layers) == 128


@pytest.mark.parametrize(
    ("layers", "max_bytes", "reason"),
    [
        pytest.param(
            [desc("application/vnd.oci.image.layer.nondistributable.v1.tar+gzip")],
            1 << 30,
            r"layer sha256:a+ has media type 'application/vnd\.oci\.image\.layer\.nondistributable",
            id="a foreign layer",
        ),
        pytest.param(
            [desc(size=600)], 500, r"is 700 bytes compressed; the bound is 500", id="too big"
        ),
    ],
)
def test_checks_before_copying(layers: list[dict[str, Any]], max_bytes: int, reason: str) -> None:
    found = parse_manifest(manifest(layers), "shop")
    assert isinstance(found, Manifest)
    with pytest.raises(ImageRefused, match=reason):
        check(found, "shop", max_bytes)


def test_every_unpackable_layer_type_passes() -> None:
    types = [
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    ]
    found = parse_manifest(manifest([desc(kind) for kind in types]), "shop")
    assert isinstance(found, Manifest)
    check(found, "shop", 1 << 30)
    assert found.declared_bytes == 130


def test_a_zstd_layer_is_refused_before_a_blob_is_copied() -> None:
    found = parse_manifest(manifest([desc("application/vnd.oci.image.layer.v1.tar+zstd")]), "shop")
    assert isinstance(found, Manifest)
    with pytest.raises(ImageRefused, match="not zstd yet"):
        check(found, "shop", 1 << 30)


def test_a_layer_with_urls_to_fetch_it_from_is_refused() -> None:
    layer = {**desc("application/vnd.oci.image.layer.v1.tar"), "urls": ["http://10.0.0.1/x"]}
    with pytest.raises(ImageRefused, match="names URLs to fetch it from"):
        parse_manifest(manifest([layer]), "shop")


@pytest.mark.parametrize(
    ("platforms", "want", "picked"),
    [
        pytest.param(["linux/arm64/v8", "linux/amd64"], "linux/amd64", 1, id="amd64 after arm64"),
        pytest.param(
            ["linux/arm64/v8", "linux/amd64"], "linux/arm64", 0, id="arm64 takes any variant"
        ),
        pytest.param(["linux/arm/v6", "linux/arm/v7"], "linux/arm/v7", 1, id="a wanted variant"),
    ],
)
def test_an_index_gives_the_node_platform(platforms: list[str], want: str, picked: int) -> None:
    found = parse_manifest(index(*platforms, media_type=DOCKER_LIST), "shop")
    assert isinstance(found, Index)
    assert pick(found, want, "shop").digest == f"sha256:{picked:064x}"


def test_an_index_without_the_platform_names_those_it_has() -> None:
    found = parse_manifest(index("linux/s390x", "unknown/unknown", "linux/arm64/v8"), "shop:1")
    assert isinstance(found, Index)
    with pytest.raises(
        ImageRefused,
        match=r"^image shop:1 has no linux/amd64 image; it has linux/arm64/v8, linux/s390x$",
    ):
        pick(found, "linux/amd64", "shop:1")


def record(config: dict[str, Any]) -> Any:
    found = parse_manifest(manifest([desc()]), "shop")
    assert isinstance(found, Manifest)
    raw = json.dumps(config).encode()
    return image_record(
        "shop", digest=D, manifest_digest=D, manifest=found, config_raw=raw, platform="linux/amd64"
    )


def test_a_record_from_the_stored_config() -> None:
    made = record(
        {
            "os": "linux",
            "architecture": "amd64",
            "config": {
                "Entrypoint": None,
                "Cmd": ["serve"],
                "ExposedPorts": {"80/tcp": {}, "53/udp": {}},
            },
        }
    )
    assert (made.config.entrypoint, made.config.cmd) == ([], ["serve"])
    assert made.config.exposed_ports == ["53/udp", "80/tcp"]
    assert made.platform == "linux/amd64"
    assert made.size == 10


def test_a_config_of_another_platform_or_out_of_bounds_is_refused() -> None:
    with pytest.raises(ImageRefused, match="is a linux/arm64 image; this cluster runs linux/amd64"):
        record({"os": "linux", "architecture": "arm64"})
    with pytest.raises(ImageRefused, match=r"config\.working_dir"):
        record({"config": {"WorkingDir": "x" * 2000}})


def test_skopeo_errors_are_one_line_without_secrets() -> None:
    output = (
        b'time="2026" level=info msg="Copying blob"\n'
        b'time="2026" level=fatal msg="Error parsing image name \\"docker://r/x\\": '
        b'reading manifest: unauthorized for deployer:hunter2"\n'
    )
    assert summary(output, ("hunter2",)) == "reading manifest: unauthorized for deployer:***"
    assert summary(b"plain last words\n\n") == "plain last words"
    login = json.loads(auth_file("reg.example.com:5000", Credentials("me", "pw")))
    assert login == {"auths": {"reg.example.com:5000": {"auth": "bWU6cHc="}}}
