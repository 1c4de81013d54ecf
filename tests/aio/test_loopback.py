"""A loopback listener holds the other loopback address's port: a sandbox cannot answer on
[::1] for a control-plane piece that serves on 127.0.0.1 (clients try ::1 first for
`localhost` names), and a client that tries it is refused at once; a listener on every IPv4
address holds every IPv6 one."""

from __future__ import annotations

import gc
import socket

import pytest

from wakeful.aio.loopback import hold_loopback_twin
from wakeful.serving import bind
from wakeful.store.testing import free_port


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")


def test_a_listener_on_127_0_0_1_holds_the_same_port_on_ipv6_loopback() -> None:
    port = free_port()
    listener = bind(f"127.0.0.1:{port}", "--listen")
    try:
        squatter = socket.socket(socket.AF_INET6)
        with squatter, pytest.raises(OSError, match="Address already in use"):
            squatter.bind(("::1", port))
        client = socket.socket(socket.AF_INET6)
        with client, pytest.raises(ConnectionRefusedError):  # refused, not hung
            client.connect(("::1", port))
    finally:
        listener.close()


def test_the_hold_ends_with_the_listener() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    assert hold_loopback_twin(listener) is not None
    listener.close()
    del listener
    gc.collect()
    with socket.socket(socket.AF_INET6) as later:
        later.bind(("::1", port))  # free again


def test_a_listener_on_every_ipv4_address_holds_every_ipv6_one() -> None:
    """`--listen 0.0.0.0:P` left [::]:P and [::1]:P to a sandbox's user, and `localhost`'s
    IPv6 clients with them (a hostile tester's find)."""
    port = free_port()
    listener = bind(f"0.0.0.0:{port}", "--listen")
    try:
        for address in ("::1", "::"):
            with socket.socket(socket.AF_INET6) as squatter:
                squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError, match="Address already in use"):
                    squatter.bind((address, port))
    finally:
        listener.close()


def test_a_listener_on_another_address_holds_nothing() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.2", 0))
        assert hold_loopback_twin(listener) is None


def test_no_ipv6_at_all_holds_nothing_and_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without IPv6 (ipv6.disable=1) refuses the socket itself: the listener still
    starts, holding no twin."""
    real = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: object, **kwargs: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return real(family, *args, **kwargs)  # type: ignore[arg-type]

    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        monkeypatch.setattr(socket, "socket", no_ipv6)
        assert hold_loopback_twin(listener) is None


def test_a_listener_after_a_closed_one_on_its_port_takes_its_hold_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A standby's control API, closed as it takes over, then the leader's on the same port:
    the first listener, not yet collected, still held the twin, and the second warned that
    "another socket" held it (the second walkthrough). The twin is handed over, held until
    the second listener goes."""
    port = free_port()
    first = bind(f"127.0.0.1:{port}", "control API address")
    first.close()  # closed, still referenced: not collected
    second = bind(f"127.0.0.1:{port}", "control API address")
    assert "bound by another socket" not in caplog.text
    del first
    gc.collect()  # the first one's end does not close the twin the second holds
    with socket.socket(socket.AF_INET6) as squatter, pytest.raises(OSError, match="in use"):
        squatter.bind(("::1", port))
    second.close()
    del second
    gc.collect()
    with socket.socket(socket.AF_INET6) as later:
        later.bind(("::1", port))  # free again


@pytest.mark.parametrize("first_goes", [True, False], ids=["first goes first", "second first"])
def test_listeners_sharing_a_port_share_its_twin_until_the_last_goes(first_goes: bool) -> None:
    """SO_REUSEPORT listeners of one process: the twin was the first's alone, and closed with
    it under the second, which still served (or, handed to the second, closed under the
    first). It is shared, and closes once both went."""
    listeners = []
    for _ in range(2):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", listeners[0].getsockname()[1] if listeners else 0))
        listeners.append(listener)
    del listener  # the list holds them: each goes once it leaves it
    port = listeners[0].getsockname()[1]
    twins = [hold_loopback_twin(listener) for listener in listeners]
    assert twins[0] is twins[1] is not None
    del twins
    gone = listeners.pop(0 if first_goes else 1)
    gone.close()
    del gone
    gc.collect()
    with socket.socket(socket.AF_INET6) as squatter, pytest.raises(OSError, match="in use"):
        squatter.bind(("::1", port))  # still held for the one left
    listeners.pop().close()
    gc.collect()
    with socket.socket(socket.AF_INET6) as later:
        later.bind(("::1", port))
