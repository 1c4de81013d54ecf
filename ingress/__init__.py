"""The ingress: routes Host to an app, carries requests on leased capacity, proxies them.

Layers on the proxy path: `edge` (ASGI) → `proxy` (routing, leases, headers, retries,
streaming) → `upstream` (pooled connections on asyncio protocols, bounded per app).
`server.Ingress` wires and runs them.
"""

from wakeful.ingress.server import Ingress, serve
from wakeful.ingress.settings import IngressSettings

__all__ = ["Ingress", "IngressSettings", "serve"]
