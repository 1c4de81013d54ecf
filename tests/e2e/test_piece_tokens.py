"""`wakeful node` and `wakeful ingress` apart check their token at their start, before they take
sandboxes or requests: the control API takes it, and the store the piece uses holds it as the
piece's. Before, the second walkthrough met a node started without WAKEFUL_STORE_URL, which ran
on a SQLite store of its own (`node n2 running`, and no control plane ever saw it), and a node
given another node's token, which started and could fetch neither its sandboxes' secrets nor
push their logs. Each now ends with one line naming what to do."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.control import running_control_plane
from tests.support.up import WAKEFUL
from wakeful.store import open_store
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio


@dataclass
class Plane:
    api: str
    store_url: str
    node: str
    """Node n1's token."""
    ingress: str


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    """A control plane on a SQLite store file, with a token for node n1 and one ingress."""
    url = f"sqlite:///{tmp_path / 'plane.db'}"
    async with (
        open_store(url, shared=True) as store,
        running_control_plane(tmp_path / "plane", store=store) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        made = {}
        for name, role in (("n1", "node"), ("edge", "ingress")):
            answer = await http.post(
                "/v1/tokens",
                json={"name": name, "role": role},
                headers={"Authorization": f"Bearer {running.token}"},
            )
            assert answer.status_code == 201, answer.text
            made[role] = answer.json()["secret"]
        yield Plane(running.url, url, made["node"], made["ingress"])


async def piece(tmp_path: Path, role: str, variables: dict[str, str]) -> tuple[int, str]:
    """`wakeful ROLE` run in `tmp_path` with only `variables` of wakeful's: its exit status and
    what it printed (it is expected to end at once)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
    env.update(variables)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*WAKEFUL, role],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = await anyio.to_thread.run_sync(run)
    return done.returncode, done.stdout + done.stderr


def node_env(plane: Plane, tmp_path: Path, name: str, token: str) -> dict[str, str]:
    return {
        "WAKEFUL_API": plane.api,
        "WAKEFUL_NODE_NAME": name,
        "WAKEFUL_NODE_TOKEN": token,
        "WAKEFUL_DATA_DIR": str(tmp_path / f"data-{name}"),
        "WAKEFUL_ISOLATION": "none",
    }


def ingress_env(plane: Plane, token: str) -> dict[str, str]:
    return {
        "WAKEFUL_API": plane.api,
        "WAKEFUL_INGRESS_TOKEN": token,
        "WAKEFUL_LISTEN": f"127.0.0.1:{free_port()}",
        "WAKEFUL_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
    }


async def test_a_node_on_a_store_of_its_own_stops_naming_it(plane: Plane, tmp_path: Path) -> None:
    """No WAKEFUL_STORE_URL: the node's store is `.wakeful/store.db` where it started."""
    status, said = await piece(tmp_path, "node", node_env(plane, tmp_path, "n1", plane.node))
    own = tmp_path / ".wakeful" / "store.db"
    assert status == 1, said
    assert (
        f"wakeful: error: node n1: its token is not in the store it uses (sqlite:///{own}): "
        "that store is not the control plane's, or the token was revoked; set "
        "WAKEFUL_STORE_URL (and WAKEFUL_STORE_NAMESPACE) to the activator's"
    ) in said, said
    assert "running" not in said and "Traceback" not in said


@pytest.mark.parametrize(
    ("name", "role", "said"),
    [
        pytest.param(
            "n2",
            "node",
            "node n2: its token was made for node 'n1', and it runs as 'n2' (WAKEFUL_NODE_NAME)"
            ": the control API would give it neither its sandboxes' secrets nor their logs; set "
            "WAKEFUL_NODE_NAME=n1, or give it a token of its own",
            id="another node's",
        ),
        pytest.param(
            "n1",
            "ingress",
            "node n1: its token is an ingress token ('edge'); give it a node token (`wakeful "
            "tokens create --role node --name n1`)",
            id="an ingress token",  # whoami answers any role: the role is checked here
        ),
    ],
)
async def test_a_node_with_a_token_not_its_own_stops_naming_whose_it_is(
    plane: Plane, tmp_path: Path, name: str, role: str, said: str
) -> None:
    token = plane.node if role == "node" else plane.ingress
    variables = {**node_env(plane, tmp_path, name, token), "WAKEFUL_STORE_URL": plane.store_url}
    status, out = await piece(tmp_path, "node", variables)
    assert status == 1, out
    assert f"wakeful: error: {said}" in out, out
    assert "running" not in out and "Traceback" not in out


async def test_an_ingress_on_a_store_of_its_own_or_with_a_refused_token_stops(
    plane: Plane, tmp_path: Path
) -> None:
    """An ingress on a store of its own routed no app (404 for every host); one whose token
    the control API refuses said `ingress listening` and answered 503 to every request."""
    status, said = await piece(tmp_path, "ingress", ingress_env(plane, plane.ingress))
    assert status == 1, said
    assert ": its token is not in the store it uses (sqlite:///" in said, said
    variables = {**ingress_env(plane, "not-a-token"), "WAKEFUL_STORE_URL": plane.store_url}
    status, said = await piece(tmp_path, "ingress", variables)
    assert status == 1, said
    assert ": the control API refused its token (401)" in said, said
    assert "--role ingress --name NAME` printed (WAKEFUL_INGRESS_TOKEN)" in said
    assert "listening" not in said and "Traceback" not in said
