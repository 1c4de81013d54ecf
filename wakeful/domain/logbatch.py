"""The wire format of sandbox output that a node pushes to the control plane (`POST /v1/logs`).

Nodes push; the control plane never dials a node (one behind NAT cannot be reached). Each
chunk says which bytes of its sandbox's output stream it holds (`offset`, `size`), so the
control plane tells a chunk sent twice (a retry after a lost answer) from a gap (bytes the
node dropped while its buffer was full) without trusting anything else.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, StringConstraints, model_validator

from wakeful.domain.grpcstatus import MAX_CODE
from wakeful.domain.logfiles import LATEST
from wakeful.domain.models import NAME_PATTERN, Model, Name

MAX_BATCH_BYTES = 256 * 1024
"""Raw output bytes in one batch, over all its chunks."""
MAX_BODY_BYTES = 2 * 1024 * 1024
"""A batch as JSON: escaping can grow text up to 6x (a control byte becomes `\\u00XX`)."""
MAX_CHUNKS = 1024
BEHIND_HEADER = "Wakeful-Logs-Behind"
"""The logs answer's header saying which nodes' latest lines have not arrived."""
SandboxId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,127}$")]
"""As `Sandbox.id`."""


class ShipFailed(Exception):
    """The sink did not take the batch; the shipper keeps it and tries again later."""


class OutputChunk(Model):
    """Bytes `offset` to `offset + size` of one sandbox's output, decoded as UTF-8."""

    sandbox: SandboxId
    app: Name
    version: Annotated[str, StringConstraints(pattern=f"^$|{NAME_PATTERN}")] = ""
    """The version its pool runs ("" from a node that does not say)."""
    created_at: float = Field(ge=0, description="the sandbox's creation: the order of a log")
    offset: int = Field(ge=0)
    size: int = Field(ge=0, le=MAX_BATCH_BYTES)
    text: str = Field(max_length=MAX_BATCH_BYTES)
    finished: bool = Field(default=False, description="the sandbox ended: nothing follows")

    @model_validator(mode="after")
    def _text_fits(self) -> Self:
        # Decoding never yields more characters than bytes (a bad byte becomes one U+FFFD).
        if len(self.text) > self.size:
            raise ValueError(f"text: {len(self.text)} characters from {self.size} bytes")
        return self


class LogBatch(Model):
    node: Name
    interval: float = Field(gt=0, le=3600, description="seconds between the node's batches")
    pending: int = Field(ge=0, description="bytes still buffered on the node after this batch")
    dropped: int = Field(ge=0, description="bytes the node dropped (buffers full) since it began")
    chunks: list[OutputChunk] = Field(default_factory=list, max_length=MAX_CHUNKS)

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        total = sum(chunk.size for chunk in self.chunks)
        if total > MAX_BATCH_BYTES:
            raise ValueError(f"chunks: {total} bytes, more than {MAX_BATCH_BYTES}")
        return self


# -- access lines, from the ingresses (issue 40) ------------------------------------------------

MAX_PATH = 2048
"""Characters of a request's path an access line keeps; past it, cut."""
MAX_ACCESS_LINES = 1000
"""Lines in one `access` operation of the lease channel (the ingress cuts by bytes too)."""
ACCESS_OP_BYTES = 256 * 1024
"""About what one `access` operation holds: well inside a channel frame."""
VersionName = Annotated[str, StringConstraints(pattern=f"^$|{NAME_PATTERN}")]


class AccessLine(Model):
    """One proxied request as an ingress saw it; `sample`: the requests it stands for (an
    ingress past its rate keeps one line in `sample`, `wakeful.domain.sampling.Sampler`)."""

    ts: float = Field(ge=0, le=LATEST, description="when the answer ended, seconds since the epoch")
    app: Name
    version: VersionName = ""
    sandbox: Annotated[str, StringConstraints(pattern=r"^$|^[a-z0-9][a-z0-9-]{0,127}$")] = ""
    method: Annotated[str, StringConstraints(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}$")]
    path: str = Field(max_length=MAX_PATH)
    status: int = Field(ge=100, le=999)
    bytes: int = Field(ge=0, le=1 << 50)
    ms: float = Field(ge=0, le=1e9, description="the request's duration, milliseconds")
    wake: Literal["", "thaw", "start"] = ""
    id: str = Field(default="", max_length=200, description="its X-Request-Id")
    sample: int = Field(default=1, ge=1, le=1 << 30)
    grpc_status: int | None = Field(
        default=None, ge=0, le=MAX_CODE, description="a gRPC call's: the code it ended with"
    )
    """Only in a gRPC call's line (None is left out of what is written: `Access`)."""


def access_chunks(lines: list[dict[str, object]]) -> list[list[dict[str, object]]]:
    """`lines` in groups of at most `MAX_ACCESS_LINES` and about `ACCESS_OP_BYTES` each."""
    chunks: list[list[dict[str, object]]] = []
    chunk: list[dict[str, object]] = []
    weight = 0
    for line in lines:
        size = 200 + len(str(line.get("path", ""))) + len(str(line.get("id", "")))
        if chunk and (len(chunk) >= MAX_ACCESS_LINES or weight + size > ACCESS_OP_BYTES):
            chunks.append(chunk)
            chunk, weight = [], 0
        chunk.append(line)
        weight += size
    if chunk:
        chunks.append(chunk)
    return chunks
