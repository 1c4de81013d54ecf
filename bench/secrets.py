"""Benchmark what app secrets cost a user: a cold start, and a change reaching every sandbox.

1. Cold starts: one `wakeful up` with COLD copies of examples/hello with no secret (plain1..)
   and COLD with 20 secrets of 1 KiB each (sealed1..), all at zero. One GET per app through
   the ingress on a fresh connection, plain and sealed alternated, timed from send to the
   first byte (bench.coldstart's raw-socket client). The sealed start also asks the control
   plane for its sandbox's values and opens 20 AES-GCM seals; the plain one is its baseline.
2. A change reaching the app: for ROUNDS rounds, on the warm sealed1, `wakeful secrets set`
   of one value (restart on), timed from the CLI's start until 10 answers in a row come from
   sandboxes that were not serving before (examples/hello names its instance in each
   answer). The baseline, alternated with it: a `wakeful deploy` of plain1 with one file
   changed (a new version replacing the running sandbox), timed the same way.

Figures only, no assertions. From the repository root, as a module:

    .venv/bin/python -m bench.secrets [--cold 20] [--rounds 5] [--keep-logs DIR]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.secrets")

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.coldstart import WAKEFUL, Up, first_byte, make_apps, pct, running_up, wait_all_at_zero

SECRETS = {f"SECRET_{i}": "s" * 1024 for i in range(20)}


def instance(client: httpx.Client, app: str) -> str:
    """The instance id examples/hello answers with ("hello from PID instance ID")."""
    return client.get("/", headers={"Host": f"{app}.localhost"}).text.split()[-1]


def replaced(up: Up, app: str, command: list[str]) -> float:
    """Seconds from running `command` until 10 answers in a row come from new sandboxes."""
    with httpx.Client(base_url=up.proxy, timeout=60) as client:
        old = {instance(client, app) for _ in range(10)}
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, timeout=300)
        fresh = 0
        while fresh < 10:
            fresh = fresh + 1 if instance(client, app) not in old else 0
            if time.perf_counter() - started > 300:
                raise RuntimeError(f"{app} was not replaced within 300 s")
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cold", type=int, default=20, help="cold starts of each kind (20)")
    parser.add_argument("--rounds", type=int, default=5, help="changes of each kind (5)")
    parser.add_argument("--keep-logs", type=Path, help="copy the `wakeful up` output here")
    args = parser.parse_args()
    plain_ms: list[float] = []
    sealed_ms: list[float] = []
    changes: list[float] = []
    deploys: list[float] = []
    with tempfile.TemporaryDirectory(prefix="wakeful-secrets-") as tmp:
        root = Path(tmp)
        plain = make_apps(root, "plain", args.cold)
        sealed = make_apps(root, "sealed", args.cold)
        with running_up(root, plain + sealed, args.keep_logs) as up:
            wait_all_at_zero(up, plain + sealed)
            admin = {"Authorization": f"Bearer {(up.data_dir / 'token').read_text().strip()}"}
            for name in sealed:
                answer = httpx.post(
                    f"{up.api}/v1/apps/{name}/secrets",
                    json={"values": SECRETS, "restart": True},
                    headers=admin,
                    timeout=60,
                )
                answer.raise_for_status()
            port = int(up.proxy.rsplit(":", 1)[1])
            for bare, with_secrets in zip(plain, sealed, strict=True):
                for name, into in ((bare, plain_ms), (with_secrets, sealed_ms)):
                    started, done, status = first_byte(port, f"{name}.localhost")
                    if status != 200:
                        raise RuntimeError(f"{name} answered {status}")
                    into.append((done - started) * 1e3)
            cli = [*WAKEFUL, "--data-dir", str(up.data_dir)]
            for round_ in range(args.rounds):
                value = f"SECRET_0=changed-{round_}"
                changes.append(replaced(up, sealed[0], [*cli, "secrets", "set", sealed[0], value]))
                (root / plain[0] / "round.txt").write_text(str(round_))  # a new version
                deploys.append(replaced(up, plain[0], [*cli, "deploy", str(root / plain[0])]))
    row = "{:<58} {:>8} {:>8} {:>8}"
    print(f"\nCold starts: {args.cold} apps of each kind at zero, one request each, alternated")
    print(row.format("", "p50 ms", "p99 ms", "max ms"))
    for label, values in (
        ("no secrets (baseline): first request, first byte", plain_ms),
        ("20 secrets of 1 KiB: first request, first byte", sealed_ms),
    ):
        print(row.format(label, *(f"{pct(values, q):.1f}" for q in (0.5, 0.99, 1))))
    paired = [s - p for s, p in zip(sealed_ms, plain_ms, strict=True)]
    print(
        row.format(
            "  paired: each sealed - the plain one before it",
            *(f"{pct(paired, q):.1f}" for q in (0.5, 0.99, 1)),
        )
    )
    print(f"\nA change reaching every sandbox: {args.rounds} rounds of each, alternated")
    print(row.format("", "p50 s", "max s", ""))
    for label, values in (
        ("`wakeful deploy` of a changed file (baseline)", deploys),
        ("`wakeful secrets set` of one value", changes),
    ):
        print(row.format(label, f"{pct(values, 0.5):.2f}", f"{max(values):.2f}", ""))
    up.report()


if __name__ == "__main__":
    main()
