"""Two builds of the ingress, alternated against one cluster: what a change to the exchange
costs or saves, apart from the machine's drift.

A whole `bench.workers` run takes minutes, and on a shared machine nginx's own CPU a request
moves between runs by as much as a change to the exchange does. Here one cluster (etcd,
`wakeful activator`, `wakeful node` and `bench.workers`' `fast` app) stays up, and `wakeful
ingress` (one worker) is started from each checkout in turn, ABBA: A B, B A, A B, ... (each
`--pairs` two runs), wrk `-c32` for `--seconds` on each, the CPU time a request of its
process from /proc; nginx to the same sandbox after every second pair, as the machine's
yardstick. Each checkout runs its own `wakeful` (its working directory), compiled or pure as
it was built (`python setup.py build_ext --inplace` in it compiles it); the cluster is this
checkout's.

From the repository root (needs `apt-get install etcd-server nginx wrk bubblewrap`):

    .venv/bin/python -m bench.builds [--seconds 5] [--pairs 6] CHECKOUT_A CHECKOUT_B
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.builds")

import argparse
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.workers import Cluster, drive, nginx


def build_of(checkout: Path) -> str:
    """How `checkout`'s `wakeful` runs there: "compiled" or "pure" (`wakeful.NATIVE`)."""
    said = subprocess.run(
        [sys.executable, "-c", "import wakeful; print(wakeful.NATIVE)"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return said.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs=2, type=Path, help="two repository checkouts")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()
    for tool in ("etcd", "nginx", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install etcd-server nginx wrk)")
    checkouts: list[Path] = [each.resolve() for each in args.checkouts]
    for each in checkouts:
        if not (each / "wakeful" / "__init__.py").is_file():
            sys.exit(f"checkouts: {each} is not a checkout of this repository")
        print(f"{each}: {build_of(each)}")
    root = Path(tempfile.mkdtemp(prefix="wakeful-bench-builds-"))
    cluster = Cluster(root)
    cpu: dict[Path, list[float]] = {each: [] for each in checkouts}
    yardstick: list[float] = []
    try:
        cluster.start()
        upstream = cluster.sandbox_address()
        for pair in range(args.pairs):
            for each in checkouts if pair % 2 == 0 else checkouts[::-1]:
                with cluster.ingress(1, each) as (url, pids, _):
                    run = drive(url, pids, 1, args.seconds)
                cpu[each].append(run.cpu_us)
                print(f"  {each.name}: {run.result.rps:,.0f} req/s at {run.cpu_us:.1f} µs")
            if pair % 2 == 1:
                with nginx(root, 1, upstream) as (url, pids, _):
                    run = drive(url, pids, 1, args.seconds)
                yardstick.append(run.cpu_us)
                print(f"  nginx: {run.result.rps:,.0f} req/s at {run.cpu_us:.1f} µs")
        a, b = checkouts
        wins = sum(y < x for x, y in zip(cpu[a], cpu[b], strict=True))
        for each in checkouts:
            runs = cpu[each]
            print(
                f"{each}: {statistics.mean(runs):.1f} µs a request at the mean, "
                f"{statistics.median(runs):.1f} at the median"
            )
        print(f"{b.name} below {a.name} in {wins} of {args.pairs} pairs", end="")
        if yardstick:
            print(f"; nginx {min(yardstick):.1f}-{max(yardstick):.1f} µs meanwhile")
        else:
            print()
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
