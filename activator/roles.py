"""Which role may call which route of the control API: one explicit decision per route.

Every route of the app `create_app` builds (the lease API, and the deploy, node, logs and
token routers mounted on it) is a key of `ROUTES`, as `(METHOD, path template)`. A route the
map does not name is admin-only (`access`): a new route is denied to nodes and ingresses until
someone decides otherwise here, and tests/wakeful/test_roles.py fails until they do.

An admin token may call everything (a sandbox's secrets answer it with no value: a node run
with the admin token starts only apps that have none); a node token and
an ingress token only what their component needs of the control plane (see `wakeful.remote`'s
`HttpArtifacts`, `HttpLogSink` and `HttpSecrets`, and `wakeful.activator.client.HttpLeases`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from wakeful.domain.models import Role

Public = Literal["public"]
PUBLIC: Final[Public] = "public"
"""No token: health and metrics reveal no app data and no secret."""
Session = Literal["session"]
SESSION: Final[Session] = "session"
"""No bearer token: the dashboard's routes (`wakeful.dashboard`), which check an
admin token's signed session cookie themselves, and serve only the login form without it."""
Access = frozenset[Role] | Public | Session

ADMIN_ONLY: Final = frozenset({Role.ADMIN})
NODE: Final = frozenset({Role.ADMIN, Role.NODE})
INGRESS: Final = frozenset({Role.ADMIN, Role.INGRESS})
ANY_ROLE: Final = frozenset(Role)

WEBSOCKET: Final = "WEBSOCKET"
"""The method a WebSocket route is keyed by: its handshake is a GET, but not an HTTP route."""

