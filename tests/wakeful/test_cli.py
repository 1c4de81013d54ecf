"""The command line: global flags on either side of the subcommand, exit statuses that tell a
usage error (2) from a failure while working (1), and one source for the idle monitor's
settings."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from wakeful.cli import build_parser
from wakeful.pieces import _idle_settings
from wakeful.store.testing import free_port

WAKEFUL = [sys.executable, "-m", "wakeful.cli"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--data-dir", "D", "-v", "status"],
        ["status", "--data-dir", "D", "-v"],
        ["--data-dir", "X", "status", "--data-dir", "D", "-v"],
    ],
    ids=["before", "after", "after wins"],
)
def test_global_flags_work_before_and_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.data_dir, args.verbose, args.api) == ("D", True, None)


def test_defaults_stay_when_a_subcommand_does_not_set_them() -> None:
    args = build_parser().parse_args(["up"])
    assert (args.data_dir, args.verbose, args.api) == (".wakeful", False, None)


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WAKEFUL, *argv], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_bad_flag_value_exits_2_and_nothing_to_talk_to_exits_1(tmp_path: Path) -> None:
    usage = run("up", "--listen", "nowhere", cwd=tmp_path)
    assert usage.returncode == 2
    assert "--listen" in usage.stderr and "nowhere" in usage.stderr
    runtime = run("status", "--data-dir", str(tmp_path / "none"), cwd=tmp_path)
    assert runtime.returncode == 1
    assert "no running control plane" in runtime.stderr


def test_the_idle_monitor_reads_its_settings_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WAKEFUL_RETIRED_RETENTION", "120")
    monkeypatch.delenv("WAKEFUL_IDLE_INTERVAL", raising=False)
    settings = _idle_settings(argparse.Namespace(idle_interval=None), default_interval=5.0)
    assert (settings.idle_interval, settings.retired_retention) == (5.0, 120.0)
    monkeypatch.setenv("WAKEFUL_IDLE_INTERVAL", "7")
    from_env = _idle_settings(argparse.Namespace(idle_interval=None), default_interval=5.0)
    assert from_env.idle_interval == 7.0
    flag = _idle_settings(argparse.Namespace(idle_interval=2.0), default_interval=5.0)
    assert flag.idle_interval == 2.0


def test_a_taken_port_is_named_with_exit_1_whichever_piece_binds_it(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = [str(free_port()), str(free_port())]  # not port+1: that may well be in use
        for flag in ("--listen", "--api-listen"):
            others = [f for f in ("--listen", "--api-listen", "--admin-listen") if f != flag]
            argv = ["up", flag, f"127.0.0.1:{port}"]
            for other, other_port in zip(others, free, strict=True):
                argv += [other, f"127.0.0.1:{other_port}"]
            done = run(*argv, "--data-dir", str(tmp_path / flag), cwd=tmp_path)
            assert done.returncode == 1, done.stderr
            assert f"127.0.0.1:{port}: Address already in use" in done.stderr
            assert "Traceback" not in done.stderr
