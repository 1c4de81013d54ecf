"""A piece (`wakeful node`, `wakeful ingress`) run apart against a real control plane, as a
person on another machine starts it: the plane on a SQLite store file, with a node token and
an ingress token; the piece run with only the WAKEFUL_ variables given."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from tests.support.control import running_control_plane
from tests.support.up import WAKEFUL
from wakeful.store import open_store
from wakeful.store.testing import free_port


@dataclass
class Plane:
    api: str
    store_url: str
    node: str
    """Node n1's token."""
    ingress: str


@contextlib.asynccontextmanager
async def control_plane_with_tokens(tmp_path: Path) -> AsyncIterator[Plane]:
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