ROUTES: Final[Mapping[tuple[str, str], Access]] = {
    ("GET", "/healthz"): PUBLIC,
    ("HEAD", "/healthz"): PUBLIC,  # load balancers' health checks
    ("GET", "/readyz"): PUBLIC,  # the leader answers 200, a standby 503
    ("GET", "/metrics"): PUBLIC,
    ("GET", "/openapi.json"): ANY_ROLE,  # the routes' shapes: for whoever may call some
    # leases: what an ingress does (activator/api.py)
    ("POST", "/v1/leases"): INGRESS,
    ("POST", "/v1/leases/{lease_id}/renew"): INGRESS,
    ("DELETE", "/v1/leases/{lease_id}"): INGRESS,
    (WEBSOCKET, "/v1/leases/channel"): INGRESS,  # the same, many calls in flight
    ("GET", "/v1/pools"): ADMIN_ONLY,
    # certificates from ACME (certs/api.py): an ingress serves them, keys included
    ("GET", "/v1/certs"): ADMIN_ONLY,
    ("GET", "/v1/certs/served"): INGRESS,
    # artifacts and deploys (deploy/api.py): a node fetches what it runs
    ("GET", "/v1/artifacts/{digest}"): NODE,
    ("PUT", "/v1/artifacts/{digest}"): ADMIN_ONLY,
    # images (deploy/images.py): an archive uploaded for a deploy; a node fetches blobs
    ("PUT", "/v1/images/archives"): ADMIN_ONLY,
    ("POST", "/v1/images/blobs/missing"): ADMIN_ONLY,
    ("PUT", "/v1/images/blobs/{digest}"): ADMIN_ONLY,
    ("GET", "/v1/blobs/{digest}"): NODE,
    # a stateful app's state, handed back by the node holding it (deploy/states.py checks it)
    ("PUT", "/v1/states/{app}/archives/{digest}"): NODE,
    ("POST", "/v1/states/{app}/release"): NODE,
    ("POST", "/v1/states/{app}/keep"): NODE,
    ("POST", "/v1/deploys"): ADMIN_ONLY,
    ("GET", "/v1/deploys/{app}/{version}"): ADMIN_ONLY,
    ("POST", "/v1/apps/{app}/rollback"): ADMIN_ONLY,
    ("GET", "/v1/apps/{app}/traffic"): ADMIN_ONLY,
    ("GET", "/v1/apps/{app}/routed"): ADMIN_ONLY,
    ("PUT", "/v1/apps/{app}/traffic"): ADMIN_ONLY,
    ("POST", "/v1/apps/{app}/promote"): ADMIN_ONLY,
    ("PUT", "/v1/apps/{app}/tags/{tag}"): ADMIN_ONLY,
    ("DELETE", "/v1/apps/{app}/tags/{tag}"): ADMIN_ONLY,
    ("DELETE", "/v1/apps/{app}"): ADMIN_ONLY,
    ("GET", "/v1/apps"): ADMIN_ONLY,
    # sandbox output (deploy/logs_api.py): a node pushes, only an admin reads
    ("POST", "/v1/logs"): NODE,
    ("GET", "/v1/apps/{app}/logs"): ADMIN_ONLY,
    ("GET", "/v1/sandboxes/{sandbox_id}/log"): ADMIN_ONLY,
    # nodes (wakeful/controller/api.py)
    ("GET", "/v1/nodes"): ADMIN_ONLY,
    ("GET", "/v1/nodes/{node}"): ADMIN_ONLY,
    ("POST", "/v1/nodes/{node}/drain"): ADMIN_ONLY,
    ("DELETE", "/v1/nodes/{node}/drain"): ADMIN_ONLY,
    ("POST", "/v1/apps/{app}/state/release"): ADMIN_ONLY,
    # tokens (activator/tokens_api.py)
    ("GET", "/v1/whoami"): ANY_ROLE,  # the caller's own token: its name and role
    ("GET", "/v1/tokens"): ADMIN_ONLY,
    ("POST", "/v1/tokens"): ADMIN_ONLY,
    ("POST", "/v1/tokens/{name}/rotate"): ADMIN_ONLY,
    ("DELETE", "/v1/tokens/{name}"): ADMIN_ONLY,
    # app secrets (wakeful/secrets/api.py): set and listed by an admin, read by a node only,
    # for a sandbox it is starting (the route checks which)
    ("GET", "/v1/apps/{app}/secrets"): ADMIN_ONLY,
    ("POST", "/v1/apps/{app}/secrets"): ADMIN_ONLY,
    ("POST", "/v1/apps/{app}/secrets/unset"): ADMIN_ONLY,
    ("GET", "/v1/secrets/keys"): ADMIN_ONLY,
    ("POST", "/v1/secrets/keys"): ADMIN_ONLY,
    ("DELETE", "/v1/secrets/keys/{key_id}"): ADMIN_ONLY,
    ("GET", "/v1/sandboxes/{sandbox_id}/secrets"): NODE,  # the admin's: never a value
    # registries' logins (wakeful/secrets/registry_api.py): the control plane pulls images;
    # a node never needs one (it fetches blobs from the control plane)
    ("GET", "/v1/registries"): ADMIN_ONLY,
    ("PUT", "/v1/registries/{host}"): ADMIN_ONLY,
    ("DELETE", "/v1/registries/{host}"): ADMIN_ONLY,
    # the dashboard (wakeful/dashboard/server.py): a browser logs in with the admin token once
    ("GET", "/ui"): SESSION,  # the login form, or with a session the page
    ("GET", "/ui/dashboard.js"): SESSION,  # static, no data
    ("GET", "/ui/dashboard.css"): SESSION,
    ("POST", "/ui/login"): SESSION,
    ("POST", "/ui/logout"): SESSION,
    ("GET", "/ui/session"): SESSION,
    ("GET", "/ui/events"): SESSION,
    ("GET", "/ui/logs"): SESSION,  # the logs panel (a fixed path: the gate matches paths)
}


def access(method: str, path: str | None) -> Access:
    """The decision for a route; admin-only when the map has none (default deny)."""
    if path is None:
        return ADMIN_ONLY
    return ROUTES.get((method, path), ADMIN_ONLY)


def needed(allowed: frozenset[Role]) -> str:
    """`"the node or admin role"`: the roles that may, for an error answer."""
    names = sorted(allowed, key=lambda role: (role is Role.ADMIN, role.value))
    return "the " + " or ".join(names) + " role"
