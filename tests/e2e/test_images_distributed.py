"""Apps from images with the pieces as separate processes on etcd (issue 36): the control
plane pulls the image once, at deploy; nodes fetch its blobs from the control plane
(`GET /v1/blobs`), so a node with no route to the registry runs it, and two sandboxes of an
image that listens on one fixed port run side by side on one node."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import start_cluster, wakeful_cli
from tests.support.images import BUSYBOX_CONFIG, OciLayout, busybox_layers
from tests.support.registry import Registry, running_registry
from wakeful.store.testing import EtcdServer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="image apps need a root node agent")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry") as found:
        yield found


def test_nodes_run_an_image_the_registry_served_once_to_the_control_plane(
    etcd_server: EtcdServer, tmp_path: Path, registry: Registry
) -> None:
    layout = OciLayout(tmp_path / "layout")
    record = layout.add_image(
        "site", busybox_layers(index_html=b"from the control plane\n"), BUSYBOX_CONFIG
    )
    ref = registry.push(f"oci:{layout.path}:site", "team/site:1")
    app = tmp_path / "site"
    app.mkdir()
    # Two sandboxes at once (rpi 1, min 2): both listen on the image's own port 8080.
    (app / "wakeful.toml").write_text(
        f'name = "site"\nimage = "{ref}"\n[health]\ntimeout = 30\n'
        "[concurrency]\nrequests_per_instance = 1\nmin_instances = 2\nmax_instances = 2\n"
    )
    with start_cluster(etcd_server.url, tmp_path, nodes=("n1",)) as (api, proxy, env):
        deployed = wakeful_cli(api, env, "deploy", str(app), timeout=120)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert "live" in deployed.stdout, deployed.stdout
        registry.stop()  # from here on, nobody can reach it
        with httpx.Client(base_url=proxy, timeout=60) as client:
            for _ in range(20):
                answer = client.get("/", headers={"Host": "site.localhost"})
                assert answer.status_code == 200, answer.text
                assert answer.text == "from the control plane\n"
        status = wakeful_cli(api, env, "status", "site", "--json")
        assert '"ready": 2' in status.stdout, status.stdout
        # The node record carries the cache's use as of its last periodic report.
        deadline = time.monotonic() + 30
        nodes = wakeful_cli(api, env, "nodes")
        while "images: 1 unpacked" not in nodes.stdout and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = wakeful_cli(api, env, "nodes")
        assert "images: 1 unpacked" in nodes.stdout, nodes.stdout
    # Each blob crossed from the registry once, to the control plane: never to the node.
    for blob in (record.config_digest, *(layer.digest for layer in record.layers)):
        assert registry.blob_gets(blob) == 1, blob
