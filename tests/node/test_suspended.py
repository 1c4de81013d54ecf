"""The node's side of the suspended tier: it freezes a sandbox while its record says
`suspended` and thaws it on any other status, and names the longest suspended for the
activator to stop when they hold more than its cap or the machine runs short of memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from wakeful.node.settings import memory_share
from wakeful.node.suspended import evictions, meminfo

GiB = 1 << 30


@pytest.mark.parametrize(
    ("frozen", "cap", "pressure", "wanted"),
    [
        pytest.param([(1, "a", GiB), (2, "b", GiB)], 2 * GiB, False, 0, id="within the cap"),
        pytest.param(
            [(2, "b", GiB), (1, "a", GiB), (3, "c", GiB)],
            2 * GiB,
            False,
            GiB,
            id="past it: what is over",
        ),
        pytest.param(
            [(2, "b", GiB), (1, "a", 3 * GiB), (3, "c", GiB)],
            5 * GiB - 10,
            False,
            10,
            id="what is over, not what the longest suspended holds (it may be pinned)",
        ),
        pytest.param(
            [(2, "b", GiB), (1, "a", GiB), (3, "c", GiB)],
            GiB // 2,
            False,
            3 * GiB - GiB // 2,
            id="far over",
        ),
        pytest.param(
            [(2, "b", GiB), (1, "a", GiB)], 4 * GiB, True, 1, id="pressure: one more a pass"
        ),
        pytest.param([(2, "b", GiB), (1, "a", GiB)], GiB, True, GiB + 1, id="over, and pressure"),
        pytest.param(
            [(2, "b", 0), (1, "a", 0)], 0, True, 1, id="pressure, nothing measured: one still"
        ),
        pytest.param([], 0, True, 0, id="nothing frozen, nothing to give"),
    ],
)
def test_evictions(
    frozen: list[tuple[float, str, int]], cap: int, pressure: bool, wanted: int
) -> None:
    asked, order = evictions(frozen, cap, pressure)
    assert asked == wanted
    if wanted:  # every frozen sandbox, the longest suspended first, to take it from
        assert [f.sandbox for f in order] == [s for _, s, _ in sorted(frozen)]
        assert [f.memory for f in order] == [m for _, _, m in sorted(frozen)]
    else:
        assert order == []


def test_the_cap_is_a_size_or_a_share_of_the_machine() -> None:
    assert memory_share("25%", 8 * GiB) == 2 * GiB
    assert memory_share("1Gi", 8 * GiB) == GiB
    assert memory_share("0%", 8 * GiB) == 0
    for bad in ("101%", "-1%", "lots", "x%"):
        with pytest.raises(ValueError, match=r"share of memory|not a size"):
            memory_share(bad, GiB)


def test_meminfo_reads_total_and_available(tmp_path: Path) -> None:
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       2048 kB\nMemFree:   10 kB\nMemAvailable:   1024 kB\n")
    assert meminfo(path) == (2048 * 1024, 1024 * 1024)
    total, available = meminfo()
    assert 0 < available <= total
