"""The Go stack: `go.mod` (and `go.sum`), modules downloaded in a layer of their own, the
binary built in a stage of its own and copied onto Debian's slim image with the build stage's
CA certificates (`[build] base` replaces the build stage's image)."""

from __future__ import annotations

import re

from .common import (
    CA,
    LEFT_OUT,
    PORT,
    BuildChoice,
    Plan,
    Read,
    base_of,
    cmd,
    start_line,
)

GO_BASE = "docker.io/library/golang:{version}"
GO_RUNTIME = "docker.io/library/debian:bookworm-slim"
_GO_VERSION = re.compile(r"^go[ \t]+([0-9]+\.[0-9]+)", re.MULTILINE)


def go(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan | None:
    if "go.mod" not in names:
        return None
    found = _GO_VERSION.search(read("go.mod") or "")
    version = found.group(1) if found else "1.22"
    start = start_line(read, choice, "/app/server", "Go", "")
    sums = " go.sum" if "go.sum" in names else ""
    text = (
        "# Made by wakeful for a Go app (go.mod); `wakeful deploy --dry-run` prints it.\n"
        f"FROM {base_of(choice, GO_BASE, version)} AS build\n"
        "WORKDIR /src\n"
        "# The modules in a layer of their own, keyed on go.mod and go.sum.\n"
        f"COPY go.mod{sums} ./\n"
        "RUN " + CA.format(variable="SSL_CERT_FILE") + "go mod download\n"
        "COPY . .\n"
        "RUN CGO_ENABLED=0 go build -trimpath -ldflags=-s -o /out/server .\n"
        f"FROM {GO_RUNTIME}\n"
        "COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/\n"
        "COPY --from=build /out/server /app/server\n"
        "WORKDIR /app\n"
        f"ENV PORT={PORT}\nEXPOSE {PORT}\n" + cmd(start, choice)
    )
    return Plan("stack", "stack go (go.mod)", generated=text, start=start, ignore=LEFT_OUT)
