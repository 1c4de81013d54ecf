"""Certificates from an ACME server for every app's names, ordered by the leading activator
and served by every ingress (docs/design/certs.md).

- `acme_client.py`: one ACME conversation through certbot's `acme` package (in a thread).
- `manager.py`: `CertManager`, which orders, renews and drops; what ingresses are served.
- `api.py`: the control API's routes.

The decisions (which names, when) are `wakeful.domain.certs`; the records are
`wakeful.domain.models.certs`.
"""

from .acme_client import AcmeFailure
from .api import certs_router
from .manager import AcmeSettings, CertManager, CertMetrics, Sealer, Served

__all__ = [
    "AcmeFailure",
    "AcmeSettings",
    "CertManager",
    "CertMetrics",
    "Sealer",
    "Served",
    "certs_router",
]
