"""Other nodes and the operator's refused networks, out of a sandbox uid's reach
(wakeful.node.jail.peers, wakeful.node.jail.network): the nft sets follow `nodes/`, and a
connection from a sandbox uid to a fenced address is refused at once while any other still
leaves."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence

import anyio
import pytest

from wakeful.domain import keys
from wakeful.domain.models import Node
from wakeful.node.jail.network import fence_peers, install_network_rules, peer_addresses
from wakeful.node.jail.peers import ControlFence, PeerFence
from wakeful.node.settings import NodeSettings
from wakeful.store import open_store

pytestmark = pytest.mark.anyio
root_with_nft = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None, reason="nftables needs root"
)
SANDBOX_UID = ["setpriv", "--reuid=400001", "--regid=400001", "--clear-groups"]
OPEN = ("TimeoutError", "OSError")
"""What an unfenced connect to TEST-NET gets: no answer (a fenced one: ConnectionRefusedError)."""


def connect_as_sandbox(address: str, port: int) -> str:
    """What a sandbox uid gets connecting to `address` (TEST-NET: nothing answers there, so
    an unfenced connect times out, a fenced one is refused at once)."""
    code = (
        "import socket\ntry:\n"
        f" socket.create_connection(({address!r}, {port}), timeout=0.5)\n"
        "except Exception as e:\n print(type(e).__name__)"
    )
    done = subprocess.run([*SANDBOX_UID, "/usr/bin/python3", "-c", code], capture_output=True)
    return done.stdout.decode().strip()


def peer_set(name: str) -> list[str]:
    listed = subprocess.run(
        ["nft", "-j", "list", "set", "inet", "wakeful", name], capture_output=True, check=True
    )
    for entry in json.loads(listed.stdout)["nftables"]:
        if "set" in entry:
            return sorted(str(e) for e in entry["set"].get("elem", []))
    return []


@root_with_nft
def test_other_nodes_and_refused_networks_are_refused_to_sandbox_uids() -> None:
    try:
        assert install_network_rules(networks=[ipaddress.ip_network("198.51.100.0/24")]) is None
        assert fence_peers(["192.0.2.9"]) is None
        assert connect_as_sandbox("192.0.2.9", 20001) == "ConnectionRefusedError"  # a peer
        assert connect_as_sandbox("198.51.100.4", 80) == "ConnectionRefusedError"  # refused net
        # Open: no answer. A timeout, or "no route" where this machine's own network holds
        # 192.0.2.0/24 (CI's does) and the neighbour failed to resolve: never refused by us.
        assert connect_as_sandbox("192.0.2.10", 20001) in OPEN  # the world
        assert fence_peers([]) is None
        assert connect_as_sandbox("192.0.2.9", 20001) in OPEN  # no longer a peer
    finally:
        install_network_rules()
        fence_peers([])  # a set keeps its elements through `flush table`


@root_with_nft
async def test_the_fence_follows_the_nodes_registered_in_the_store() -> None:
    """Its own record and loopback addresses are left out; a node that leaves is unfenced."""
    try:
        assert install_network_rules() is None
        async with open_store("memory://") as store, anyio.create_task_group() as tasks:
            await store.put(keys.node("self"), Node(name="self", address="192.0.2.1"))
            await store.put(keys.node("b"), Node(name="b", address="192.0.2.9"))
            await store.put(keys.node("c"), Node(name="c", address="127.0.0.1"))
            fence = PeerFence(store, "self")
            with anyio.fail_after(10):
                await tasks.start(fence.run)  # the agent starts sandboxes only after this
            assert fence.applied == ["192.0.2.9"]
            assert peer_set("peers4") == ["192.0.2.9"]
            await store.put(keys.node("d"), Node(name="d", address="2001:db8::5"))
            await store.delete(keys.node("b"))
            with anyio.fail_after(10):
                while fence.applied != ["2001:db8::5"]:  # noqa: ASYNC110 -- polls the fence
                    await anyio.sleep(0.01)
            assert peer_set("peers4") == [] and peer_set("peers6") == ["2001:db8::5"]
            tasks.cancel_scope.cancel()
    finally:
        install_network_rules()
        fence_peers([])  # a set keeps its elements through `flush table`


def test_peer_addresses_leave_out_loopback_and_resolve_names() -> None:
    assert peer_addresses(["192.0.2.9", "127.0.0.1", "::1", "0.0.0.0", "localhost"]) == [
        "192.0.2.9"
    ]


def test_a_refused_network_that_is_not_one_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=re.escape("not a network (CIDR): '10.0.0.0/33'")):
        NodeSettings(sandbox_refused_networks=("10.0.0.0/33",))
    with pytest.raises(ValueError, match=re.escape("'fe80::%eth0/64'")):
        NodeSettings(sandbox_refused_networks=("fe80::%eth0/64",))
    settings = NodeSettings(sandbox_refused_networks=("10.1.2.3/8",))
    assert [str(n) for n in settings.refused_networks()] == ["10.0.0.0/8"]


async def test_an_address_nft_or_the_resolver_refuses_and_a_failing_apply_never_end_it() -> None:
    """A node record is anyone's with store access: a name the resolver cannot take (a label
    over 63 bytes raised UnicodeError, not OSError) and a zoned IPv6 address once ended the
    fence's task, and with it the agent and every sandbox. A failed apply is retried."""
    calls: list[list[str]] = []

    def flaky(addresses: Sequence[str]) -> str | None:
        calls.append(list(addresses))
        return "nft is busy" if len(calls) == 1 else None

    async with open_store("memory://") as store, anyio.create_task_group() as tasks:
        await store.put(keys.node("a"), Node(name="a", address="x" * 70 + ".example"))
        await store.put(keys.node("b"), Node(name="b", address="fe80::1%eth0"))
        fence = PeerFence(store, "self", apply=flaky, retry=(0.01, 0.05))
        with anyio.fail_after(10):
            await tasks.start(fence.run)
            while fence.applied is None:  # noqa: ASYNC110 -- polls the retry
                await anyio.sleep(0.01)
        assert calls == [["fe80::1"], ["fe80::1"]] and fence.applied == ["fe80::1"]
        tasks.cancel_scope.cancel()


