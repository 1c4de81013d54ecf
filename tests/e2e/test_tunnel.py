"""Dial-out nodes served through tunnels (seed 003), every piece a process of its own: etcd, an
activator, two ingress replicas behind Debian's nginx (for clients, and for the tunnels, whose
every stream nginx places on a replica of its choosing), and a node that is
never dialed (`bench/tunnel.py`'s cluster)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from bench.tunnel import tunnel_cluster
from tests.support.pki import make_pki
from tests.support.prober import Prober

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="needs nginx (scripts/test installs it)"
)

IN_FLIGHT_ON_THE_KILLED = 3
"""Requests forgiven when a replica is killed under them: those it was carrying (the prober
sends one every 20 ms, each takes a few)."""


def _peers_of_sandbox(port: int) -> set[int]:
    """The pids of the processes holding connections to a local TCP port."""
    done = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    )
    pids = set()
    for line in done.stdout.splitlines():
        for part in line.split("pid=")[1:]:
            pids.add(int(part.split(",")[0]))
    return pids


def test_a_node_behind_nat_serves_through_the_replicas_and_survives_losing_one(
    tmp_path: Path,
) -> None:
    with tunnel_cluster(tmp_path, replicas=2, direct_node=False) as c:
        # Cold: the app is at zero; the first request wakes it through the tunnel.
        c.cli("deploy", str(c.app("cold")))
        first = c.get("cold")
        assert first.status_code == 200, first.text
        assert first.text.startswith("hello from")
        # Both replicas hold streams of the node (the balancer places them; coverage fills
        # each to its reserve), and `wakeful nodes` says so.
        deadline = time.monotonic() + 60
        while len([n for n in c.streams_by_replica().values() if n >= 2]) < 2:
            assert time.monotonic() < deadline, c.node_record()
            time.sleep(0.2)
        table = c.cli("nodes")
        assert "tunnel: reachable" in table
        assert "replica r0: streams=" in table and "replica r1: streams=" in table
        with Prober(c.proxy, "cold.localhost") as prober:
            time.sleep(3)
            # Nothing but the node agent ever connected to the sandbox: the replicas had no
            # address of it to dial (its record names `tunnel://n1/...`).
            node = c.nodes["n1"].process
            assert node is not None
            ports = {
                int(line.rsplit(":", 1)[1])
                for log in (tmp_path / "n1").rglob("output.log")
                for line in log.read_text().splitlines()
                if "hello listening on" in line
            }
            assert ports
            for port in ports:
                peers = _peers_of_sandbox(port)
                assert peers and peers <= {node.pid}, (peers, node.pid)
            warm_failures = prober.failed()
            killed = c.replicas[0]
            assert killed.process is not None
            at = time.monotonic()
            killed.process.send_signal(signal.SIGKILL)
            killed.process.wait(timeout=30)
            # The node notices (its streams there broke), the table drops r0, and every
            # request goes through r1.
            deadline = time.monotonic() + 60
            while "r0" in c.streams_by_replica():
                assert time.monotonic() < deadline, c.node_record()
                time.sleep(0.2)
            settled = time.monotonic()
            time.sleep(3)
        print(f"failed when r0 was killed: {prober.failed(at)} of {len(prober.answers)}")
        assert warm_failures == []
        assert len(prober.failed(at)) <= IN_FLIGHT_ON_THE_KILLED, prober.failed(at)
        assert prober.failed(settled + 0.5) == []
        assert len([a for a in prober.answers if a.at > settled]) > 50


def test_a_node_dials_its_tunnel_over_tls_trusting_the_ca_it_is_given(tmp_path: Path) -> None:
    """The README's setup: the balancer terminates TLS for the tunnels (nginx here, with a
    certificate from the README's own commands), and the node dials `https://` with
    `WAKEFUL_TUNNEL_CA`."""
    pki = make_pki(tmp_path / "pki")
    tls = (pki.ca, pki.dir / "etcd.crt", pki.dir / "etcd.key")
    with tunnel_cluster(tmp_path / "cluster", replicas=1, direct_node=False, tls=tls) as c:
        assert c.tunnel.startswith("https://")
        c.cli("deploy", str(c.app("secure")))
        answer = c.get("secure")
        assert answer.status_code == 200, answer.text
        assert c.tunnel_table().get("reachable")
        # Plain HTTP to that listener is not a tunnel: nginx answers 400, nothing is served.
        plain = httpx.get(c.tunnel.replace("https://", "http://") + "/v1/tunnel", timeout=10)
        assert plain.status_code == 400
