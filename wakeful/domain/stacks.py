"""What an app directory is, and the build a detected stack gets: pure functions of the
directory's top-level names and the text of a few of its files.

The order (`plan`): `image` in wakeful.toml runs that image, with no build; `[build] enabled =
false` keeps a plain directory app; a Containerfile (`[build] containerfile`, else
`Containerfile`, else `Dockerfile`) is built as written; a stack file is a stack build (Python:
`requirements.txt` or `pyproject.toml`; then Node: `package.json`; then Go: `go.mod`);
anything else is a directory app, whose `command` is required as before.

A stack build is a generated Containerfile: the stack's base image, the dependencies installed
in a layer of their own keyed on the file that lists them (so a change to the code alone reuses
it), then the code, and the start command as its `CMD`. The start command is wakeful.toml's
`command` when given (it overrides the image's `CMD` at every start anyway), else a Procfile's
`web:` line, else the stack's convention; none found is refused with what was looked for.
A CA the build needs to reach a package index (a proxy's) comes as the build secret
`extra_ca`, mounted for the install step alone: it never lands in a layer.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["image", "directory", "containerfile", "stack"]
Read = Callable[[str], str | None]
"""The text of a file at the top of the directory, or None when there is none."""

CONTAINERFILES = ("Containerfile", "Dockerfile")
PYTHON_BASE = "docker.io/library/python:{version}-slim"
NODE_BASE = "docker.io/library/node:{version}-slim"
GO_BASE = "docker.io/library/golang:{version}"
GO_RUNTIME = "docker.io/library/debian:bookworm-slim"
LEFT_OUT = ("**/.git", "**/.wakeful")
"""What every stack build leaves out of its context when the directory has no ignore file
(patterns as `.dockerignore` reads them): version control, and a `wakeful up` data directory."""
PORT = 8080
"""The port a stack image listens on when nothing passes PORT (`podman run` by hand); under
wakeful, PORT is always set."""
MAX_DEPENDENCIES = 500
APP_FILES = ("main.py", "app.py", "server.py", "asgi.py", "wsgi.py", "api.py")
"""Where a Python app's object is looked for, in this order."""
_APP_OBJECT = re.compile(  # within one line: linear on any file (no backtracking across lines)
    r"^(?P<var>[A-Za-z_][A-Za-z0-9_]*)[ \t]*(?::[^=\n]*)?=[ \t]*(?:[A-Za-z0-9_.]+\.)?"
    r"(?P<kind>FastAPI|Starlette|Quart|Litestar|Flask)[ \t]*\(",
    re.MULTILINE,
)
_ASGI = ("FastAPI", "Starlette", "Quart", "Litestar")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_LOCKED_NAME = re.compile(r'^name\s*=\s*"([^"]+)"', re.MULTILINE)
_VERSION = re.compile(r"^[ \t]*v?([0-9]+(?:\.[0-9]+)?)(?:\.[0-9]+)?[ \t]*$")
_GO_VERSION = re.compile(r"^go[ \t]+([0-9]+\.[0-9]+)", re.MULTILINE)
_LOCAL_REQUIREMENT = (
    "-r",
    "-c",
    "-e",
    "-f",
    "--requirement",
    "--constraint",
    "--editable",
    "--find-links",
    ".",
    "/",
)
"""Lines of a requirements file that name other files: installed after the code is copied."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CA = (
    "--mount=type=secret,id=extra_ca "
    "if [ -s /run/secrets/extra_ca ]; then export {variable}=/run/secrets/extra_ca; fi; "
)


class PlanError(ValueError):
    """The directory cannot be built as it is: the message says what to add or change."""


@dataclass(frozen=True)
class Plan:
    """How a directory becomes what runs."""

    kind: Kind
    made: str
    """How the version is made, as `wakeful versions` shows it."""
    containerfile: str | None = None
    """The directory's own Containerfile (kind containerfile), a name at its top."""
    generated: str | None = None
    """The Containerfile a stack build generates (kind stack)."""
    start: str | None = None
    """The start command the generated image runs (a shell line), when one was found."""
    ignore: tuple[str, ...] = ()
    """What a stack build leaves out of its context when the directory has no ignore file."""


@dataclass(frozen=True)
class BuildChoice:
    """`[build]` in wakeful.toml, and what else of the manifest decides the plan."""

    enabled: bool = True
    base: str | None = None
    containerfile: str | None = None
    image: bool = False
    command: tuple[str, ...] = ()


