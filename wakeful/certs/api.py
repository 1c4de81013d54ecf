"""Certificates on the control API (`wakeful.activator.roles` says who may call what).

GET /v1/certs          admin: each name's state, issuer, expiry, last error, next attempt;
                       never a key
GET /v1/certs/served   ingress: every unexpired certificate with its private key, for the
                       ingresses to keep in memory and serve (never written to their disks)

With ACME off both answer an empty list.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.
from fastapi import APIRouter
from pydantic import BaseModel

from wakeful.domain import certs as rules
from wakeful.domain.models import CertState

from .manager import CertManager


class CertEntry(BaseModel):
    name: str
    app: str | None
    source: str
    state: CertState
    issuer: str | None
    not_before: float | None
    not_after: float | None
    serial: str | None
    renew_at: float | None
    failures: int
    last_error: str
    next_attempt: float


class ServedCert(BaseModel):
    name: str
    chain: str
    key: str
    serial: str


def certs_router(manager: CertManager | None) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/certs")
    async def listing() -> list[CertEntry]:
        if manager is None:
            return []
        found = []
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
