"""Role tokens in the store (invariant 17): a revoked or rotated secret is refused, whether
the change came through the control API or straight into the store (then once the watch
delivers it: the wait is on the token book's own signal, never a sleep); the store holds
digests only; a rotated admin token stays retired across restarts; no secret reaches a log."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.control import TOKEN, Running, running_control_plane
from wakeful.activator.credentials import install_token
from wakeful.domain import keys
from wakeful.domain.models import UP_INGRESS_TOKEN, Role, Token
from wakeful.store import Delete, Put, open_store, sqlite_url
from wakeful.store.tokenbook import digest

pytestmark = pytest.mark.anyio


async def call(running: Running, token: str, path: str = "/v1/tokens") -> int:
    async with httpx.AsyncClient(base_url=running.url) as http:
        answer = await http.get(path, headers={"Authorization": f"Bearer {token}"})
    return answer.status_code


async def admin(running: Running, method: str, path: str, **kwargs: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=running.url) as http:
        return await http.request(
            method, path, headers={"Authorization": f"Bearer {running.token}"}, **kwargs
        )


async def make(running: Running, name: str, role: str = "admin") -> str:
    """A new token's secret (an admin one by default: it may call GET /v1/tokens)."""
    made = await admin(running, "POST", "/v1/tokens", json={"name": name, "role": role})
    assert made.status_code == 201, made.text
    secret: str = made.json()["secret"]
    return secret


async def test_a_token_revoked_or_rotated_through_the_api_is_refused_when_the_answer_is_back(
    tmp_path: Path,
) -> None:
    async with running_control_plane(tmp_path) as running:
        old = await make(running, "ci")
        assert await call(running, old) == 200
        rotated = await admin(running, "POST", "/v1/tokens/ci/rotate")
        assert rotated.status_code == 200 and rotated.json()["effective"]
        new = rotated.json()["secret"]
        assert new != old
        assert await call(running, old) == 401
        assert await call(running, new) == 200
        revoked = await admin(running, "DELETE", "/v1/tokens/ci")
        assert revoked.status_code == 200
        assert revoked.json() == {"name": "ci", "effective": True}
        assert await call(running, new) == 401
        assert (await admin(running, "GET", "/v1/tokens")).json()[0]["name"] == "admin"


async def test_a_token_removed_or_changed_in_the_store_is_refused_once_the_watch_delivers_it(
    tmp_path: Path,
) -> None:
    """Another writer (a second control plane, an operator with etcdctl): the cache follows
    the store through the reflector, so no request path reads the store."""
    async with running_control_plane(tmp_path) as running:
        book = running.plane.tokens
        gone, changed = await make(running, "gone"), await make(running, "changed")
        assert await call(running, gone) == 200 and await call(running, changed) == 200
        revision = await running.store.txn([], [Delete(keys.token("gone"))])
        with anyio.fail_after(10):
            await book.caught_up(revision)
        assert await call(running, gone) == 401
        current = await running.store.get(keys.token("changed"), Token)
        assert current is not None
        replacement = "a-new-secret-written-by-someone-else"
        revision = await running.store.txn(
            [],
            [
                Put(
                    keys.token("changed"),
                    current.value.model_copy(update={"sha256": digest(replacement)}),
                )
            ],
        )
        with anyio.fail_after(10):
            await book.caught_up(revision)
        assert await call(running, changed) == 401
        assert await call(running, replacement) == 200


async def test_the_store_holds_digests_never_secrets(tmp_path: Path) -> None:
    """On the SQLite store: the database and its WAL, read as bytes, hold each token's sha256
    and none of the secrets, the bootstrap admin token's included."""
    database = tmp_path / "store.db"
    async with running_control_plane(tmp_path, store_url=sqlite_url(database)) as running:
        secrets = [TOKEN, await make(running, "n1", "node"), await make(running, "i1", "ingress")]
        rotated = await admin(running, "POST", "/v1/tokens/n1/rotate")
        secrets.append(rotated.json()["secret"])
        admin_now = await admin(running, "POST", "/v1/tokens/admin/rotate")
        secrets.append(admin_now.json()["secret"])
        listed = await running.store.list(keys.TOKENS, Token)
        digests = {item.value.sha256 for item in listed.items}
    stored = store_bytes(tmp_path)
    assert len(digests) == 3 and all(d.encode() in stored for d in digests)
    assert {digest(s) for s in secrets[2:]} <= digests
    for secret in secrets:  # nor the secret, nor its first 16 bytes in hex
        assert secret.encode() not in stored
        assert secret.encode()[:16].hex().encode() not in stored


