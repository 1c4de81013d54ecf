"""How the CLI shows the control API's answers."""

from __future__ import annotations

from typing import Any

import pytest

from wakeful.tables import node_line, pool_table, version_lines


def pool(name: str, state: str, desired: int) -> dict[str, Any]:
    return {
        "pool": name,
        "app": "web",
        "version": name.rpartition("-")[2],
        "state": state,
        "desired_instances": desired,
        "live": 1,
        "ready": 1,
        "suspended": 2,
        "leased": 0,
        "overflow": 0,
        "waiters": 0,
        "crashes": 3,
    }


def test_no_pools_is_a_header_alone() -> None:
    assert pool_table([]) == [
        "POOL  APP  VERSION  STATE  DESIRED  LIVE  READY  SUSPENDED  LEASED  OVERFLOW  WAITERS  "
        "CRASHES"
    ]


def test_a_retired_pool_shows_no_desired_size_and_columns_line_up() -> None:
    shown = pool_table([pool("web-v1", "retired", 4), pool("web-v10", "active", 12)])
    assert [line.split() for line in shown[1:]] == [
        ["web-v1", "web", "v1", "retired", "-", "1", "1", "2", "0", "0", "0", "3"],
        ["web-v10", "web", "v10", "active", "12", "1", "1", "2", "0", "0", "0", "3"],
    ]
    assert shown[0].index("STATE") == shown[1].index("retired") == shown[2].index("active")


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        ({"evacuating": True, "cordoned": True, "registered": True}, "n1  evacuating  sandboxes=2"),
        ({"evacuating": False, "cordoned": True, "registered": True}, "n1  cordoned  sandboxes=2"),
        (
            {"evacuating": False, "cordoned": False, "registered": False},
            "n1  not running  sandboxes=2",
        ),
        (
            {"evacuating": False, "cordoned": True, "registered": False},
            "n1  not running, cordoned  sandboxes=2",
        ),
    ],
    ids=["evacuating", "cordoned", "not registered", "stopped"],
)
def test_a_node_shows_its_drain_state(flags: dict[str, bool], shown: str) -> None:
    assert node_line({"name": "n1", "sandboxes": 2, **flags}).startswith(shown + "  isolation")


def test_a_node_says_how_it_isolates_and_what_it_cannot_enforce() -> None:
    node = {"name": "n1", "sandboxes": 0, "cordoned": False, "evacuating": False}
    described = "bwrap, agent's uid, rlimits; network not isolated"
    shown = node_line({**node, "registered": True, "isolation": described})
    assert shown.endswith(f"isolation: {described}")
    assert node_line({**node, "registered": False}).endswith("isolation: unknown")


def test_a_node_with_suspended_sandboxes_says_what_they_hold_of_its_cap() -> None:
    node = {"name": "n1", "sandboxes": 3, "cordoned": False, "evacuating": False}
    shown = node_line(
        {
            **node,
            "registered": True,
            "suspended": 2,
            "suspended_memory": 96 << 20,
            "suspended_memory_cap": 1 << 30,
        }
    )
    assert shown.splitlines()[1] == "  suspended: 2 holding 96 MiB of 1024 MiB"
    over = node_line(
        {
            **node,
            "registered": True,
            "suspended": 1,
            "suspended_memory": 165 << 20,
            "suspended_memory_cap": 100 << 20,
            "evict_bytes": 65 << 20,
            "evict": [{"sandbox": f"hog-{n}", "memory": 33 << 20} for n in range(1, 6)],
        }
    )
    assert over.splitlines()[1] == (
        "  suspended: 1 holding 165 MiB of 100 MiB"
        " (asks to give up 65 MiB; longest suspended first: hog-1, hog-2, hog-3, +2 more)"
    )
    pressed = node_line(
        {
            **node,
            "registered": True,
            "suspended": 1,
            "suspended_memory": 22 << 20,
            "suspended_memory_cap": 50 << 20,
            "memory_pressure": True,
            "evict_bytes": 1,
            "evict": [{"sandbox": "hog-1", "memory": 22 << 20}],
        }
    )
    assert pressed.splitlines()[1] == (
        "  suspended: 1 holding 22 MiB of 50 MiB (asks to give up less than 1 MiB;"
        " memory pressure: one more each pass; longest suspended first: hog-1)"
    )
    assert len(node_line({**node, "registered": True}).splitlines()) == 1


def test_the_active_version_is_marked() -> None:
    app = {"name": "web", "active_version": "v2", "versions": ["v1", "v2"]}
    assert version_lines(app) == ["  v1", "* v2"]


def test_each_version_says_how_it_was_made_and_what_image_it_runs() -> None:
    app = {
        "name": "web",
        "active_version": "v2",
        "versions": ["v1", "v2"],
        "made": {"v1": "directory", "v2": "stack python (requirements.txt)"},
        "images": {"v2": "built:web@sha256:ab"},
    }
    assert version_lines(app) == [
        "  v1  directory",
        "* v2  stack python (requirements.txt)  built:web@sha256:ab",
    ]


def test_a_drained_node_shows_its_progress_and_a_node_the_states_it_keeps() -> None:
    node = {"name": "n1", "sandboxes": 1, "cordoned": True, "evacuating": True}
    progress = {"owned": 1, "running": 0, "moving": 1, "archived": 0, "moved": 3, "failed": 0}
    kept = [{"app": "notes", "sandbox": "s1", "reason": "over the bound; kept in /k"}]
    shown = node_line({**node, "registered": True, "progress": progress, "kept": kept})
    first, second = shown.splitlines()
    assert "sandboxes=1  owned=1 running=0 moving=1 archived=0 moved=3 failed=0" in first
    assert second == "  keeps the state of notes, not handed back: over the bound; kept in /k"


def test_a_kept_reason_that_quotes_an_app_stays_on_its_line() -> None:
    """A reason can quote the app's state (a member name in a refused archive): its newline
    and escape sequences are shown, not obeyed, so it cannot add a line of its own."""
    node = {"name": "n1", "sandboxes": 0, "cordoned": False, "evacuating": False}
    kept = [{"app": "notes", "reason": "refused: 'a\n\x1b[2Kn2  ready  sandboxes=0'"}]
    shown = node_line({**node, "registered": True, "kept": kept})
    assert shown.splitlines()[1:] == [
        "  keeps the state of notes, not handed back: refused: 'a\\n\\x1b[2Kn2  ready  sandboxes=0'"
    ]
