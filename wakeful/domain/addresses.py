"""`host:port` addresses as the pieces' settings give them: taken apart, and put together."""

from __future__ import annotations


def split_address(address: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as a pair; refuses anything else with a readable reason."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65_535:
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets: what `split_address` takes apart."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
