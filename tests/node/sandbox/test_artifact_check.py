"""A node checks an artifact's bytes against its sha256 before it unpacks them, whichever
`Artifacts` served them: here the control plane's own files (`LocalArtifacts`, as in
`wakeful up`), one of them changed on disk after its upload."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import anyio
import pytest

from tests.support.node import place, put_hello, status_of
from wakeful.aio.packing import pack
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.states import StateKeeper
from wakeful.domain.artifacts import ArtifactError, digest_of
from wakeful.domain.models import AppSpec, HealthCheck, SandboxStatus
from wakeful.node.agent import NodeAgent
from wakeful.node.sandbox.workdir import fetch_packed, fill_workdir
from wakeful.node.settings import NodeSettings
from wakeful.node.testing import FakeSecrets
from wakeful.store import open_store

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[3] / "examples" / "hello"


def tamper(tmp_path: Path, artifacts_dir: Path, digest: str) -> bytes:
    """Replace the stored artifact with another app that would boot just as well."""
    other = tmp_path / "other"
    shutil.copytree(HELLO, other)
    with (other / "app.py").open("a") as handle:
        handle.write("\n# changed after the upload\n")
    swapped = pack(other)
    (artifacts_dir / f"{digest}.tar.gz").write_bytes(swapped)
    return swapped


async def test_a_tampered_artifact_is_refused_and_its_sandbox_is_dead_with_the_reason(
    tmp_path: Path,
) -> None:
    async with open_store("memory://") as store:
        artifacts = LocalArtifacts(tmp_path / "artifacts")
        digest = await artifacts.put(pack(HELLO))
        swapped = tamper(tmp_path, tmp_path / "artifacts", digest)
        spec = AppSpec(
            command=[sys.executable, "app.py"],
            health=HealthCheck(path="/healthz", timeout=10),
            shutdown_timeout=5,
        )
        await put_hello(store, spec, digest)
        settings = NodeSettings(
            store_url="memory://", node_name="n1", data_dir=tmp_path / "node", node_ttl=2
        )
        agent = NodeAgent(
            store,
            settings,
            artifacts,
            StateKeeper(store, artifacts).for_node(settings.node_name),
            FakeSecrets(),
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run)
            await agent.wait_registered()
            await place(store, "sb-1", "hello-v1")
            dead = await status_of(store, "sb-1", SandboxStatus.DEAD, SandboxStatus.RUNNING)
            tasks.cancel_scope.cancel()
    assert dead.status is SandboxStatus.DEAD, dead
    assert f"artifact {digest} does not match its sha256" in dead.last_log
    assert digest_of(swapped) in dead.last_log
    assert not list((tmp_path / "node").rglob("app.py")), "nothing was unpacked"


async def test_an_intact_artifact_unpacks_into_a_private_tree(tmp_path: Path) -> None:
    artifacts = LocalArtifacts(tmp_path / "artifacts")
    digest = await artifacts.put(pack(HELLO))
    workdir = tmp_path / "sb" / "app"
    fill_workdir(workdir, await fetch_packed(artifacts, digest))
    assert (workdir / "app.py").read_text() == (HELLO / "app.py").read_text()
    for path in [workdir, *workdir.rglob("*")]:
        assert path.stat().st_mode & 0o077 == 0, path
    tamper(tmp_path, tmp_path / "artifacts", digest)
    with pytest.raises(ArtifactError, match=digest):
        fill_workdir(tmp_path / "sb" / "app", await fetch_packed(artifacts, digest))
