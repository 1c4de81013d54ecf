"""The wire format of sandbox output that a node pushes to the control plane (`POST /v1/logs`).

Nodes push; the control plane never dials a node (one behind NAT cannot be reached). Each
chunk says which bytes of its sandbox's output stream it holds (`offset`, `size`), so the
control plane tells a chunk sent twice (a retry after a lost answer) from a gap (bytes the
node dropped while its buffer was full) without trusting anything else.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, StringConstraints, model_validator

from wakeful.domain.models import Model, Name

MAX_BATCH_BYTES = 256 * 1024
"""Raw output bytes in one batch, over all its chunks."""
MAX_BODY_BYTES = 2 * 1024 * 1024
"""A batch as JSON: escaping can grow text up to 6x (a control byte becomes `\\u00XX`)."""
MAX_CHUNKS = 1024
BEHIND_HEADER = "Wakeful-Logs-Behind"
"""The logs answer's header saying which nodes' latest lines have not arrived."""
SandboxId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,127}$")]
"""As `Sandbox.id`."""


class OutputChunk(Model):
    """Bytes `offset` to `offset + size` of one sandbox's output, decoded as UTF-8."""

    sandbox: SandboxId
    app: Name
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
