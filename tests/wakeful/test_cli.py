"""The command line: global flags on either side of the subcommand, exit statuses that tell a
usage error (2) from a failure while working (1), and one source for the idle monitor's
settings."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from wakeful.cli import build_parser
from wakeful.domain import keys
from wakeful.domain.models import AppSpec, Version
from wakeful.pieces import _idle_settings, ignored_by_up
from wakeful.store import open_store, sqlite_url
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


def raw_controls(text: str) -> list[str]:
    """The characters a terminal would act on (C0 but tab and newline, DEL, C1)."""
    return [c for c in text if c not in "\t\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)]


def test_an_error_that_quotes_a_value_shows_its_control_characters(tmp_path: Path) -> None:
    """`wakeful: error: ...` names the value, here an app definition's environment variable:
    its escape sequence (a window title) is shown, not sent."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "wakeful.toml").write_text(
        'name = "hello"\ncommand = ["python3", "app.py"]\n\n[env]\n"A\\u001b]0;pwned\\u0007" = 1\n'
    )
    done = run("deploy", str(app), cwd=tmp_path)
    assert done.returncode == 2
    assert "env.A\\x1b]0;pwned\\x07:" in done.stderr
    assert not raw_controls(done.stderr)


SERVER = """
import logging, sys
from wakeful.cli import _configure_logging

_configure_logging(verbose=False)
log = logging.getLogger("wakeful.controller.reconciler")
crash = "Traceback:\\n  \\x1b]52;c;cHduZWQ=\\x07\\x1b[2K\\r\\x9b2J\\u202eok"
log.warning("app %s failed to boot (%d in a row): %s", "hello", 3, crash)
try:
    raise ValueError("\\x1b]0;title\\x07")
except ValueError:
    log.exception("reconcile failed")
"""


def test_the_server_log_shows_control_characters_and_keeps_its_lines(tmp_path: Path) -> None:
    """The log of `wakeful up` (and every piece) on its terminal: a crash log the control plane
    logs cannot write the clipboard or erase a line; a traceback still reads as lines."""
    done = subprocess.run(
        [sys.executable, "-c", SERVER], cwd=tmp_path, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0
    err = done.stderr.decode()
    assert not raw_controls(err)
    assert "\u202e" not in err
    # Its lines stay lines, each after the first set off: none passes for a record.
    assert (
        "failed to boot (3 in a row): Traceback:\n  |   \\x1b]52;c;cHduZWQ=\\x07\\x1b[2K\\r"
        "\\x9b2J\\u202eok\n" in err
    )
    assert "ERROR wakeful.controller.reconciler: reconcile failed\n  | Traceback" in err
    assert "\n  | ValueError: \\x1b]0;title\\x07\n" in err


def test_wakeful_up_says_which_variables_of_the_pieces_it_does_not_read() -> None:
    """`WAKEFUL_LISTEN=... wakeful up` listened on 8080 without a word."""
    assert ignored_by_up({"WAKEFUL_TOKEN": "t", "WAKEFUL_ADMIN_LISTEN": ""}) == []
    assert ignored_by_up({"WAKEFUL_LISTEN": "127.0.0.1:18090"}) == [
        "WAKEFUL_LISTEN is not read by wakeful up (it is a piece's own, run apart): the "
        "ingress listens on --listen"
    ]


@pytest.mark.parametrize(
    ("piece", "variables", "said"),
    [
        pytest.param(
            "ingress",
            {"WAKEFUL_LISTEN": "127.0.0.1"},
            "wakeful: error: WAKEFUL_LISTEN: expected host:port (got '127.0.0.1')\n",
            id="an ingress address without its port",
        ),
        pytest.param(
            "activator",
            {"WAKEFUL_LISTEN": "127.0.0.1"},
            "wakeful: error: WAKEFUL_LISTEN: expected host:port (got '127.0.0.1')\n",
            id="an activator address without its port",
        ),
        pytest.param(
            "ingress",
            {"WAKEFUL_TLS_REDIRECT": "shop"},
            "wakeful: error: WAKEFUL_TLS_REDIRECT: cannot be read (Expecting value: line 1 "
            'column 1 (char 0)): a list or a table is JSON, such as ["a", "b"]\n',
            id="a list not written as JSON",
        ),
        pytest.param(
            "activator",
            {"WAKEFUL_STORE_NAMESPACE": "rt1"},
            "wakeful: error: WAKEFUL_STORE_NAMESPACE: must start and end with '/', such as "
            "/wakeful/ (got 'rt1')\n",
            id="an etcd namespace without its slashes",
        ),
    ],
)
def test_a_piece_with_a_bad_variable_says_which_in_one_line(
    tmp_path: Path, piece: str, variables: dict[str, str], said: str
) -> None:
    """Each was a traceback (an exception group, or pydantic-settings' own error)."""
    done = subprocess.run(
        [*WAKEFUL, piece],
        cwd=tmp_path,
        env={**os.environ, "WAKEFUL_STORE_URL": "memory://", **variables},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (2, said)


@pytest.mark.anyio
async def test_a_backup_missing_an_artifact_names_where_it_looked(tmp_path: Path) -> None:
    """`wakeful backup` away from the control plane's artifact directory (WAKEFUL_ARTIFACT_DIR
    not set): it said an artifact was 'not stored', not where it had looked."""
    data_dir = tmp_path / "state"
    async with open_store(sqlite_url(data_dir / "store.db")) as store:
        spec = AppSpec(command=["python3", "app.py"])
        await store.put(
            keys.version("web", "v1"),
            Version(app="web", version="v1", spec=spec, artifact="ab" * 32),
        )
    environ = {k: v for k, v in os.environ.items() if k != "WAKEFUL_ARTIFACT_DIR"}
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [*WAKEFUL, "--data-dir", str(data_dir), "backup", str(tmp_path / "b.jsonl")],
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
    assert done.returncode == 1
    assert done.stderr == (
        f"wakeful: error: backup (artifacts from {data_dir / 'artifacts'}): artifact "
        f"{'ab' * 32}, which a version names, is not stored\n"
    )