def store_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.glob("store.db*")))


async def test_a_rotated_admin_token_stays_refused_after_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`wakeful activator` with the old WAKEFUL_TOKEN still set: it bootstraps nothing once the
    store holds an admin token, until `--reset-admin-token` says so."""
    caplog.set_level(logging.DEBUG)
    async with open_store("memory://") as store:
        async with running_control_plane(tmp_path, store=store) as running:
            rotated = await admin(running, "POST", "/v1/tokens/admin/rotate")
            new = rotated.json()["secret"]
            assert rotated.json()["written_to"] is None
            assert await call(running, TOKEN) == 401
            assert await call(running, new) == 200
        async with running_control_plane(tmp_path, store=store) as running:
            assert await call(running, TOKEN) == 401
            assert await call(running, new) == 200
        assert "WAKEFUL_TOKEN is not the admin token in the store" in caplog.text
        async with running_control_plane(tmp_path, store=store, replace_admin=True) as running:
            assert await call(running, TOKEN) == 200
            assert await call(running, new) == 401
        assert "the admin token was replaced by the bootstrap token" in caplog.text
    assert TOKEN not in caplog.text and new not in caplog.text


async def test_no_secret_reaches_a_log_line_or_an_error_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        async with running_control_plane(tmp_path) as running:
            secret = await make(running, "n1", "node")
            answers = [
                await admin(running, "POST", "/v1/tokens/n1/rotate"),
                await admin(running, "POST", "/v1/tokens", json={"name": "n1", "role": "node"}),
                await admin(running, "DELETE", "/v1/tokens/n1"),
            ]
            rotated = answers[0].json()["secret"]
            async with httpx.AsyncClient(base_url=running.url) as http:
                for token in (secret, rotated, running.token + "x"):
                    answers.append(
                        await http.post("/v1/deploys", headers={"Authorization": f"Bearer {token}"})
                    )
    assert [a.status_code for a in answers] == [200, 409, 200, 401, 401, 401]
    for shown in [caplog.text, *(a.text for a in answers[1:])]:
        for token in (secret, rotated, running.token):
            assert token not in shown


async def test_a_new_admin_token_that_cannot_be_written_to_its_file_is_shown_instead(
    tmp_path: Path,
) -> None:
    """The store holds the new admin secret before the file does: when the file cannot be
    written, the answer carries the secret, so nobody is locked out."""

    def unwritable(secret: str) -> str:
        raise PermissionError(13, "Permission denied", str(tmp_path / "token"))

    async with running_control_plane(tmp_path, write_admin=unwritable) as running:
        rotated = await admin(running, "POST", "/v1/tokens/admin/rotate")
        assert rotated.status_code == 200, rotated.text
        secret = rotated.json()["secret"]
        assert await call(running, secret) == 200
        assert await call(running, TOKEN) == 401


async def test_the_up_workers_token_cannot_be_made_or_rotated_through_the_api(
    tmp_path: Path,
) -> None:
    """`up-ingress` is `wakeful up`'s to make at each start (its secret is in its workers'
    environment alone): a user's token of that name would be replaced at the next start."""
    async with running_control_plane(tmp_path) as running:
        made = await admin(
            running, "POST", "/v1/tokens", json={"name": UP_INGRESS_TOKEN, "role": "admin"}
        )
        assert made.status_code == 409 and "wakeful up" in made.text
        await install_token(running.store, UP_INGRESS_TOKEN, Role.INGRESS, 0.0)
        rotated = await admin(running, "POST", f"/v1/tokens/{UP_INGRESS_TOKEN}/rotate")
        assert rotated.status_code == 409
        assert (await admin(running, "DELETE", f"/v1/tokens/{UP_INGRESS_TOKEN}")).status_code == 200
