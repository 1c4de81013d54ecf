"""What the kernel enforces around a sandbox besides namespaces: nftables rules for sandbox
uids, a seccomp filter against user namespaces, and the bounded tmpfs of the app's tree."""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from wakeful.domain.models import Resources, format_size

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
log = logging.getLogger(__name__)

UID_BASE = 400_000
"""Per-app uids are UID_BASE + n: above the usual subordinate-uid ranges (100000-165535)."""
UID_COUNT = 100_000


# -- the network ----------------------------------------------------------------------------

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


# -- the app's writable tree, bounded ----------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


SCRATCH = ("tmp", "shm")
"""Bound at the sandbox's `/tmp` and `/dev/shm`, beside `app` (its `/app`); like `app`, 0700
and the app's own once filled (every process of a sandbox runs as its app's uid, so nothing
there needs to be open to others, in the sandbox or on the node)."""
MS_NOSUID, MS_NODEV, MS_REMOUNT = 2, 4, 32


def mount_sandbox_fs(root: Path, size: int) -> None:
    """Make `root` a tmpfs of `size` bytes (root only) holding `app/` and the `SCRATCH`
    directories (root's, 0700, until `fill_app_dir`): everything a sandbox can write lives there,
    and it can never fill the node's disk. Its own root is never visible inside."""
    root.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700".encode()
    if _libc.mount(b"tmpfs", str(root).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs on {root}: {os.strerror(err)}")
    try:
        for name in ("app", *SCRATCH):
            (root / name).mkdir(mode=0o700)
        for name in ACCOUNTS:  # root's, 0600, until `fill_app_dir` gives them to the app
            os.close(os.open(root / name, os.O_WRONLY | os.O_CREAT, 0o600))
    except BaseException:
        unmount(root)
        raise


ACCOUNTS = ("passwd", "group")
"""Files beside `app/`, bound read-only at the sandbox's /etc/passwd and /etc/group: the app's
uid has a name (`app`) and a home (`/app`), so `getpwuid`, `whoami` and `~` work for it, the
lookup ends in the file instead of loading another NSS module, and the host's accounts are not
listed to it."""


def accounts(uid: int) -> dict[str, str]:
    return {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"app:x:{uid}:{uid}:app:/app:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\napp:x:{uid}:\nnogroup:x:65534:\n",
    }


def resize_sandbox_fs(root: Path, size: int) -> None:
    """Give the tmpfs of `mount_sandbox_fs` a new size (what a warm slot's becomes the app's)."""
    options = f"size={size}".encode()
    flags = MS_REMOUNT | MS_NOSUID | MS_NODEV
    if _libc.mount(b"tmpfs", str(root).encode(), b"tmpfs", flags, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot resize the tmpfs on {root}: {os.strerror(err)}")


def fill_app_dir(root: Path, uid: int, place: Callable[[Path, int], None]) -> None:
    """Have `place` write the app into the tmpfs's (empty) `app/`, all of it owned by `uid`,
    give `uid` that directory and the scratch ones, and name it in the sandbox's accounts."""
    app = root / "app"
    place(app, uid)
    os.chown(app, uid, uid)
    for name in SCRATCH:
        os.chown(root / name, uid, uid)
    for name, text in accounts(uid).items():
        with open(root / name, "r+") as file:  # in place: the sandbox has this inode bound
            file.write(text)
            file.truncate()
        # The app's own (bound read-only, so it cannot change them): readable by it whatever
        # the agent's umask (077 in a data directory made them 0600, and getpwuid, whoami
        # and ~ failed), and by nobody else.
        os.chown(root / name, uid, uid)


def unmount(path: Path) -> None:
    """Undo `mount_sandbox_fs` (lazily: a process still holding a file there goes on)."""
    mnt_detach = 2
    _libc.umount2(str(path).encode(), mnt_detach)


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, uid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def oom_message(limits: Resources) -> str:
    return f"killed: out of memory (limit {format_size(limits.memory)})"


# -- scoped abstract sockets and signals ------------------------------------------------------

LANDLOCK_SCOPE_ABI = 6
"""The Landlock ABI (Linux 6.12) that scopes abstract UNIX sockets and signals."""


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (not built, or not enabled)."""
    create_ruleset, version_flag = 444, 1
    found = int(_libc.syscall(create_ruleset, None, 0, version_flag))
    return max(found, 0)


# -- no user namespaces inside ---------------------------------------------------------------

CLONE_NEWUSER = 0x10000000
_ARCHES = {  # machine: (AUDIT_ARCH_*, unshare, clone, clone3, has the x32 ABI)
    "x86_64": (0xC000003E, 272, 56, 435, True),
    "aarch64": (0xC00000B7, 97, 220, 435, False),
}


def userns_filter(machine: str) -> bytes | None:
    """A seccomp program (for `bwrap --seccomp FD`) that refuses new user namespaces: unshare
    and clone with CLONE_NEWUSER fail with EPERM, clone3 (whose flags a filter cannot read)
    with ENOSYS so libc falls back to clone, and any other ABI (i386, x32) with ENOSYS. In its
    own user namespace an app would hold every capability over it: the kernel's largest attack
    surface. None on a machine this module does not know."""
    found = _ARCHES.get(machine)
    if found is None:
        return None
    arch, unshare, clone, clone3, x32 = found
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    # (code, jump-if-true label, jump-if-false label, k); labels are resolved below.
    program: list[tuple[int, str, str, int]] = [
        (ld, "", "", 4),
        (jeq, "", "foreign", arch),
        (ld, "", "", 0),
        *([(jge, "foreign", "", 0x40000000)] if x32 else []),
        (jeq, "enosys", "", clone3),
        (jeq, "flags", "", unshare),
        (jeq, "flags", "", clone),
        (ret, "", "", allow),
        (ld, "", "", 16),  # flags: the first argument's low 32 bits
        (jset, "eperm", "", CLONE_NEWUSER),
        (ret, "", "", allow),
        (ret, "", "", enosys),
        (ret, "", "", eperm),
        (ret, "", "", enosys),
    ]
    labels = {"flags": len(program) - 6, "enosys": len(program) - 3}
    labels.update({"eperm": len(program) - 2, "foreign": len(program) - 1})
    out = b""
    for index, (code, true, false, k) in enumerate(program):
        jt = labels[true] - index - 1 if true else 0
        jf = labels[false] - index - 1 if false else 0
        out += struct.pack("=HBBI", code, jt, jf, k)
    return out


def unmount_under(root: Path) -> list[str]:
    """Detach every mount below `root` (from /proc/self/mounts); the mount points it undid."""
    prefix = str(root.resolve()) + "/"
    try:
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts]
    except OSError:
        return []
    undone = []
    for point in sorted(points, key=len, reverse=True):  # deepest first
        decoded = point.encode().decode("unicode_escape")  # /proc escapes spaces as \040
        if decoded.startswith(prefix):
            unmount(Path(decoded))
            undone.append(decoded)
    return undone
