"""The pieces as separate processes on one store: activators, node agents and an ingress, each
with a token of its own role, and the CLI with the admin token."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from tests.support.up import HELLO, WAKEFUL
from wakeful.store.testing import free_port

STOP_WITHIN = 90
"""Seconds a piece has to stop after SIGTERM. A node's own bounds come to more than 30: its
sandboxes' stop grace (10 s) and 5 s more, then a stateful app's hand back (archive, upload,
release, each retried while the control plane is busy, up to 60 s). On a loaded machine (CI
beside `stress --cpu 2`) a node holding a stateful app took over 30 s twice."""


@contextlib.contextmanager
def start_cluster(
    store_url: str,
    tmp_path: Path,
    nodes: Sequence[str] = ("n1", "n2"),
    role_env: Mapping[str, Mapping[str, str]] | None = None,
    activators: int = 1,
    processes: list[subprocess.Popen[str]] | None = None,
    activator_urls: list[str] | None = None,
    launched: dict[str, tuple[list[str], dict[str, str]]] | None = None,
) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Activators (the first leads; `activators` - 1 stand by), `nodes` and an ingress as
    processes on the store at `store_url`: (the leading control API's URL, ingress URL, the
    CLI's environment). `role_env`: more variables for the pieces of one role ("activator",
    "node", "ingress"), e.g. each its own etcd certificate, or of one node ("node:n1").
    The activators' own variables go in `role_env["activator:N"]` (N from 0, the first leads).
    `processes`: filled with the pieces' processes, activators first, for a test to kill one;
    `activator_urls`: filled with the activators' control API URLs, in the same order;
    `launched`: each node's command and environment by name, for a test to start it again."""
    apis = [f"127.0.0.1:{free_port()}" for _ in range(activators)]
    if activator_urls is not None:
        activator_urls.extend(f"http://{listen}" for listen in apis)
    api = apis[0]
    proxy = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "WAKEFUL_STORE_URL": store_url,
        "WAKEFUL_STORE_NAMESPACE": f"/dist-{uuid.uuid4().hex[:8]}/",
        "WAKEFUL_TOKEN": "distributed-token",
        "WAKEFUL_API": f"http://{api}",
        # Short leases: a fresh activator distrusts lease counts for one TTL (see Reconciler).
        "WAKEFUL_LEASE_TTL": "5",
    }
    pieces: list[tuple[list[str], dict[str, str]]] = [
        (
            [*WAKEFUL, "--data-dir", str(tmp_path / f"act{number or ''}"), "activator"],
            {
                "WAKEFUL_LISTEN": listen,
                # One artifact directory and one secrets key directory all activators
                # share (network mounts across machines), and a quick takeover.
                "WAKEFUL_ARTIFACT_DIR": str(tmp_path / "artifacts"),
                "WAKEFUL_SECRETS_KEYS": str(tmp_path / "secret-keys"),
                "WAKEFUL_ELECTION_TTL": "2",
                "WAKEFUL_ADOPT_WINDOW": "1",
            },
        )
        for number, listen in enumerate(apis)
    ]
    for number, name in enumerate(nodes):
        node_env = {"WAKEFUL_NODE_NAME": name, "WAKEFUL_DATA_DIR": str(tmp_path / name)}
        if number:  # the first node takes the default range
            low = 24000 + 1000 * number
            node_env["WAKEFUL_PORT_RANGE"] = f"[{low}, {low + 999}]"
        pieces.append(([*WAKEFUL, "node"], node_env))
    pieces.append(
        (
            [*WAKEFUL, "ingress"],
            {"WAKEFUL_LISTEN": proxy, "WAKEFUL_ADMIN_LISTEN": f"127.0.0.1:{free_port()}"},
        )
    )
    processes = [] if processes is None else processes
    every_api = ",".join(f"http://{listen}" for listen in apis)  # nodes and ingresses follow
    try:
        for command, extra in pieces:
            role = command[-1]
            extra = {**extra, **(role_env or {}).get(role, {})}
            name = extra.get("WAKEFUL_NODE_NAME", "")
            if role == "activator":
                name = str(sum(1 for p in processes if p.args[-1] == "activator"))
            extra = {**extra, **(role_env or {}).get(f"{role}:{name}", {})}
            if role in ("node", "ingress"):
                # Each with a token of its own role, made once the control plane runs: never
                # the admin token (invariant 17).
                extra = {**extra, f"WAKEFUL_{role.upper()}_TOKEN": make_token(env, role, extra)}
                extra["WAKEFUL_API"] = every_api
            if launched is not None and role == "node":
                launched[name] = (command, piece_env(env, extra))
            process = subprocess.Popen(
                command,
                env={**env, **extra} if role == "activator" else piece_env(env, extra),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            processes.append(process)
            announced(process, role)
        yield f"http://{api}", f"http://{proxy}", env
    finally:
        stuck = []
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=STOP_WITHIN)
            except subprocess.TimeoutExpired:  # killed, its pipe read and closed: no leak
                process.kill()
                said = process.communicate()[0] or ""
                stuck.append(f"{' '.join(process.args[-2:])}, which said:\n{said[-3000:]}")
        assert not stuck, f"did not stop within {STOP_WITHIN} s of SIGTERM: {stuck}"


def announced(process: subprocess.Popen[str], role: str) -> None:
    """Read the piece's output up to the line it prints once it serves (`activator listening
    on ...`, `node n1 running`, ...): a warning logged before it (a slow store on a loaded
    machine) is not that line, and taking it for it sent the next step to a piece not yet
    listening (connection refused)."""
    assert process.stdout is not None
    before = []
    while line := process.stdout.readline():
        if line.startswith(f"{role} "):
            return
        before.append(line)
    raise AssertionError(f"{role} did not start: {''.join(before)}")


def piece_env(env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """A node's or an ingress's environment: no admin token in it."""
    return {k: v for k, v in {**env, **extra}.items() if k != "WAKEFUL_TOKEN"}


def make_token(env: dict[str, str], role: str, extra: dict[str, str]) -> str:
    """A token of `role`, made once the first activator leads: it serves (and prints its line)
    as a standby until its election lands, which on a loaded machine can take seconds, and a
    standby answers 503 naming the leader; a standby prints its line as its API starts, so the
    first ask may find nothing listening yet."""
    name = extra.get("WAKEFUL_NODE_NAME", role)
    deadline = time.monotonic() + 60
    while True:
        made = subprocess.run(
            [*WAKEFUL, "tokens", "create", "--role", role, "--name", name],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        waiting = "standby" in made.stderr or "cannot reach" in made.stderr
        if made.returncode == 0 or not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def wakeful_cli(
    api: str, env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`wakeful --api API ARGS...` with the admin's environment, its output captured."""
    return subprocess.run(
        [*WAKEFUL, "--api", api, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def deploy(
    api: str, env: dict[str, str], app_dir: Path = HELLO
) -> subprocess.CompletedProcess[str]:
    deployed = wakeful_cli(api, env, "deploy", str(app_dir))
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    return deployed


def wakeful_logs(api: str, env: dict[str, str], app: str) -> subprocess.CompletedProcess[str]:
    return wakeful_cli(api, env, "logs", app, timeout=30)


def leads(api: str) -> bool:
    """Whether the activator at `api` leads (its /readyz answers 200; a standby's 503)."""
    try:
        return httpx.get(f"{api}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
