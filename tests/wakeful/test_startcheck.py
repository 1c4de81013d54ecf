"""The store's side of a piece's start check (`wakeful.startcheck`): a store that is
unavailable is waited out, one that refuses tokens/ leaves the check to the control API, any
other store error ends the start; and what each token found means (`token_misplaced`)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from wakeful.domain import keys
from wakeful.domain.models import Role, Token
from wakeful.startcheck import TokenRefused, check_token, stored, token_misplaced
from wakeful.store import Store, StoreError, Unavailable, open_store
from wakeful.store.errors import Forbidden
from wakeful.store.tokenbook import digest

pytestmark = pytest.mark.anyio
SECRET = "s" * 43


class Failing:
    """The memory store, whose `list` raises `errors` first, one a call."""

    def __init__(self, store: Store, *errors: StoreError) -> None:
        self._store = store
        self._errors = list(errors)
        self.calls = 0

    async def list(self, prefix: str, model: Any) -> Any:
        self.calls += 1
        if self._errors:
            raise self._errors.pop(0)
        return await self._store.list(prefix, model)


class Answers:
    def __init__(self, said: tuple[str, str] | str | None) -> None:
        self._said = said

    async def whoami(self) -> tuple[str, str] | str | None:
        return self._said


async def with_token(store: Store, name: str, role: Role) -> None:
    token = Token(name=name, role=role, id="0a1b2c3d", sha256=digest(SECRET))
    await store.put(keys.token(name), token)


async def test_an_unavailable_store_is_waited_out(caplog: pytest.LogCaptureFixture) -> None:
    async with open_store("memory://") as store:
        await with_token(store, "n1", Role.NODE)
        failing = Failing(store, Unavailable("etcd list: no answer in time"))
        with anyio.fail_after(5):
            found = await stored(failing, SECRET, "node n1")  # type: ignore[arg-type]
    assert found == ("n1", Role.NODE) and failing.calls == 2
    assert "node n1: cannot read the tokens yet, waiting: etcd list: no answer" in caplog.text


async def test_a_store_refusing_tokens_leaves_the_check_to_the_control_api() -> None:
    """A node under `wakeful etcd-auth`: its role reads no tokens/. It retried for ever."""
    async with open_store("memory://") as store:
        refusing = Failing(store, Forbidden("etcd list: permission denied"))
        with anyio.fail_after(5):
            await check_token(Answers(("n1", "node")), refusing, SECRET, Role.NODE, "n1", "etcd")  # type: ignore[arg-type]
            with pytest.raises(TokenRefused, match="its token was made for node 'n1'"):
                await check_token(
                    Answers(("n1", "node")),
                    Failing(store, Forbidden("denied")),  # type: ignore[arg-type]
                    SECRET,
                    Role.NODE,
                    "n2",
                    "etcd",
                )


async def test_any_other_store_error_ends_the_start() -> None:
    async with open_store("memory://") as store:
        broken = Failing(store, StoreError("etcd list: UNAUTHENTICATED"))
        with pytest.raises(StoreError, match="UNAUTHENTICATED"), anyio.fail_after(5):
            await check_token(Answers(None), broken, SECRET, Role.NODE, "n1", "etcd")  # type: ignore[arg-type]
    assert broken.calls == 1


@pytest.mark.parametrize(
    ("found", "role", "name", "said"),
    [
        pytest.param(None, Role.NODE, "n1", "its token is not in the store it uses (S)", id="none"),
        pytest.param(("n1", Role.NODE), Role.NODE, "n1", None, id="its own"),
        pytest.param(("admin", Role.ADMIN), Role.NODE, "n1", None, id="the admin's"),
        pytest.param(("edge", Role.INGRESS), Role.INGRESS, "0.0.0.0:80", None, id="ingress"),
        pytest.param(
            ("n1", Role.NODE), Role.NODE, "n2", "its token was made for node 'n1'", id="another"
        ),
        pytest.param(
            ("n1", Role.NODE),
            Role.INGRESS,
            "0.0.0.0:80",
            "its token is a node token ('n1'); give it an ingress token",
            id="a node's for an ingress",
        ),
    ],
)
def test_what_a_token_found_means(
    found: tuple[str, Role] | None, role: Role, name: str, said: str | None
) -> None:
    why = token_misplaced(found, role, name, "S")
    assert why == said if said is None else why is not None and why.startswith(said)
