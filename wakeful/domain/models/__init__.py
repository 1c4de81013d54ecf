"""The data model: what lives in the store, one pydantic model per kind of key.

Every model validates on construction and on load, so a value read back from the store is
as trustworthy as one built in code. Validation errors name the field and the value that
was refused (`describe_validation_error`). Every name is importable from here, whichever
module below defines it:

- `base.py`: `Model` (unknown fields refused, frozen, finite floats), the name, host, sandbox
  id and digest patterns, `describe_validation_error`.
- `apps.py`: an app as deployed: `AppSpec` and its parts (`HealthCheck`, `Concurrency`,
  `Resources` with `parse_size`, `StateSpec`), `App`, `Version`, and `AppState` (who holds a
  stateful app's state).
- `pools.py`: `Pool` with its `ScaleChange`, `Sandbox`, `SandboxStatus` and the named sets of
  statuses (`STARTING`, `SIZED`, `ON_NODE`, `HAS_PROCESS`, `GONE`, `FINISHED`).
- `nodes.py`: `Node` with its `Tunnel` and `Frozen` sandboxes, `Cordon`, `SeenNode`,
  `IngressReplica`.
- `control.py`: the control plane's own records: `RolloutRecord`, `Leader`, `SessionKey`.
- `images.py`: an image as a version pins it, `ImageRecord` with its `Layer`s and
  `ImageConfig`, and what its config says (`image_env`, `exposed_port`).
- `tokens.py`: `Token` and its `Role`.
- `secrets.py`: an app's sealed secrets, `AppSecrets` of `SealedValue`s, the key new values
  are sealed under (`SecretsKey`), and the rules on names and values.
- `certs.py`: certificates from an ACME server (`CertRecord`, `Issued`, `CertState`), the
  ACME account (`AcmeAccount`) and the HTTP-01 challenges ingresses answer (`AcmeChallenge`).
- `registries.py`: a registry's login (`RegistryLogin`), its password sealed like a secret,
  and the rules on hosts, usernames and passwords.

| key                         | model          | module     |
|-----------------------------|----------------|------------|
| `apps/{app}`                | App            | `apps`     |
| `versions/{app}/{version}`  | Version        | `apps`     |
| `states/{app}`              | AppState       | `apps`     |
| `pools/{pool}`              | Pool           | `pools`    |
| `sandboxes/{id}`            | Sandbox        | `pools`    |
| `nodes/{node}`              | Node           | `nodes`    |
| `cordons/{node}`            | Cordon         | `nodes`    |
| `seen/{node}`               | SeenNode       | `nodes`    |
| `ingresses/{replica}`       | IngressReplica | `nodes`    |
| `rollouts/{app}/{version}`  | RolloutRecord  | `control`  |
| `leaders/{role}`            | Leader         | `control`  |
| `ui/session-key`            | SessionKey     | `control`  |
| `tokens/{name}`             | Token          | `tokens`   |
| `certs/{name}`              | CertRecord     | `certs`    |
| `acme/keys/{name}`          | CertKey        | `certs`    |
| `acme/account`              | AcmeAccount    | `certs`    |
| `acme/challenges/{token}`   | AcmeChallenge  | `certs`    |
| `secrets/{app}`             | AppSecrets     | `secrets`  |
| `meta/secrets-key`          | SecretsKey     | `secrets`  |
| `registries/{host}`         | RegistryLogin  | `registries` |
"""

