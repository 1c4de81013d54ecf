"""What a sandbox may reach on the network: nftables rules that match the sandbox uids' packets.

The sandboxes share the host's network namespace (the ingress dials their port). One nftables
table, the same for every agent on the machine, refuses their own connections to this machine,
to the other nodes (`fence_peers`, kept by `peers.PeerFence`), to the control plane on other
machines (`fence_control`, kept by `peers.ControlFence`), to the operator's refused networks and
to a cloud's metadata service; their answers to connections others opened always flow.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .uids import UID_BASE, UID_COUNT

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
log = logging.getLogger(__name__)

_OUT = "add rule inet wakeful out"
_SANDBOX_UIDS = f"{UID_BASE}-{UID_BASE + UID_COUNT - 1}"
_FENCED = "ct direction original"
"""A fence rule matches only packets of connections a sandbox opened: its answers to
connections others opened (an ingress on a fenced machine) are never refused, and a
connection it opened before the fence went up is cut by its next packet (a TCP reset)."""


def _fence(match: str) -> str:
    """Refuse a sandbox's own traffic to `match`: TCP with a reset, the rest with ICMP."""
    return (
        f"{_OUT} {_FENCED} {match} meta l4proto tcp reject with tcp reset\n"
        f"{_OUT} {_FENCED} {match} reject\n"
    )


NFT_HEAD = f"""
add table inet wakeful
flush table inet wakeful
add chain inet wakeful out {{ type filter hook output priority 0; policy accept; }}
add set inet wakeful peers4 {{ type ipv4_addr; flags interval; }}
add set inet wakeful peers6 {{ type ipv6_addr; flags interval; }}
add set inet wakeful control4 {{ type ipv4_addr . inet_service; }}
add set inet wakeful control6 {{ type ipv6_addr . inet_service; }}
{_OUT} meta skuid != {_SANDBOX_UIDS} accept
"""
NFT_FENCES = (
    _fence("ip daddr @peers4")
    + _fence("ip6 daddr @peers6")
    + f"{_OUT} {_FENCED} ip daddr . tcp dport @control4 reject with tcp reset\n"
    + f"{_OUT} {_FENCED} ip6 daddr . tcp dport @control6 reject with tcp reset\n"
)
NFT_TAIL = f"""{_OUT} ct state established,related accept
{_OUT} ip daddr 169.254.0.0/16 reject
{_OUT} ip6 daddr fd00:ec2::254 reject
{_OUT} fib daddr type local meta l4proto {{ tcp, udp }} th dport 53 accept
{_OUT} fib daddr type {{ local, broadcast, multicast }} reject
"""
NFT_RULES = NFT_HEAD + NFT_FENCES + NFT_TAIL
"""Packets from sandbox uids to any address of this machine are refused unless they answer a
connection someone else opened (the ingress's requests) or ask a local DNS resolver: a sandbox
cannot reach the control API, the lease API, etcd, the ingress admin port or another
sandbox's port, nor a cloud's link-local metadata service (its credentials), while its own
port serves and the internet stays reachable. Before that, the fences (`_fence`): the other
nodes (sets filled by `fence_peers`), and what `install_network_rules` adds. One transaction,
the same for every agent on the machine: re-installing it is harmless."""


def install_network_rules(
    refused: Sequence[tuple[str, int]] = (),
    networks: Sequence[Network] = (),
    gateways: Sequence[str] = (),
) -> str | None:
    """Install `NFT_RULES` (root, Debian's nftables), the control-plane endpoints on other
    machines (`refused`: address, port) in the control sets, and a fence per refused network
    (the operator's `sandbox_refused_networks`); the reason when that is impossible. The peer
    sets start empty: `fence_peers` fills them; `fence_control` replaces the control sets
    when the control plane's names resolve to other addresses (`ControlFence`)."""
    fences = NFT_FENCES + "".join(
        _fence(f"{'ip6' if n.version == 6 else 'ip'} daddr {n}") for n in networks
    )
    for gateway in gateways:  # all but DNS, which the gateway may answer (podman's networks)
        family = "ip6" if ":" in gateway else "ip"
        fences += (
            f"{_OUT} {_FENCED} {family} daddr {gateway} meta l4proto tcp th dport != 53 "
            "reject with tcp reset\n"
            f"{_OUT} {_FENCED} {family} daddr {gateway} meta l4proto udp th dport != 53 reject\n"
        )
    return _nft(NFT_HEAD + fences + NFT_TAIL + _control_elements(refused))


def default_gateways(routes: Path = Path("/proc/net/route")) -> list[str]:
    """The IPv4 default gateways of this network namespace. In a container the gateway is the
    host (podman's 10.88.0.1, `host.containers.internal`): another address, so the rules for
    "this machine" do not cover it, and a sandbox could reach the host's services, and the
    container's own published ports through them."""
    found = []
    with contextlib.suppress(OSError):
        for line in routes.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 2 and fields[1] == "00000000" and fields[2] != "00000000":
                address = ipaddress.IPv4Address(int(fields[2], 16).to_bytes(4, "little"))
                found.append(str(address))
    return sorted(set(found))


