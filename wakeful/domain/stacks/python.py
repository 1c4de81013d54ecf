"""The Python stack: `requirements.txt`, or `pyproject.toml` with `uv.lock` or `poetry.lock`
when present. Dependencies go into `/venv` in a layer of their own, keyed on the file that
lists them (a lock file is exported to a requirements list in a stage of its own, so neither
uv nor poetry lands in the image); the start command is uvicorn or gunicorn on the app object
found in a usual file."""

from __future__ import annotations

import re
import shlex
import tomllib
from typing import Any

from .common import (
    CA,
    CONTROL,
    LEFT_OUT,
    PORT,
    BuildChoice,
    Plan,
    PlanError,
    Read,
    base_of,
    cmd,
    start_line,
    version_file,
)

PYTHON_BASE = "docker.io/library/python:{version}-slim"
MAX_DEPENDENCIES = 500
APP_FILES = ("main.py", "app.py", "server.py", "asgi.py", "wsgi.py", "api.py")
"""Where a Python app's object is looked for, in this order."""
_APP_OBJECT = re.compile(  # within one line: linear on any file (no backtracking across lines)
    r"^(?P<var>[A-Za-z_][A-Za-z0-9_]*)[ \t]*(?::[^=\n]*)?=[ \t]*(?:[A-Za-z0-9_.]+\.)?"
    r"(?P<kind>FastAPI|Starlette|Quart|Litestar|Flask)[ \t]*\(",
    re.MULTILINE,
)
_ASGI = ("FastAPI", "Starlette", "Quart", "Litestar")
_REQUIREMENT = re.compile(r"^[ \t]*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?")
_SERVING_EXTRAS = {"fastapi": {"standard", "all"}}
"""Extras that bring uvicorn along: `fastapi[standard]` is FastAPI's own documented install."""
_LOCKED_NAME = re.compile(r'^name[ \t]*=[ \t]*"([^"]+)"', re.MULTILINE)
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


def python(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan | None:
    if "requirements.txt" in names:
        source, install = "requirements.txt", _requirements_install(read("requirements.txt"))
        listed = _requirement_names(read("requirements.txt") or "")
    elif "pyproject.toml" in names:
        source, install, listed = _pyproject_install(names, read)
    else:
        return None
    version = version_file(read, (".python-version",), "3.11")
    start = start_line(
        read, choice, _python_convention(read, listed), "Python", _python_hint(listed)
    )
    text = (
        f"# Made by wakeful for a Python app ({source}); `wakeful deploy --dry-run` prints it.\n"
        + install[0].format(base=base_of(choice, PYTHON_BASE, version))
        + "ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 "
        "PIP_DISABLE_PIP_VERSION_CHECK=1\n"
        "RUN python3 -m venv /venv\n"
        "ENV PATH=/venv/bin:$PATH VIRTUAL_ENV=/venv\n"
        "WORKDIR /app\n" + install[1] + f"ENV PORT={PORT}\nEXPOSE {PORT}\n" + cmd(start, choice)
    )
    return Plan(
        "stack",
        f"stack python ({source})",
        generated=text,
        start=start,
        ignore=(*LEFT_OUT, ".venv", "venv", "**/__pycache__", "**/*.pyc", ".mypy_cache"),
    )


def _pip(target: str) -> str:
    return "RUN " + CA.format(variable="PIP_CERT") + f"pip install -r {target}\n"


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
            + CA.format(variable="PIP_CERT")
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
            + CA.format(variable="PIP_CERT")
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
            + CA.format(variable="PIP_CERT")
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
        if CONTROL.search(dependency):  # a line break would add lines to the Containerfile
            raise PlanError(
                f"pyproject.toml: project.dependencies[{index}] holds a control character "
                f"or a line break: {dependency!r}"
            )
    return [d.strip() for d in found if d.strip()]


def _requirement_names(text: str) -> set[str]:
    """The packages a requirements list names (normalised), and uvicorn when an extra of one
    brings it (`fastapi[standard]`)."""
    names = set()
    for line in text.splitlines():
        found = _REQUIREMENT.match(line)
        if found and not line.lstrip().startswith("-"):
            name = found.group(1).lower().replace("_", "-")
            names.add(name)
            extras = {e.strip().lower() for e in (found.group(2) or "").split(",")}
            if extras & _SERVING_EXTRAS.get(name, set()):
                names.add("uvicorn")
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