from .apps import (
    ENV_NAME,
    IMAGE_REF,
    MADE,
    MAX_SIZE,
    MAX_SPLIT,
    MAX_TAGS,
    MIN_SIZE,
    RESERVED_ENV,
    SIZE,
    STATE_PATH,
    UNITS,
    App,
    AppSpec,
    AppState,
    Concurrency,
    HealthCheck,
    Resources,
    RolloutRules,
    StateSpec,
    Version,
    format_size,
    made_by,
    parse_size,
)
from .base import (
    HOST_PATTERN,
    NAME_PATTERN,
    SANDBOX_ID_PATTERN,
    Digest,
    Host,
    Model,
    Name,
    describe_validation_error,
)
from .certs import (
    ACCOUNT_PURPOSE,
    MAX_CHAIN_PEM,
    MAX_KEY_PEM,
    TOKEN_PATTERN,
    AcmeAccount,
    AcmeChallenge,
    CertKey,
    CertRecord,
    CertState,
    ChallengeToken,
    Issued,
    SealedKey,
    cert_key_purpose,
)
from .control import Leader, RolloutRecord, SessionKey
from .images import (
    BLOB_DIGEST,
    LAYER_TYPES,
    MAX_LAYERS,
    BlobDigest,
    ImageConfig,
    ImageRecord,
    ImageText,
    Layer,
    exposed_port,
    image_env,
)
from .nodes import (
    Cordon,
    Frozen,
    ImageCacheUse,
    IngressReplica,
    Node,
    ReplicaCoverage,
    SeenNode,
    Tunnel,
)
from .pools import (
    FINISHED,
    GONE,
    HAS_PROCESS,
    ON_NODE,
    SIZED,
    STARTING,
    Pool,
    Sandbox,
    SandboxStatus,
    ScaleChange,
)
from .registries import (
    DOCKER_HUB,
    MAX_HOST,
    MAX_PASSWORD_BYTES,
    MAX_USERNAME,
    REGISTRY_HOST_PATTERN,
    RegistryHost,
    RegistryLogin,
    SealedPassword,
    normal_registry_host,
    password_problem,
    registry_host_problem,
    username_problem,
)
from .secrets import (
    KEY_ID_PATTERN,
    MAX_SECRET_BYTES,
    MAX_SECRET_NAME,
    MAX_SECRETS,
    MAX_SECRETS_BYTES,
    NONCE_BYTES,
    SEAL_FORMAT,
    SEALED_PATTERN,
    TAG_BYTES,
    AppSecrets,
    SealedText,
    SealedValue,
    SecretsKey,
    manifest_overlap,
    plain_size,
    sealed_length,
    secret_name_problem,
    secret_value_problem,
)
from .tokens import ADMIN_TOKEN, UP_INGRESS_TOKEN, Role, Token

__all__ = [
    "ACCOUNT_PURPOSE",
    "ADMIN_TOKEN",
    "BLOB_DIGEST",
    "DOCKER_HUB",
    "ENV_NAME",
    "FINISHED",
    "GONE",
    "HAS_PROCESS",
    "HOST_PATTERN",
    "IMAGE_REF",
    "KEY_ID_PATTERN",
    "LAYER_TYPES",
    "MADE",
    "MAX_CHAIN_PEM",
    "MAX_HOST",
    "MAX_KEY_PEM",
    "MAX_LAYERS",
    "MAX_PASSWORD_BYTES",
    "MAX_SECRETS",
    "MAX_SECRETS_BYTES",
    "MAX_SECRET_BYTES",
    "MAX_SECRET_NAME",
    "MAX_SIZE",
    "MAX_SPLIT",
    "MAX_TAGS",
    "MAX_USERNAME",
    "MIN_SIZE",
    "NAME_PATTERN",
    "NONCE_BYTES",
    "ON_NODE",
    "REGISTRY_HOST_PATTERN",
    "RESERVED_ENV",
    "SANDBOX_ID_PATTERN",
    "SEALED_PATTERN",
    "SEAL_FORMAT",
    "SIZE",
    "SIZED",
    "STARTING",
    "STATE_PATH",
    "TAG_BYTES",
    "TOKEN_PATTERN",
    "UNITS",
    "UP_INGRESS_TOKEN",
    "AcmeAccount",
    "AcmeChallenge",
    "App",
    "AppSecrets",
    "AppSpec",
    "AppState",
    "BlobDigest",
    "CertKey",
    "CertRecord",
    "CertState",
    "ChallengeToken",
    "Concurrency",
    "Cordon",
    "Digest",
    "Frozen",
    "HealthCheck",
    "Host",
    "ImageCacheUse",
    "ImageConfig",
    "ImageRecord",
    "ImageText",
    "IngressReplica",
    "Issued",
    "Layer",
    "Leader",
    "Model",
    "Name",
    "Node",
    "Pool",
    "RegistryHost",
    "RegistryLogin",
    "ReplicaCoverage",
    "Resources",
    "Role",
    "RolloutRecord",
    "RolloutRules",
    "Sandbox",
    "SandboxStatus",
    "ScaleChange",
    "SealedKey",
    "SealedPassword",
    "SealedText",
    "SealedValue",
    "SecretsKey",
    "SeenNode",
    "SessionKey",
    "StateSpec",
    "Token",
    "Tunnel",
    "Version",
    "cert_key_purpose",
    "describe_validation_error",
    "exposed_port",
    "format_size",
    "image_env",
    "made_by",
    "manifest_overlap",
    "normal_registry_host",
    "parse_size",
    "password_problem",
    "plain_size",
    "registry_host_problem",
    "sealed_length",
    "secret_name_problem",
    "secret_value_problem",
    "username_problem",
]
