"""The clients of the control API from outside the control plane, one module per caller.

| module | its one job |
|---|---|
| `control` | the CLI's `ControlClient`, `locate` (where the control plane is), `CliSettings` |
| `node` | a node's `HttpArtifacts`, `HttpBlobs`, `HttpKeeper`, `HttpSecrets` and `HttpLogSink` |
| `wire` | what both share: `Endpoint` (URL and bearer token), a path segment, an error's reason |

Every request carries the bearer token in a header: never in a URL, never in a message; httpx's
exceptions never leave these modules.
"""

from wakeful.remote.control import (
    ApiRefused,
    ApiUnreachable,
    AppLogs,
    CliSettings,
    ControlApiError,
    ControlClient,
    NoControlPlane,
    locate,
)
from wakeful.remote.node import HttpArtifacts, HttpBlobs, HttpKeeper, HttpLogSink, HttpSecrets
from wakeful.remote.wire import Endpoint

__all__ = [
    "ApiRefused",
    "ApiUnreachable",
    "AppLogs",
    "CliSettings",
    "ControlApiError",
    "ControlClient",
    "Endpoint",
    "HttpArtifacts",
    "HttpBlobs",
    "HttpKeeper",
    "HttpLogSink",
    "HttpSecrets",
    "NoControlPlane",
    "locate",
]
