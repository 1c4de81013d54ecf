"""`since` and `grep` over an app's 1,000,000 lines (issue 40), asked of a real `wakeful
activator` through its control API: each answer exactly the lines asked for, and the server's
memory (VmRSS, sampled while it answers) grows by less than 50 MiB. The directory and the
questions are `bench.logs_read`'s, which measures the answer times against their goal of 1 s;
here they are printed only (the suite runs beside a CPU hog)."""

from __future__ import annotations

from pathlib import Path

from bench.logs_read import DECOYS, MARKERS, ask, baseline, build, questions, serving

MAX_GROWTH = 50 << 20


def test_since_and_grep_over_a_million_lines_answer_exactly_in_bounded_memory(
    tmp_path: Path,
) -> None:
    built = build(tmp_path / "logs")
    # What is asked of: many segments, all but the newest closed and gzipped; the last minute
    # a few thousand lines; the marker in a few lines' text, and outside the text of others
    # (a grep of the bytes alone would answer those too).
    assert built.lines == 1_000_000
    assert built.segments >= 20 and built.closed == built.segments - 1, built
    assert 3000 < len(built.last_minute) < 10_000
    assert len(built.marked) == MARKERS
    counted, _ = baseline(built)  # zgrep: the marker's bytes, in the text or not
    assert counted == MARKERS + DECOYS
    print(
        f"built {built.lines:,} lines in {built.seconds:.1f} s: {built.segments} segments, "
        f"{built.stored_bytes / 2**20:.1f} MiB on disk"
    )

    with serving(tmp_path / "logs", tmp_path) as server:
        before = server.rss()
        peak = before
        for name, (params, expected) in questions(built).items():
            answer = ask(server, params)
            peak = max(peak, answer.peak_rss)
            got = answer.body.splitlines(keepends=True)
            assert got == expected, (
                f"{name}: {len(got)} lines, {len(expected)} expected; "
                f"first unexpected: {next((g for g in got if g not in expected), None)!r}"
            )
            print(f"{name}: {len(got):,} lines in {answer.seconds:.3f} s")
    print(f"server VmRSS {before / 2**20:.1f} MiB, grew by {(peak - before) / 2**20:.1f} MiB")
    assert peak - before < MAX_GROWTH
