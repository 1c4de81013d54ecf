"""What becomes of a leftover file in a node's `states/` (`stale_fate`,
`wakeful/node/state/archives.py`), as a table, and the sweep that carries it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from wakeful.node.state.archives import Fate, LocalArchives, stale_fate

HELD = {"notes.3.tar.gz"}
IN_HAND = {"blog.5.tar.gz"}
RELEASED = {"wiki.2.tar.gz"}


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param("notes.3.tar.gz", Fate.KEEP, id="the archive of a state held here: kept"),
        pytest.param(
            "notes.3.tar.gz.part", Fate.KEEP, id="a partial write of a state held here: kept"
        ),
        pytest.param(
            "blog.5.tar.gz",
            Fate.KEEP,
            id="a runner has it in hand, though the listing did not show it: kept",
        ),
        pytest.param("blog.5.tar.gz.part", Fate.KEEP, id="a runner's archive being written: kept"),
        pytest.param(
            "wiki.2.tar.gz", Fate.DELETE, id="released with this archive, then killed: deleted"
        ),
        pytest.param(
            "wiki.1.tar.gz.part", Fate.DELETE, id="a partial write of a state not held: deleted"
        ),
        pytest.param(
            "wiki.1.tar.gz",
            Fate.SET_ASIDE,
            id="a state taken back without this archive: set aside, maybe the only copy",
        ),
    ],
)
def test_stale_fate(entry: str, expected: Fate) -> None:
    assert stale_fate(entry, HELD, IN_HAND, RELEASED) is expected


def test_the_sweep_deletes_and_sets_aside_as_the_table_says(tmp_path: Path) -> None:
    archives = LocalArchives(tmp_path, 1 << 20)
    archives.dir.mkdir()
    for name in ("notes.3.tar.gz", "wiki.2.tar.gz", "wiki.1.tar.gz.part", "wiki.1.tar.gz"):
        (archives.dir / name).write_bytes(b"x")
    archives.forget_stale(HELD, RELEASED, IN_HAND)
    assert sorted(p.name for p in archives.dir.iterdir()) == ["notes.3.tar.gz"]
    assert sorted(p.name for p in archives.kept.iterdir()) == ["wiki.1.tar.gz"]
