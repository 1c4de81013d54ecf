"""What the agent finds out about its machine (`wakeful/node/jail/detect.py`) from what it
reads: the container marks, the capabilities it holds, and whether a probe sandbox dropped to
its uid with no capabilities (`dropped`, as a table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wakeful.node.jail.detect import (
    CONTAINER_HINT,
    dropped,
    in_container,
    missing_capabilities,
    proc_status,
)

UID = 400_000
UIDS = f"Uid:\t{UID}\t{UID}\t{UID}\t{UID}"
DROPPED = f"Name:\tcat\n{UIDS}\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n"


@pytest.mark.parametrize(
    ("returncode", "status", "expected"),
    [
        pytest.param(0, DROPPED, True, id="its uid four times, no capabilities: dropped"),
        pytest.param(1, DROPPED, False, id="the probe failed: not dropped, whatever it printed"),
        pytest.param(
            0,
            DROPPED.replace(UIDS, f"Uid:\t{UID}\t{UID}\t0\t{UID}"),
            False,
            id="the saved uid still root: not dropped",
        ),
        pytest.param(
            0,
            DROPPED.replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff"),
            False,
            id="the bounding set kept (no CAP_SETPCAP to drop it): not dropped",
        ),
        pytest.param(
            0,
            DROPPED.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000000400"),
            False,
            id="an effective capability left: not dropped",
        ),
        pytest.param(
            0,
            DROPPED.replace("CapEff:\t0000000000000000\n", ""),
            False,
            id="no CapEff printed: not dropped",
        ),
        pytest.param(0, "", False, id="nothing printed: not dropped"),
    ],
)
def test_dropped(returncode: int, status: str, expected: bool) -> None:
    assert dropped(returncode, proc_status(status), UID) is expected


def test_a_container_is_told_by_its_marks(tmp_path: Path) -> None:
    """In a container, a refusal names the container flags (CONTAINER_HINT), not host advice."""
    absent, present = tmp_path / "absent", tmp_path / ".containerenv"
    present.touch()
    assert not in_container({}, absent)
    assert in_container({"container": "oci"}, absent)  # wakeful's image sets it
    assert in_container({}, present)  # podman's mark
    assert "--cap-add SYS_ADMIN,NET_ADMIN" in CONTAINER_HINT
    assert "WAKEFUL_ISOLATION=none" in CONTAINER_HINT


def test_the_capabilities_sandboxes_need_are_read_from_the_status(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t00000000002011eb\n")  # the nine
    assert missing_capabilities(status) == []
    status.write_text("Name:\tx\nCapEff:\t00000000002010eb\n")  # no SETPCAP (bit 8)
    assert missing_capabilities(status) == ["SETPCAP"]
