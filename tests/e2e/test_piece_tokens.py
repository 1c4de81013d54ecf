"""`wakeful node` and `wakeful ingress` apart check their token at their start, before they take
sandboxes or requests: the control API takes it, and the store the piece uses holds it as the
piece's. Before, the second walkthrough met a node started without WAKEFUL_STORE_URL, which ran
on a SQLite store of its own (`node n2 running`, and no control plane ever saw it), and a node
given another node's token, which started and could fetch neither its sandboxes' secrets nor
push their logs. Each now ends with one line naming what to do."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.pieces import Plane, control_plane_with_tokens, ingress_env, node_env, piece

pytestmark = pytest.mark.anyio


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    async with control_plane_with_tokens(tmp_path) as running:
        yield running


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
