"""The book as the node agent's source under `wakeful up` (`wakeful.up.BookSecrets`): the
values of a sandbox the node is starting; the book's refusals become the node's
`SecretsRefused` (not tried again) and a key it cannot use an `OSError` (tried again, as an
artifact that cannot be fetched is); neither message holds a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.placing import put_placed
from wakeful.domain import keys
from wakeful.domain.models import App, Sandbox
from wakeful.node.secrets import SecretsRefused
from wakeful.secrets.book import SecretBook
from wakeful.secrets.keys import KeyRing
from wakeful.store import open_store
from wakeful.up import BookSecrets

pytestmark = pytest.mark.anyio
PASSWORD = "in-process-never-on-disk"


async def test_the_in_process_source_answers_refuses_and_fails_as_a_node_expects(
    tmp_path: Path,
) -> None:
    async with open_store("memory://") as store:
        ring = KeyRing(store, tmp_path / "keys")
        await ring.start()
        book = SecretBook(store, ring)
        await store.put(keys.app("web"), App(name="web"))
        await book.set("web", {"A": PASSWORD}, by="admin")
        record = Sandbox(id="sb-1", pool="web-v1", app="web", node="n1", owner="n1")
        await put_placed(store, ring, record)
        assert await BookSecrets(book, "n1").env_for("sb-1") == {"A": PASSWORD}
        for node, sandbox_id in [("n2", "sb-1"), ("n1", "gone-1")]:
            with pytest.raises(SecretsRefused) as refused:
                await BookSecrets(book, node).env_for(sandbox_id)
            assert PASSWORD not in str(refused.value)
        # the value's key lost, the placement's kept: sb-1 placed under a new key, the value
        # still sealed under the first (`ring.rotate` alone seals nothing again)
        first = (await ring.current()).value.key
        await ring.rotate()
        await put_placed(store, ring, record)
        (tmp_path / "keys" / f"{first}.key").unlink()
        with pytest.raises(OSError, match="is sealed under key") as failed:
            await BookSecrets(SecretBook(store, KeyRing(store, tmp_path / "keys")), "n1").env_for(
                "sb-1"
            )
        assert PASSWORD not in str(failed.value)