def fence_control(refused: Sequence[tuple[str, int]]) -> str | None:
    """Make the control sets exactly `refused` (address, port), in one transaction; the
    reason when nft refuses."""
    rules = "flush set inet wakeful control4\nflush set inet wakeful control6\n"
    return _nft(rules + _control_elements(refused))


def _control_elements(refused: Sequence[tuple[str, int]]) -> str:
    found = sorted({(ipaddress.ip_address(a), p) for a, p in refused}, key=str)
    rules = ""
    for version, name in ((4, "control4"), (6, "control6")):
        members = [f"{a} . {p}" for a, p in found if a.version == version]
        if members:
            rules += f"add element inet wakeful {name} {{ {', '.join(members)} }}\n"
    return rules


def fence_peers(addresses: Sequence[str]) -> str | None:
    """Make the peer sets exactly `addresses` (the other nodes', where their sandboxes listen),
    in one transaction; the reason when nft refuses."""
    found = sorted({ipaddress.ip_address(a) for a in addresses}, key=lambda a: (a.version, a))
    rules = "flush set inet wakeful peers4\nflush set inet wakeful peers6\n"
    for version, name in ((4, "peers4"), (6, "peers6")):
        members = [str(a) for a in found if a.version == version]
        if members:
            rules += f"add element inet wakeful {name} {{ {', '.join(members)} }}\n"
    return _nft(rules)


def peer_addresses(hosts: Sequence[str]) -> list[str]:
    """The addresses other nodes advertise (`Node.address`: an IP, or a name resolved here),
    without the loopback and unspecified ones (this machine's are refused already)."""
    found: set[str] = set()
    for host in hosts:
        try:
            infos = [_unscoped(host)]
        except ValueError:
            try:
                resolved = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
                infos = [_unscoped(str(info[4][0])) for info in resolved]
            except (OSError, ValueError) as exc:  # a name over 63 bytes is a UnicodeError
                log.warning("cannot refuse node address %r to sandboxes: %s", host[:100], exc)
                continue
        found.update(str(a) for a in infos if not (a.is_loopback or a.is_unspecified))
    return sorted(found)


def _unscoped(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address without its IPv6 zone (`fe80::1%eth0`), which nft does not take."""
    return ipaddress.ip_address(text.split("%", 1)[0])


def _nft(rules: str) -> str | None:
    nft = shutil.which("nft")
    if nft is None:
        return "nft not found (apt-get install nftables)"
    try:
        done = subprocess.run(
            [nft, "-f", "-"], input=rules, capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nft failed: {exc}"
    if done.returncode != 0:
        return f"nft refused the rules: {done.stderr.strip()[:200]}"
    return None


def control_endpoints(urls: Sequence[str]) -> list[tuple[str, int]]:
    """The addresses and ports of the control plane (`etcd://h:p,h:p`, `http(s)://h:p`) that
    are not on this machine, resolved now: what a sandbox must not reach across the network.
    Loopback ones are refused by `NFT_RULES` already; a name that does not resolve is skipped
    (the node could not reach it either)."""
    return sorted({e for found in control_names(urls).values() for e in found})


def control_names(urls: Sequence[str]) -> dict[str, list[tuple[str, int]]]:
    """`control_endpoints` per `host:port` the URLs name: an empty list for one that resolves
    to nothing now (`ControlFence` then keeps what it had)."""
    found: dict[str, list[tuple[str, int]]] = {}
    for url in urls:
        scheme, _, rest = url.partition("://")
        default = {"http": 80, "https": 443, "etcd": 2379}.get(scheme)
        if default is None:
            continue
        for hostport in rest.split("/", 1)[0].split(","):
            host, port = _split_host_port(hostport)
            addresses: set[tuple[str, int]] = set()
            try:
                number = int(port) if port else default
                infos = socket.getaddrinfo(host, number, type=socket.SOCK_STREAM)
                for info in infos:
                    address = _unscoped(str(info[4][0]))  # nft takes no IPv6 zone
                    if not address.is_loopback:
                        addresses.add((str(address), number))
            except (OSError, ValueError):
                pass
            found.setdefault(hostport, [])
            found[hostport] = sorted(set(found[hostport]) | addresses)
    return found


def _split_host_port(hostport: str) -> tuple[str, str]:
    """`h:p`, `[v6]:p`, `h` -> (host, port or "")."""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        return host, rest.removeprefix(":")
    host, colon, port = hostport.rpartition(":")
    return (host, port) if colon else (hostport, "")