def plan(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan:
    """What the directory with the top-level `names` is (see the module's order)."""
    if choice.image:
        return Plan("image", "image")
    if not choice.enabled:
        return Plan("directory", "directory")
    if choice.containerfile is not None:
        if choice.containerfile not in names:
            raise PlanError(
                f"build.containerfile: {choice.containerfile!r} is not a file at the top of "
                "the app directory"
            )
        return Plan("containerfile", choice.containerfile, containerfile=choice.containerfile)
    for name in CONTAINERFILES:
        if name in names:
            return Plan("containerfile", name, containerfile=name)
    for stack in (_python, _node, _go):
        found = stack(names, read, choice)
        if found is not None:
            return found
    return Plan("directory", "directory")


def procfile_web(read: Read) -> str | None:
    """A Procfile's `web:` command, or None."""
    text = read("Procfile")
    if text is None:
        return None
    for line in text.splitlines():
        kind, sep, command = line.partition(":")
        if sep and kind.strip() == "web" and command.strip():
            return command.strip()
    return None


def _start(
    read: Read, choice: BuildChoice, convention: str | None, stack: str, hint: str
) -> str | None:
    """The shell line the image starts with; None when wakeful.toml's `command` says."""
    if choice.command:
        return None
    found = procfile_web(read) or convention
    if found is None:
        raise PlanError(
            f"no start command for this {stack} app: {hint}; set `command` in wakeful.toml "
            "or add a Procfile with a `web:` line"
        )
    return found


def _cmd(start: str | None, choice: BuildChoice) -> str:
    """The image's `CMD`: wakeful.toml's `command` in the exec form (what wakeful runs, its
    `$PORT` and `$HOST` replaced), else the start line under `sh -c` (a Procfile line is a
    shell line; `exec` leaves the app the process that gets the signals)."""
    if start is None:
        return "CMD " + json.dumps(list(choice.command)) + "\n"
    return "CMD " + json.dumps(["/bin/sh", "-c", f"exec {start}"]) + "\n"


def _base(choice: BuildChoice, pattern: str, version: str) -> str:
    return choice.base or pattern.format(version=version)


def _version_file(read: Read, names: tuple[str, ...], default: str) -> str:
    for name in names:
        text = read(name)
        if text is not None:
            found = _VERSION.match(text.strip().splitlines()[0] if text.strip() else "")
            if found is None:
                raise PlanError(f"{name}: {text.strip()[:40]!r} is not a version like 3.12")
            return found.group(1)
    return default


# Python


def _python(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan | None:
    if "requirements.txt" in names:
        source, install = "requirements.txt", _requirements_install(read("requirements.txt"))
        listed = _requirement_names(read("requirements.txt") or "")
    elif "pyproject.toml" in names:
        source, install, listed = _pyproject_install(names, read)
    else:
        return None
    version = _version_file(read, (".python-version",), "3.11")
    start = _start(read, choice, _python_convention(read, listed), "Python", _python_hint(listed))
    text = (
        f"# Made by wakeful for a Python app ({source}); `wakeful deploy --dry-run` prints it.\n"
        + install[0].format(base=_base(choice, PYTHON_BASE, version))
        + "ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 "
        "PIP_DISABLE_PIP_VERSION_CHECK=1\n"
        "RUN python3 -m venv /venv\n"
        "ENV PATH=/venv/bin:$PATH VIRTUAL_ENV=/venv\n"
        "WORKDIR /app\n" + install[1] + f"ENV PORT={PORT}\nEXPOSE {PORT}\n" + _cmd(start, choice)
    )
    return Plan(
        "stack",
        f"stack python ({source})",
        generated=text,
        start=start,
        ignore=(*LEFT_OUT, ".venv", "venv", "**/__pycache__", "**/*.pyc", ".mypy_cache"),
    )


def _pip(target: str) -> str:
    return "RUN " + _CA.format(variable="PIP_CERT") + f"pip install -r {target}\n"


def _requirements_install(text: str | None) -> tuple[str, str]:
    """(the FROM part, the install steps) for requirements.txt; one that names other files
    (`-r`, `-e .`, a path) is installed after the code is copied, not in a layer before it."""
    lines = [line.strip() for line in (text or "").splitlines()]
    if any(_names_a_file(line) for line in lines):
        return "FROM {base}\n", "COPY . .\n" + _pip("requirements.txt")
    layer = (
        "# The dependencies in a layer of their own, keyed on requirements.txt: a change to\n"
        "# the code alone reuses it.\n"
    )
    return "FROM {base}\n", layer + "COPY requirements.txt ./\n" + _pip("requirements.txt") + (
        "COPY . .\n"
    )


def _pyproject_install(names: frozenset[str], read: Read) -> tuple[str, tuple[str, str], set[str]]:
    text = read("pyproject.toml") or ""
    try:
        project = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"pyproject.toml: not valid TOML: {exc}") from None
    exported = "COPY --from=lock /requirements.lock /tmp/requirements.lock\n" + _pip(
        "/tmp/requirements.lock"
    )
    if "uv.lock" in names:
        lock = (
            "FROM {base} AS lock\n"
            "RUN "
            + _CA.format(variable="PIP_CERT")
            + "python3 -m venv /uv && /uv/bin/pip install --quiet uv\n"
            "COPY pyproject.toml uv.lock ./\n"
            "RUN /uv/bin/uv export --frozen --no-dev --no-emit-project -o /requirements.lock\n"
        )
        listed = set(_LOCKED_NAME.findall(read("uv.lock") or ""))
        return "pyproject.toml + uv.lock", (lock + "FROM {base}\n", exported + "COPY . .\n"), listed
    if "poetry.lock" in names:
        lock = (
            "FROM {base} AS lock\n"
            "RUN "
            + _CA.format(variable="PIP_CERT")
            + "python3 -m venv /poetry && /poetry/bin/pip install --quiet poetry "
            "poetry-plugin-export\n"
            "COPY pyproject.toml poetry.lock ./\n"
            "RUN /poetry/bin/poetry export --only main -f requirements.txt -o /requirements.lock\n"
        )
        listed = set(_LOCKED_NAME.findall(read("poetry.lock") or ""))
        steps = (lock + "FROM {base}\n", exported + "COPY . .\n")
        return "pyproject.toml + poetry.lock", steps, listed
    dependencies = _project_dependencies(project)
    install = "COPY . .\n"
    if dependencies:
        install = (
            "# The dependencies pyproject.toml lists, in a layer of their own.\n"
            "RUN "
            + _CA.format(variable="PIP_CERT")
            + "pip install "
            + " ".join(shlex.quote(d) for d in dependencies)
            + "\nCOPY . .\n"
        )
    return "pyproject.toml", ("FROM {base}\n", install), _requirement_names("\n".join(dependencies))


def _names_a_file(line: str) -> bool:
    """Whether a requirements line names a file of the directory (`-r other.txt`, `-e .`,
    `--find-links wheels`, `vendor/pkg.tar.gz`, `pkg @ file:///app/...`)."""
    requirement = line.split(" #", 1)[0].split(";", 1)[0].strip()
    if requirement.startswith(_LOCAL_REQUIREMENT) or "file:" in requirement:
        return True
    return "/" in requirement and "://" not in requirement


def _project_dependencies(project: dict[str, Any]) -> list[str]:
    table = project.get("project")
    found = table.get("dependencies", []) if isinstance(table, dict) else []
    if not isinstance(found, list) or not all(isinstance(d, str) for d in found):
        raise PlanError("pyproject.toml: project.dependencies must be a list of strings")
    if len(found) > MAX_DEPENDENCIES:
        raise PlanError(f"pyproject.toml: more than {MAX_DEPENDENCIES} dependencies")
    for index, dependency in enumerate(found):
        if _CONTROL.search(dependency):  # a line break would add lines to the Containerfile
            raise PlanError(
                f"pyproject.toml: project.dependencies[{index}] holds a control character "
                f"or a line break: {dependency!r}"
            )
    return [d.strip() for d in found if d.strip()]


def _requirement_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        found = _REQUIREMENT.match(line)
        if found and not line.lstrip().startswith("-"):
            names.add(found.group(1).lower().replace("_", "-").split("[")[0])
    return names


def _python_app(read: Read) -> tuple[str, str, str] | None:
    """(module, variable, framework) of the first app object found in `APP_FILES`."""
    for name in APP_FILES:
        found = _APP_OBJECT.search(read(name) or "")
        if found is not None:
            return name.removesuffix(".py"), found.group("var"), found.group("kind")
    return None


def _python_convention(read: Read, listed: set[str]) -> str | None:
    found = _python_app(read)
    if found is None:
        return None
    module, variable, kind = found
    target = f"{module}:{variable}"
    if kind in _ASGI and "uvicorn" in listed:
        return f"uvicorn {target} --host 0.0.0.0 --port $PORT"
    if "gunicorn" in listed:
        worker = " -k uvicorn.workers.UvicornWorker" if kind in _ASGI else ""
        return f"gunicorn --bind 0.0.0.0:$PORT{worker} {target}"
    return None


def _python_hint(listed: set[str]) -> str:
    servers = [s for s in ("uvicorn", "gunicorn") if s in listed]
    files = ", ".join(APP_FILES)
    if not servers:
        return "neither uvicorn nor gunicorn is among its dependencies"
    return f"no FastAPI, Starlette, Quart, Litestar or Flask app object found in {files}"


# Node


def _node(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan | None:
    if "package.json" not in names:
        return None
    try:
        package = json.loads(read("package.json") or "")
    except ValueError as exc:
        raise PlanError(f"package.json: not valid JSON: {exc}") from None
    if not isinstance(package, dict):
        raise PlanError("package.json: must hold an object")
    for other in ("yarn.lock", "pnpm-lock.yaml", "bun.lockb", "bun.lock"):
        if other in names:
            raise PlanError(
                f"{other}: only npm's lock file (package-lock.json) is built for now; "
                "add a Containerfile to build with another package manager"
            )
    if "package-lock.json" in names:
        source, copy, install = (
            "package.json + package-lock.json",
            "package.json package-lock.json",
            "npm ci --omit=dev",
        )
    elif "npm-shrinkwrap.json" in names:
        source, copy, install = (
            "package.json + npm-shrinkwrap.json",
            "package.json npm-shrinkwrap.json",
            "npm ci --omit=dev",
        )
    else:
        source, copy, install = "package.json", "package.json", "npm install --omit=dev"
    version = _version_file(read, (".nvmrc", ".node-version"), "20")
    start = _start(read, choice, _node_convention(package, names), "Node", "no `start` script")
    text = (
        f"# Made by wakeful for a Node app ({source}); `wakeful deploy --dry-run` prints it.\n"
        f"FROM {_base(choice, NODE_BASE, version)}\n"
        "ENV NODE_ENV=production npm_config_update_notifier=false npm_config_fund=false\n"
        "WORKDIR /app\n"
        f"# The dependencies in a layer of their own, keyed on {copy.replace(' ', ' and ')}.\n"
        f"COPY {copy} ./\n"
        "RUN " + _CA.format(variable="NODE_EXTRA_CA_CERTS") + f"{install} && rm -rf /root/.npm\n"
        "COPY . .\n"
        f"ENV PORT={PORT}\nEXPOSE {PORT}\n" + _cmd(start, choice)
    )
    return Plan(
        "stack",
        f"stack node ({source})",
        generated=text,
        start=start,
        ignore=(*LEFT_OUT, "node_modules", "npm-debug.log"),
    )


def _node_convention(package: dict[str, Any], names: frozenset[str]) -> str | None:
    """`node FILE` when the start script is exactly that (no npm between the app and its
    signals), `npm start` for any other start script, else `node` of `main` or a usual file."""
    scripts = package.get("scripts")
    start = scripts.get("start") if isinstance(scripts, dict) else None
    if isinstance(start, str) and start.strip():
        words = start.split()
        if len(words) == 2 and words[0] == "node" and re.fullmatch(r"[A-Za-z0-9_./-]+", words[1]):
            return f"node {words[1]}"
        return "npm start"
    main = package.get("main")
    if isinstance(main, str) and main in names:
        return f"node {shlex.quote(main)}"
    for name in ("server.js", "index.js", "app.js"):
        if name in names:
            return f"node {name}"
    return None


# Go


def _go(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan | None:
    if "go.mod" not in names:
        return None
    found = _GO_VERSION.search(read("go.mod") or "")
    version = found.group(1) if found else "1.22"
    start = _start(read, choice, "/app/server", "Go", "")
    sums = " go.sum" if "go.sum" in names else ""
    text = (
        "# Made by wakeful for a Go app (go.mod); `wakeful deploy --dry-run` prints it.\n"
        f"FROM {_base(choice, GO_BASE, version)} AS build\n"
        "WORKDIR /src\n"
        "# The modules in a layer of their own, keyed on go.mod and go.sum.\n"
        f"COPY go.mod{sums} ./\n"
        "RUN " + _CA.format(variable="SSL_CERT_FILE") + "go mod download\n"
        "COPY . .\n"
        "RUN CGO_ENABLED=0 go build -trimpath -ldflags=-s -o /out/server .\n"
        f"FROM {GO_RUNTIME}\n"
        "COPY --from=build /out/server /app/server\n"
        "WORKDIR /app\n"
        f"ENV PORT={PORT}\nEXPOSE {PORT}\n" + _cmd(start, choice)
    )
    return Plan("stack", "stack go (go.mod)", generated=text, start=start, ignore=LEFT_OUT)
