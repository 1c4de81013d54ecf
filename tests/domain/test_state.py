"""The ownership rules of a stateful app's state (wakeful.domain.state), as a table."""

from __future__ import annotations

import pytest

from wakeful.domain import state
from wakeful.domain.models import AppState

DIGEST = "a" * 64
NEWER = "b" * 64


def held(node: str | None = "n1", epoch: int = 5, **more: object) -> AppState:
    return AppState(app="notes", node=node, epoch=epoch, archive=DIGEST, **more)  # type: ignore[arg-type]


def test_release_by_the_holder_at_its_epoch_frees_it_at_the_next_with_its_archive() -> None:
    released = state.release(held(sandbox="s1"), "n1", 5, 100.0, archive=NEWER, size=7)
    assert isinstance(released, AppState)
    assert (released.node, released.epoch, released.sandbox) == (None, 6, None)
    assert (released.archive, released.size, released.archived_epoch) == (NEWER, 7, 5)
    assert released.released_by == "n1"


def test_release_with_nothing_newer_keeps_the_last_archive() -> None:
    released = state.release(held(), "n1", 5, 100.0)
    assert isinstance(released, AppState)
    assert released.archive == DIGEST and released.epoch == 6


@pytest.mark.parametrize(
    ("record", "node", "epoch"),
    [
        pytest.param(held(epoch=6), "n1", 5, id="a stale epoch (taken back and adopted since)"),
        pytest.param(held(node="n2", epoch=5), "n1", 5, id="another node holds it"),
        pytest.param(held(node=None, epoch=6), "n1", 5, id="already released"),
    ],
)
def test_release_or_keep_by_anyone_else_is_refused(record: AppState, node: str, epoch: int) -> None:
    assert isinstance(state.release(record, node, epoch, 1.0, archive=NEWER), state.Stale)
    assert isinstance(state.keep(record, node, epoch, "why"), state.Stale)


def test_adopt_takes_a_free_state_at_the_epoch_read_and_records_where_it_came_from() -> None:
    free = held(node=None, epoch=6, released_by="n1", error="old", kept=False)
    adopted = state.adopt(free, "notes", "n2", "s2", 6, 50.0)
    assert isinstance(adopted, AppState)
    assert (adopted.node, adopted.epoch, adopted.sandbox) == ("n2", 7, "s2")
    assert (adopted.moved_from, adopted.moved_at, adopted.error) == ("n1", 50.0, "")
    # Of two adopters that read epoch 6, the second decides again from what the first wrote.
    assert isinstance(state.adopt(adopted, "notes", "n3", "s3", 6, 51.0), state.Stale)


def test_waking_where_it_slept_is_not_a_move() -> None:
    adopted = state.adopt(held(node=None, epoch=6, released_by="n1"), "notes", "n1", "s", 6, 9.0)
    assert isinstance(adopted, AppState) and adopted.moved_from is None


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(held(node="n1", epoch=6), 6, id="held by a node"),
        pytest.param(held(node=None, epoch=7), 6, id="free at another epoch"),
        pytest.param(None, 3, id="gone, expected at an epoch"),
    ],
)
def test_adopt_of_a_state_not_free_at_the_epoch_read_is_refused(
    record: AppState | None, expected: int
) -> None:
    assert isinstance(state.adopt(record, "notes", "n2", "s", expected, 1.0), state.Stale)


def test_a_fresh_state_starts_at_an_epoch_no_earlier_namesake_held() -> None:
    first = state.adopt(None, "notes", "n1", "s1", 0, 1000.0)
    assert isinstance(first, AppState) and first.epoch == 1_000_000


def test_keep_marks_it_kept_with_the_reason_and_moves_nothing() -> None:
    kept = state.keep(held(), "n1", 5, "too large")
    assert isinstance(kept, AppState)
    assert (kept.node, kept.epoch, kept.kept, kept.error) == ("n1", 5, True, "too large")


def test_take_back_from_a_gone_node_frees_it_with_its_last_archive_and_says_what_was_lost() -> None:
    taken = state.take_back(held(), "n1", 9.0)
    assert isinstance(taken, AppState)
    assert (taken.node, taken.epoch, taken.archive) == (None, 6, DIGEST)
    assert "node n1 was lost" in taken.error
    assert isinstance(state.take_back(held(node="n2"), "n1", 9.0), state.Stale)


def test_a_reason_quoting_undecodable_bytes_is_stored_not_lost() -> None:
    """A state path the app chose can hold bytes that are no UTF-8 (surrogates in Python):
    a keep or release quoting it must still make a record that encodes, or the keep that says
    why the state stays is never written (and the state went back without its data)."""
    why = "its state path 'data/\udcff\udcfe' is not a directory: not archived"
    kept = state.keep(held(), "n1", 5, why)
    assert isinstance(kept, AppState)
    assert "\\udcff" in AppState.model_validate_json(kept.model_dump_json()).error
    released = state.release(held(), "n1", 5, 100.0, error=why + "x" * 5000)
    assert isinstance(released, AppState) and len(released.error) == state.MAX_ERROR
    released.model_dump_json()
