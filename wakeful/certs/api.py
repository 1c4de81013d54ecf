"""Certificates on the control API (`wakeful.activator.roles` says who may call what).

GET /v1/certs          admin: each name's state, issuer, expiry, last error, next attempt;
                       never a key; the certificate files in WAKEFUL_TLS_DIR too, when the
                       control plane has it (`source: file`; `default.crt` as `(default)`)
GET /v1/certs/served   ingress: every unexpired certificate with its private key, for the
                       ingresses to keep in memory and serve (never written to their disks)

With ACME off, the second answers an empty list.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.
import time
from pathlib import Path

import anyio
from fastapi import APIRouter
from pydantic import BaseModel

from wakeful.domain import certs as rules

from .acme_client import describe
from .manager import CertManager, file_names

MAX_FILE = 1 << 20
"""A certificate file's bound: a chain, with room."""


class CertEntry(BaseModel):
    name: str
    app: str | None = None
    source: str
    """`acme`, or `file` (WAKEFUL_TLS_DIR)."""
    state: str
    """A `CertState` for ACME's; `valid`, `expired` or `unreadable` for a file."""
    issuer: str | None = None
    not_before: float | None = None
    not_after: float | None = None
    serial: str | None = None
    renew_at: float | None = None
    failures: int = 0
    last_error: str = ""
    next_attempt: float = 0.0


class ServedCert(BaseModel):
    name: str
    chain: str
    key: str
    serial: str


DEFAULT_FILE = "default.crt"
DEFAULT_NAME = "(default)"
"""How `default.crt` is listed: it serves a client whose name nothing else covers."""


def file_entries(directory: Path, now: float) -> list[CertEntry]:
    """The certificate files of `directory` as listed (blocking): what `ingress.tls` serves,
    the default pair's first (when it is there)."""
    found = []
    files = [(name, f"{name}.crt") for name in sorted(file_names(directory))]
    if (directory / DEFAULT_FILE).exists():
        files.insert(0, (DEFAULT_NAME, DEFAULT_FILE))
    for name, file in files:
        path = directory / file
        try:
            if path.stat().st_size > MAX_FILE:
                raise ValueError(f"over {MAX_FILE} bytes")
            not_before, not_after, issuer, serial = describe(path.read_text())
        except (OSError, ValueError) as exc:
            why = f"{path}: {exc}"
            found.append(CertEntry(name=name, source="file", state="unreadable", last_error=why))
            continue
        state = "valid" if not_after > now else "expired"
        found.append(
            CertEntry(
                name=name,
                source="file",
                state=state,
                issuer=issuer,
                not_before=not_before,
                not_after=not_after,
                serial=serial,
            )
        )
    return found


def certs_router(manager: CertManager | None, files: Path | None = None) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/certs")
    async def listing() -> list[CertEntry]:
        found = []
        if files is not None:
            found = await anyio.to_thread.run_sync(file_entries, files, time.time())
        if manager is None:
            return found
        for record in await manager.listing():
            issued = record.issued
            found.append(
                CertEntry(
                    name=record.name,
                    app=record.app,
                    source="acme",
                    state=record.state,
                    issuer=issued.issuer if issued else None,
                    not_before=issued.not_before if issued else None,
                    not_after=issued.not_after if issued else None,
                    serial=issued.serial if issued else None,
                    renew_at=rules.renew_at(record) if issued else None,
                    failures=record.failures,
                    last_error=record.last_error,
                    next_attempt=record.next_attempt,
                )
            )
        return found

    @router.get("/v1/certs/served")
    async def served() -> list[ServedCert]:
        if manager is None:
            return []
        return [
            ServedCert(name=s.name, chain=s.chain, key=s.key, serial=s.serial)
            for s in await manager.served()
        ]

    return router
