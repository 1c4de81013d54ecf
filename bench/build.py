"""Benchmark builds from source (issue 37): `wakeful deploy DIR` of the FastAPI and Express
samples, from nothing and after a code-only change, beside `podman build` of an equivalent
hand-written Containerfile in the same run; the images' sizes beside each other.

For each sample (`examples/fastapi`, `examples/express`), copied to a temporary directory:

1. From nothing: the dependency list gets a fresh line of its own (a comment in
   requirements.txt, a `description` in package.json), so neither wakeful's build nor the
   hand-written one finds its dependency layer in podman's cache; the stack's base image is
   there for both (`scripts/base-image python node` where no registry is reachable).
   - wakeful: `wakeful deploy DIR` against one `wakeful up` (build, send the blobs the control
     plane lacks, deploy, until the version is live), then the first GET through the ingress.
   - podman (baseline): `podman build` of the hand-written Containerfile (`HANDWRITTEN`: the
     same base, the dependencies in a layer before the code, as its documentation advises).
2. A code-only change (one line of main.py or server.js), --runs R times, alternated:
   wakeful's `deploy` until live (and the blobs it sent), and podman's `build` of the same
   directory with the hand-written file (a build only: no export, no deploy).
3. Sizes: `podman image inspect` of wakeful's build and of the hand-written one.

Figures only, no assertions. From the repository root, as root (podman), as a module:

    .venv/bin/python -m bench.build [--runs 3] [--samples fastapi,express] [--keep-logs DIR]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.build")

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.coldstart import WAKEFUL, Up, running_up

ROOT = Path(__file__).resolve().parents[1]
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "ops" / "container" / "containers.conf")}
HANDWRITTEN = {
    "fastapi": (
        "FROM docker.io/library/python:3.11-slim\n"
        "WORKDIR /app\n"
        "COPY requirements.txt .\n"
        "RUN --mount=type=secret,id=extra_ca if [ -s /run/secrets/extra_ca ]; then "
        "export PIP_CERT=/run/secrets/extra_ca; fi; python3 -m venv /venv && "
        "/venv/bin/pip install --no-cache-dir -r requirements.txt\n"
        "COPY . .\n"
        'CMD ["/venv/bin/uvicorn", "main:app", "--host", "0.0.0.0", "--port", "8080"]\n'
    ),
    "express": (
        "FROM docker.io/library/node:20-slim\n"
        "WORKDIR /app\n"
        "COPY package.json package-lock.json ./\n"
        "RUN --mount=type=secret,id=extra_ca if [ -s /run/secrets/extra_ca ]; then "
        "export NODE_EXTRA_CA_CERTS=/run/secrets/extra_ca; fi; npm ci --omit=dev\n"
        "COPY . .\n"
        'CMD ["node", "server.js"]\n'
    ),
}
CODE = {"fastapi": "main.py", "express": "server.js"}
CA = Path("/etc/ssl/certs/ca-certificates.crt")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return took, done.stdout


def bust(app: Path, sample: str) -> None:
    """A fresh dependency list: no cached dependency layer for either build."""
    nonce = uuid.uuid4().hex
    if sample == "fastapi":
        path = app / "requirements.txt"
        path.write_text(path.read_text() + f"# bench {nonce}\n")
    else:
        path = app / "package.json"
        package = json.loads(path.read_text())
        package["description"] = f"bench {nonce}"
        path.write_text(json.dumps(package, indent=2) + "\n")


def change_code(app: Path, sample: str, run: int) -> None:
    path = app / CODE[sample]
    marker = "#" if sample == "fastapi" else "//"
    path.write_text(path.read_text() + f"{marker} change {run}\n")


def podman_build(app: Path, sample: str, tag: str, containerfile: Path) -> float:
    containerfile.write_text(HANDWRITTEN[sample])
    secret = ["--secret", f"id=extra_ca,src={CA}"] if CA.is_file() else []
    took, _ = timed(
        ["podman", "build", "-q", *secret, "-f", str(containerfile), "-t", tag, str(app)],
        PODMAN_ENV,
    )
    return took


def deploy(up: Up, app: Path, env: dict[str, str]) -> tuple[float, str]:
    return timed([*WAKEFUL, "--data-dir", str(up.data_dir), "deploy", str(app)], env)


def first_get(up: Up, name: str) -> float:
    started = time.perf_counter()
    answer = httpx.get(f"{up.proxy}/", headers={"Host": f"{name}.localhost"}, timeout=120)
    if answer.status_code != 200:
        raise RuntimeError(f"{name}: {answer.status_code} {answer.text[:300]}")
    return time.perf_counter() - started


def size(tag: str) -> int:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", tag],
        env=PODMAN_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.strip())


def sent(output: str) -> str:
    found = re.search(r"sent (\d+) of its (\d+) blobs \(([\d.]+) MB\)", output)
    return f"{found.group(1)}/{found.group(2)} blobs, {found.group(3)} MB" if found else "?"


def bench_sample(up: Up, sample: str, work: Path, runs: int, env: dict[str, str]) -> None:
    app = work / sample
    shutil.copytree(ROOT / "examples" / sample, app)
    tag = f"localhost/bench-handwritten/{sample}:latest"
    containerfile = work / f"{sample}.Containerfile"
    name = sample
    bust(app, sample)
    podman_first = podman_build(app, sample, tag, containerfile)
    wakeful_first, output = deploy(up, app, env)
    get_first = first_get(up, name)
    print(f"\n{sample}: from nothing (base image present, no dependency layer cached)")
    print(f"  podman build, hand-written       {ms(podman_first)}")
    print(f"  wakeful deploy (build+send+live) {ms(wakeful_first)}  sent {sent(output)}")
    print(f"  then the first GET               {ms(get_first)}")
    podman_times, wakeful_times, sends = [], [], []
    for run in range(runs):
        change_code(app, sample, run)
        if run % 2 == 0:
            podman_times.append(podman_build(app, sample, tag, containerfile))
            took, output = deploy(up, app, env)
        else:
            took, output = deploy(up, app, env)
            podman_times.append(podman_build(app, sample, tag, containerfile))
        wakeful_times.append(took)
        sends.append(sent(output))
        first_get(up, name)
    print(f"{sample}: a code-only change, {runs} runs alternated (median, min-max)")
    print(
        f"  podman build, hand-written       {ms(statistics.median(podman_times))} "
        f"({ms(min(podman_times))}-{ms(max(podman_times))})"
    )
    print(
        f"  wakeful deploy (build+send+live) {ms(statistics.median(wakeful_times))} "
        f"({ms(min(wakeful_times))}-{ms(max(wakeful_times))})  sent {', '.join(sorted(set(sends)))}"
    )
    ours = size(f"localhost/wakeful-build/{sample}:latest")
    theirs = size(tag)
    print(f"{sample}: image size  wakeful {ours / 1e6:.1f} MB  hand-written {theirs / 1e6:.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", default="fastapi,express")
    parser.add_argument("--keep-logs", type=Path)
    args = parser.parse_args()
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "base-image"), "python", "node"], env=PODMAN_ENV, check=True
    )
    with tempfile.TemporaryDirectory(prefix="bench-build.") as scratch:
        work = Path(scratch)
        env = {**PODMAN_ENV, "WAKEFUL_BUILD_CACHE": str(work / "cache")}
        print(f"{os.cpu_count()} cores; podman and wakeful's builds on the same podman storage")
        with running_up(work, [], args.keep_logs) as up:
            for sample in args.samples.split(","):
                bench_sample(up, sample, work, args.runs, env)


if __name__ == "__main__":
    main()
