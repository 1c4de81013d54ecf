"""Evacuation of stateful apps (issue 14): a node running N stateful sandboxes, each with a few
MB of state and a prober of its own, is drained; every sandbox moves, with its state, to the
other node.

The cluster is the multi-process mode on a real etcd (one activator, nodes n1 and n2, one
ingress, each a `wakeful` process). The apps are copies of `examples/notes`, each seeded with
`--state-mb` MB of random bytes in its state directory (`data/`), all placed on n1 (n2 is
cordoned while they are deployed and woken, then uncordoned). One prober per app GETs it in a
loop through the ingress. Then `wakeful drain n1` runs until it reports the node empty.

It prints: the whole run (the drain command's wall time), per-app move time (from the drain's
start until the app answers from its new sandbox) p50/p95/max, bytes moved (the archives'
sizes), the requests held at the gate (those that took over 50 ms) and how long they took
beyond a warm request (the probers' median before the drain), and failed requests (goal: 0).

From the repository root (needs `apt-get install etcd-server`):

    python -m bench.evacuate [--apps 20] [--state-mb 3] [--concurrency 4]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.evacuate")

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.e2e.test_distributed import start_cluster, wakeful_cli
from wakeful.store.testing import EtcdServer

NOTES = Path(__file__).parents[1] / "examples" / "notes"
HELD = 0.05
"""Seconds past which a request counts as held at the gate."""


@dataclass
class Probe:
    app: str
    results: list[tuple[float, float, int, str]] = field(default_factory=list)
    """(started, seconds, status, instance), monotonic."""
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, proxy: str) -> None:
        headers = {"Host": f"{self.app}.localhost"}
        with httpx.Client(base_url=proxy, timeout=300) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    answer = client.get("/", headers=headers)
                    status, instance = answer.status_code, answer.headers.get("x-instance", "")
                except httpx.HTTPError:
                    status, instance = 0, ""
                self.results.append((started, time.monotonic() - started, status, instance))
                time.sleep(0.05)


def make_app(root: Path, name: str, state_mb: int) -> Path:
    target = root / name
    shutil.copytree(NOTES, target)
    manifest = (target / "wakeful.toml").read_text().replace('name = "notes"', f'name = "{name}"')
    (target / "wakeful.toml").write_text(manifest)
    (target / "data").mkdir()
    (target / "data" / "seed.bin").write_bytes(os.urandom(state_mb << 20))
    return target


def cli(api: str, env: dict[str, str], *args: str, timeout: float = 600) -> str:
    done = wakeful_cli(api, env, *args, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"wakeful {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=20)
    parser.add_argument("--state-mb", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4, help="WAKEFUL_EVACUATE_CONCURRENCY")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="wakeful-evacuate-"))
    os.environ["WAKEFUL_EVACUATE_CONCURRENCY"] = str(args.concurrency)
    names = [f"notes-{number:02d}" for number in range(args.apps)]
    try:
        with EtcdServer() as etcd, start_cluster(etcd.url, root) as (api, proxy, env):
            cli(api, env, "drain", "n2", "--no-evacuate")
            for name in names:
                cli(api, env, "deploy", str(make_app(root / "apps", name, args.state_mb)))
            probes = [Probe(name) for name in names]
            for probe in probes:  # woken, on n1
                answer = httpx.get(proxy, headers={"Host": f"{probe.app}.localhost"}, timeout=120)
                assert answer.status_code == 200, answer.text
            cli(api, env, "drain", "n2", "--undo")
            threads = [threading.Thread(target=p.run, args=(proxy,), daemon=True) for p in probes]
            for thread in threads:
                thread.start()
            time.sleep(2)  # the warm baseline
            began = time.monotonic()
            output = cli(api, env, "drain", "n1")
            run = time.monotonic() - began
            time.sleep(2)
            for probe in probes:
                probe.stop.set()
            for thread in threads:
                thread.join(timeout=300)
            sizes = httpx.get(
                f"{api}/v1/nodes/n1",
                headers={"Authorization": f"Bearer {env['WAKEFUL_TOKEN']}"},
                timeout=30,
            ).json()
            report(probes, began, run, output, sizes, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(
    probes: list[Probe],
    began: float,
    run: float,
    output: str,
    node: dict[str, object],
    root: Path,
    args: argparse.Namespace,
) -> None:
    warm = [s for p in probes for (t, s, code, _) in p.results if t < began and code == 200]
    baseline = statistics.median(warm) if warm else 0.0
    moves, held, failed, total = [], [], 0, 0
    for probe in probes:
        before = {i for (t, _, code, i) in probe.results if t < began and code == 200}
        moved_at = next(
            (t + s for (t, s, code, i) in probe.results if code == 200 and i not in before), None
        )
        if moved_at is not None:
            moves.append(moved_at - began)
        for t, seconds, code, _ in probe.results:
            if t < began:
                continue
            total += 1
            if code != 200:
                failed += 1
            elif seconds > HELD:
                held.append(seconds - baseline)
    moved_bytes = args.apps * (args.state_mb << 20)
    print(f"apps {args.apps}, state {args.state_mb} MiB each, concurrency {args.concurrency}")
    print(f"{'whole run (wakeful drain n1)':44} {run:8.2f} s")
    print(f"{'apps moved (answering from a new sandbox)':44} {len(moves):8d} / {len(probes)}")
    print(
        f"{'per-app move time p50 / p95 / max':44} {percentile(moves, 0.5):6.2f} / "
        f"{percentile(moves, 0.95):.2f} / {max(moves, default=0):.2f} s"
    )
    print(f"{'state bytes moved (seeded; archives gzip it)':44} {moved_bytes / 2**20:8.1f} MiB")
    print(f"{'warm request (median before the drain)':44} {baseline * 1000:8.1f} ms")
    print(f"{'requests during the drain':44} {total:8d}")
    print(f"{'held at the gate (> 50 ms)':44} {len(held):8d}")
    print(
        f"{'their extra latency p50 / p95 / max':44} {percentile(held, 0.5):6.2f} / "
        f"{percentile(held, 0.95):.2f} / {max(held, default=0):.2f} s"
    )
    print(f"{'failed requests (goal: 0)':44} {failed:8d}")
    print(f"drain progress at the end: {node.get('progress')}")
    print(output.strip().splitlines()[-1] if output.strip() else "")
    del root


if __name__ == "__main__":
    main()
