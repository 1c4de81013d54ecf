"""What the kernel refuses inside a sandbox besides its namespaces: new user namespaces (a
seccomp filter bwrap installs) and, where Landlock has scopes, abstract UNIX sockets and signals
outside it (entered by `slot_main.scope`; here, whether the kernel has it)."""

from __future__ import annotations

import ctypes
import struct

_libc = ctypes.CDLL(None, use_errno=True)


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
