from __future__ import annotations

import contextlib
import os
import socket

import pytest

from wakeful.node.sandbox.ports import (
    NoFreePort,
    PortPool,
    bindable,
    listeners,
    listeners_from_proc,
)
from wakeful.node.settings import NodeSettings


def test_ports_come_from_the_range_and_are_never_handed_out_twice() -> None:
    pool = PortPool(21000, 21004)
    taken = {pool.take() for _ in range(5)}
    assert taken == set(range(21000, 21005))
    with pytest.raises(NoFreePort):
        pool.take()
    pool.give_back(21002)
    assert pool.take() == 21002


def test_a_port_something_else_holds_is_skipped() -> None:
    with socket.socket() as holder:
        # As servers bind: a connection of an earlier test in TIME-WAIT there must not matter.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 21010))
        holder.listen()
        assert not bindable(21010)
        pool = PortPool(21010, 21011)
        assert pool.take() == 21011


def test_the_default_range_lies_below_the_ephemeral_ports() -> None:
    _, high = NodeSettings(store_url="memory://").port_range
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral_low = int(ranges.read().split()[0])
    assert high < ephemeral_low


def test_a_bad_range_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="port_range"):
        NodeSettings(store_url="memory://", port_range=(30000, 20000))


def test_listeners_are_found_by_netlink_as_by_proc_net_tcp() -> None:
    """The socket-diagnostics reader agrees with the /proc/net reader: a listener on IPv4 and
    one on IPv6 with its owner's uid; a connected (not listening) socket and a closed port not."""
    with contextlib.ExitStack() as stack:
        ports = []
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            listener = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            listener.bind((host, 0))
            listener.listen()
            ports.append(listener.getsockname()[1])
        client = stack.enter_context(socket.create_connection(("127.0.0.1", ports[0])))
        outgoing = client.getsockname()[1]
        for port in ports:
            assert listeners(port) == listeners_from_proc(port) == [os.getuid()]
        assert listeners(outgoing) == listeners_from_proc(outgoing) == []
    assert listeners(ports[0]) == []