@contextlib.contextmanager
def peer_machine() -> Iterator[tuple[str, str]]:
    """Another machine, as far as this one can tell: a network namespace behind a veth pair,
    198.18.7.9 there, 198.18.7.1 here (RFC 2544's benchmark range). Yields (its, our) address."""
    name = f"wkpeer{os.getpid() % 10000}"
    ours, theirs = f"wk{os.getpid() % 10000}a", f"wk{os.getpid() % 10000}b"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", ours, "type", "veth", "peer", "name", theirs],
        ["ip", "link", "set", theirs, "netns", name],
        ["ip", "addr", "add", "198.18.7.1/24", "dev", ours],
        ["ip", "link", "set", ours, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", "198.18.7.9/24", "dev", theirs],
        ["ip", "netns", "exec", name, "ip", "link", "set", theirs, "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield name, "198.18.7.1"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", ours], capture_output=True)


ECHO = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print('up', flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    while data := c.recv(100):\n"
    "        c.sendall(data)\n"
)
TALKER = (
    "import socket, sys\n"
    "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "for line in sys.stdin:\n"
    "    try:\n"
    "        c.sendall(b'x'); print('echo' if c.recv(10) == b'x' else 'closed', flush=True)\n"
    "    except OSError as e:\n"
    "        print(type(e).__name__, flush=True)\n"
)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
    reason="nftables and network namespaces need root",
)
def test_a_fence_cuts_a_sandboxs_open_connection_yet_its_answers_to_the_peer_flow() -> None:
    """The fence rules come before the rule that lets established traffic through, and match
    only connections a sandbox opened: one opened before its peer was fenced is cut at its
    next packet, while a connection the peer opened into a sandbox (an ingress on that
    machine) is answered."""
    try:
        assert install_network_rules() is None and fence_peers([]) is None
        with peer_machine() as (netns, ours):
            echo = subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, "-c", ECHO, "198.18.7.9", "20001"],
                stdout=subprocess.PIPE,
                text=True,
            )
            sandbox_server = subprocess.Popen(
                [*SANDBOX_UID, sys.executable, "-c", ECHO, ours, "20002"],
                stdout=subprocess.PIPE,
                text=True,
            )
            talker: subprocess.Popen[str] | None = None
            try:
                assert echo.stdout is not None and echo.stdout.readline() == "up\n"
                assert sandbox_server.stdout is not None
                assert sandbox_server.stdout.readline() == "up\n"
                talker = subprocess.Popen(
                    [*SANDBOX_UID, sys.executable, "-c", TALKER, "198.18.7.9", "20001"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert talker.stdin is not None and talker.stdout is not None
                talker.stdin.write("go\n")
                talker.stdin.flush()
                assert talker.stdout.readline() == "echo\n"  # not fenced yet: open
                assert fence_peers(["198.18.7.9"]) is None
                talker.stdin.write("go\n")
                talker.stdin.flush()
                assert talker.stdout.readline() == "ConnectionResetError\n"  # cut at once
                inbound = subprocess.run(
                    ["ip", "netns", "exec", netns, sys.executable, "-c", TALKER, ours, "20002"],
                    input="go\n",
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                assert inbound.stdout == "echo\n", inbound.stderr  # the sandbox answered
            finally:
                for process in (echo, sandbox_server, talker):
                    if process is not None:
                        process.kill()
                        process.communicate()
    finally:
        install_network_rules()
        fence_peers([])


async def test_the_control_fence_follows_the_control_planes_names() -> None:
    """A name that resolves elsewhere replaces its addresses in the sets; a name that resolves
    to nothing keeps the ones it had, each name on its own (two activators on one port: one
    failing to resolve must not unfence the other's, nor its own); the sets are applied every
    pass (whoever replaced them meanwhile); a refused apply changes nothing and is tried again."""
    one, two = "activator-1:8082", "activator-2:8082"
    answers = [
        {one: [("10.0.0.3", 8082)], two: [("10.0.0.4", 8082)]},
        {one: [("10.0.0.5", 8082)], two: []},  # one moved; two's name resolves to nothing
        {one: [("10.0.0.5", 8082)], two: [("10.0.0.6", 8082)]},  # nft refuses this pass
        {one: [("10.0.0.5", 8082)], two: [("10.0.0.6", 8082)]},
    ]
    applied: list[list[tuple[str, int]]] = []
    refusals = [None, None, "nft refused the rules: busy", None]

    def apply(endpoints: Sequence[tuple[str, int]]) -> str | None:
        failed = refusals.pop(0)
        if failed is None:
            applied.append(list(endpoints))
        return failed

    fence = ControlFence(
        ("http://activator-1:8082,http://activator-2:8082",),
        resolve=lambda urls: answers.pop(0),
        apply=apply,
    )
    await fence.refresh()
    assert fence.applied == [("10.0.0.3", 8082), ("10.0.0.4", 8082)]
    await fence.refresh()
    assert fence.applied == [("10.0.0.4", 8082), ("10.0.0.5", 8082)]  # two's kept
    await fence.refresh()
    assert fence.applied == [("10.0.0.4", 8082), ("10.0.0.5", 8082)]  # refused: unchanged
    await fence.refresh()
    assert fence.applied == [("10.0.0.5", 8082), ("10.0.0.6", 8082)]
    assert len(applied) == 3  # every pass that nft took, changed or not
