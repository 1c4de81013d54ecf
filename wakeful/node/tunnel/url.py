"""Where a dial-out node's streams go: `WAKEFUL_TUNNEL`, parsed into the WebSocket URL each
stream opens."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from wakeful.domain import tunnelwire as wire


class TunnelURLError(ValueError):
    pass


@dataclass(frozen=True)
class TunnelURL:
    """Where the node's streams go: the ingress tier's tunnel listeners, through their load
    balancer (`WAKEFUL_TUNNEL`, parsed)."""

    url: str
    """The WebSocket URL each stream opens (`wss://HOST[:PORT][/PATH]/v1/tunnel`)."""
    secure: bool


def parse_url(url: str) -> TunnelURL:
    """`https://edge.example[:port][/path]/` (TLS, the usual) or `http://host:port` (plain:
    for a load balancer on the same private network, or tests)."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "wss", "ws"):
        raise TunnelURLError(f"WAKEFUL_TUNNEL: {url!r} must start with https:// or http://")
    if not parts.hostname:
        raise TunnelURLError(f"WAKEFUL_TUNNEL: {url!r} names no host")
    secure = parts.scheme in ("https", "wss")
    try:
        port = parts.port or (443 if secure else 80)
    except ValueError:
        raise TunnelURLError(f"WAKEFUL_TUNNEL: {url!r} has an invalid port") from None
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    scheme = "wss" if secure else "ws"
    path = parts.path.rstrip("/")
    return TunnelURL(f"{scheme}://{shown}:{port}{path}{wire.OPEN}", secure)
