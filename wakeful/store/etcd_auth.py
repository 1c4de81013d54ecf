"""etcd's own users and roles for the pieces: `wakeful etcd-auth` creates them and turns
authentication on, so a node's or an ingress's etcd certificate reaches only its own keys.

etcd (with `--client-cert-auth` and authentication enabled) takes a client certificate's
common name as the user. Each piece's certificate names one of `PIECES`; the role of the same
name grants key ranges under the store's namespace:

- `wakeful-control` (activator, idle monitor): reads and writes everything under it;
- `wakeful-node`: reads and writes sandboxes/, nodes/, seen/ and cordons/ (its own cordon
  when it stops); reads pools/, versions/ and states/ (a stateful app's state is stored and
  released through the control API, which checks that the node holds it);
- `wakeful-ingress`: reads apps/ and sandboxes/; for tunnels (invariant 22) it also reads
  tokens/ (digests only: it checks nodes' streams and peers' relays) and nodes/ (where each
  node's streams are), and writes ingresses/ (its own record); for certificates from ACME it
  reads acme/challenges/ (it answers them) and certs/ (the certificates, not their keys);
  nothing else.

Sealed records (`SEALED`: apps' secrets, registries' logins, the current key's id, ACME's
account key and certificates' keys) are read by
the control plane alone: no other role's grant covers any of them, which `sealed_readers`
checks (tests/store/test_etcd_auth.py). A node gets an app's secrets from the control API for
a sandbox it is starting, and never a registry login (it fetches image blobs from the control
plane).

Every role also reads the namespace key itself (the store's connect check). etcd needs a
`root` user with the `root` role before authentication can be turned on: the certificate that
runs the command must be that user's (common name `root`), or it would lock itself out.
Users have no password: only a certificate from the cluster's CA logs them in.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from etcd3aio import Etcd3Client
from etcd3aio.auth import PermissionType
from etcd3aio.kv import prefix_range_end

from wakeful.domain import keys

from .errors import StoreError

CONTROL, NODE, INGRESS = "wakeful-control", "wakeful-node", "wakeful-ingress"
ROOT = "root"
READ, READWRITE = PermissionType.READ, PermissionType.READWRITE


@dataclass(frozen=True)
class Grant:
    prefix: str
    """Relative to the namespace; "" is all of it."""
    permission: PermissionType


PIECES: dict[str, tuple[Grant, ...]] = {
    CONTROL: (Grant("", READWRITE),),
    NODE: (
        *(Grant(p, READWRITE) for p in (keys.SANDBOXES, keys.NODES, keys.SEEN, keys.CORDONS)),
        *(Grant(p, READ) for p in (keys.POOLS, keys.VERSIONS, keys.LEADERS, keys.STATES)),
    ),
    INGRESS: (
        *(Grant(p, READ) for p in (keys.APPS, keys.SANDBOXES, keys.LEADERS)),
        # A replica serving tunnels: the token digests it checks streams against, the
        # nodes' coverage tables it relays by, and its own record among its peers'.
        *(Grant(p, READ) for p in (keys.TOKENS, keys.NODES)),
        Grant(keys.INGRESSES, READWRITE),
        # Certificates from ACME: the challenges it answers, and each certificate's serial,
        # to know when to fetch them with their keys from the control API.
        *(Grant(p, READ) for p in (keys.CHALLENGES, keys.CERTS)),
    ),
}


SEALED = (keys.SECRETS, keys.REGISTRIES, keys.SECRETS_KEY, keys.ACME_KEYS, keys.ACME_ACCOUNT)
"""What only `wakeful-control` reads."""


def sealed_readers(pieces: dict[str, tuple[Grant, ...]] = PIECES) -> list[str]:
    """`role: prefix` for every grant of a role other than the control plane's that reaches a
    sealed record (an empty list is the rule kept)."""
    return [
        f"{name}: {sealed}"
        for name, grants in pieces.items()
        if name != CONTROL
        for grant in grants
        for sealed in SEALED
        if sealed.startswith(grant.prefix) or grant.prefix.startswith(sealed)
    ]


def common_name(certificate: Path) -> str:
    """The subject's common name of a PEM certificate ("" when it has none)."""
    try:
        decoded = ssl._ssl._test_decode_cert(str(certificate))  # type: ignore[attr-defined]
    except (OSError, ssl.SSLError) as exc:
        raise StoreError(f"cannot read the certificate {certificate}: {exc}") from exc
    for part in decoded.get("subject", ()):
        for name, value in part:
            if name == "commonName":
                return str(value)
    return ""


async def enable_auth(client: Etcd3Client, namespace: str) -> list[str]:
    """Create the roles and users of `PIECES` (and `root`), grant them, turn authentication
    on. Idempotent: what exists is kept, grants are set again. The steps done, as lines."""
    leaks = sealed_readers()
    if leaks:
        raise StoreError(f"a role other than {CONTROL} would read sealed records: {leaks}")
    auth = client.auth
    if auth is None:
        raise StoreError("the etcd client is not connected")
    done: list[str] = []
    users = set((await auth.user_list()).users)
    roles = set((await auth.role_list()).roles)
    if ROOT not in users:
        await auth.user_add(ROOT, no_password=True)
        done.append(f"user {ROOT}: created (no password: its certificate logs it in)")
    await auth.user_grant_role(ROOT, ROOT)
    base = namespace.encode()
    for name, grants in PIECES.items():
        if name not in roles:
            await auth.role_add(name)
            done.append(f"role {name}: created")
        await auth.role_grant_permission(name, base, None, perm_type=READ)
        for grant in grants:
            start = base + grant.prefix.encode()
            await auth.role_grant_permission(
                name, start, prefix_range_end(start), perm_type=grant.permission
            )
            kind = "read-write" if grant.permission is READWRITE else "read"
            done.append(f"role {name}: {kind} {namespace}{grant.prefix}")
        if name not in users:
            await auth.user_add(name, no_password=True)
            done.append(f"user {name}: created")
        await auth.user_grant_role(name, name)
    await auth.auth_enable()  # etcd ignores it when already on (3.4 has no AuthStatus call)
    done.append("authentication: enabled")
    return done
