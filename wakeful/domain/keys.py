"""Every store key, built in one place: `keys.pool("web-v1")`, not `f"pools/{name}"`.

The prefixes are what watches and lists take; each builder names one record. Keys are relative
to the store's namespace (the store adds it).

| builder                    | key                         | model (wakeful.domain.models) |
|----------------------------|-----------------------------|-------------------------------|
| `app(name)`                | `apps/{app}`                | App                           |
| `version(app, version)`    | `versions/{app}/{version}`  | Version                       |
| `pool(name)`               | `pools/{pool}`              | Pool                          |
| `sandbox(id)`              | `sandboxes/{id}`            | Sandbox                       |
| `node(name)`               | `nodes/{node}`              | Node (bound to a TTL lease)   |
| `cordon(node)`             | `cordons/{node}`            | Cordon                        |
| `seen(node)`               | `seen/{node}`               | SeenNode                      |
| `token(name)`              | `tokens/{name}`             | Token (a hash, never a secret)|
| `leader(role)`             | `leaders/{role}`            | Leader (bound to a TTL lease) |
| `rollout(app, version)`    | `rollouts/{app}/{version}`  | RolloutRecord                 |
| `state(app)`               | `states/{app}`              | AppState                      |
| `ingress(replica)`         | `ingresses/{replica}`       | IngressReplica (TTL lease)    |
| `secrets(app)`             | `secrets/{app}`             | AppSecrets (values sealed)    |
| `SECRETS_KEY`              | `meta/secrets-key`          | SecretsKey                    |
| `registry(host)`           | `registries/{host}`         | RegistryLogin (sealed)        |
| `cert(name)`               | `certs/{name}`              | CertRecord                    |
| `cert_key(name)`           | `acme/keys/{name}`          | CertKey (sealed)              |
| `ACME_ACCOUNT`             | `acme/account`              | AcmeAccount (key sealed)      |
| `challenge(token)`         | `acme/challenges/{token}`   | AcmeChallenge                 |
"""

from __future__ import annotations

APPS = "apps/"
VERSIONS = "versions/"
POOLS = "pools/"
SANDBOXES = "sandboxes/"
NODES = "nodes/"
CORDONS = "cordons/"
SEEN = "seen/"
TOKENS = "tokens/"
LEADERS = "leaders/"
ROLLOUTS = "rollouts/"
STATES = "states/"
INGRESSES = "ingresses/"
SECRETS = "secrets/"
REGISTRIES = "registries/"
CERTS = "certs/"
CHALLENGES = "acme/challenges/"
ACME_KEYS = "acme/keys/"
ACME_ACCOUNT = "acme/account"
SECRETS_KEY = "meta/secrets-key"
"""The id of the key new secret values are sealed under (`wakeful.secrets.keys`)."""
UI_SESSION_KEY = "ui/session-key"
"""The key the dashboard's session cookies are signed with (`wakeful.dashboard`)."""


def app(name: str) -> str:
    return f"{APPS}{name}"


def versions_of(app: str) -> str:
    """The prefix of one app's versions."""
    return f"{VERSIONS}{app}/"


def version(app: str, version: str) -> str:
    return f"{VERSIONS}{app}/{version}"


def pool(name: str) -> str:
    return f"{POOLS}{name}"


def sandbox(sandbox_id: str) -> str:
    return f"{SANDBOXES}{sandbox_id}"


def node(name: str) -> str:
    return f"{NODES}{name}"


def cordon(node: str) -> str:
    return f"{CORDONS}{node}"


def seen(node: str) -> str:
    return f"{SEEN}{node}"


def token(name: str) -> str:
    return f"{TOKENS}{name}"


def name_in(key: str, prefix: str) -> str:
    """The last part of a key under `prefix`: `name_in("sandboxes/sb-1", SANDBOXES)`."""
    return key.removeprefix(prefix)


def leader(role: str) -> str:
    """The elected holder of a role that runs once cluster-wide (`activator`)."""
    return f"{LEADERS}{role}"


def rollouts_of(app: str) -> str:
    """The prefix of one app's rollouts."""
    return f"{ROLLOUTS}{app}/"


def rollout(app: str, version: str) -> str:
    return f"{ROLLOUTS}{app}/{version}"


def state(app: str) -> str:
    """Who holds a stateful app's state, and the digest of its latest archive."""
    return f"{STATES}{app}"


def ingress(replica: str) -> str:
    """An ingress replica that serves tunnels, and where its peers relay to it."""
    return f"{INGRESSES}{replica}"


def secrets(app: str) -> str:
    """An app's secrets, every value sealed (`wakeful.secrets`)."""
    return f"{SECRETS}{app}"


def registry(host: str) -> str:
    """A registry's login, its password sealed (`wakeful.secrets.registries`); `host` in
    lowercase, `:PORT` included."""
    return f"{REGISTRIES}{host}"


def cert(name: str) -> str:
    """A name's certificate from ACME (`wakeful.certs`); its key is `cert_key(name)`."""
    return f"{CERTS}{name}"


def cert_key(name: str) -> str:
    """The sealed private key of a name's certificate: the control plane's alone."""
    return f"{ACME_KEYS}{name}"


def challenge(token: str) -> str:
    """An HTTP-01 challenge the ingresses answer while an order waits (`wakeful.certs`)."""
    return f"{CHALLENGES}{token}"
