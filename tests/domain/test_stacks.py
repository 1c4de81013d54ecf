"""What a directory is and the build its stack gets (`wakeful.domain.stacks`): the order of the
rules, the start command each convention finds, and the dependency layer before the code."""

from __future__ import annotations

import json
import re

import pytest

from wakeful.domain.stacks import BuildChoice, Plan, PlanError, plan

FASTAPI = "from fastapi import FastAPI\n\napp = FastAPI()\n"
FLASK = "import flask\n\nserver = flask.Flask(__name__)\n"
PACKAGE = json.dumps({"name": "x", "scripts": {"start": "node server.js"}})


def planned(files: dict[str, str], choice: BuildChoice | None = None) -> Plan:
    return plan(frozenset(files), files.get, choice or BuildChoice())


@pytest.mark.parametrize(
    ("files", "choice", "kind", "made"),
    [
        pytest.param(
            {"requirements.txt": "uvicorn\n", "main.py": FASTAPI},
            BuildChoice(image=True),
            "image",
            "image",
            id="image in wakeful.toml wins over everything",
        ),
        pytest.param(
            {"requirements.txt": "uvicorn\n", "Containerfile": "FROM scratch\n"},
            BuildChoice(enabled=False, command=("python3", "app.py")),
            "directory",
            "directory",
            id="build disabled keeps a directory app",
        ),
        pytest.param(
            {"Containerfile.prod": "FROM x\n", "Containerfile": "FROM y\n"},
            BuildChoice(containerfile="Containerfile.prod"),
            "containerfile",
            "Containerfile.prod",
            id="a named Containerfile wins over Containerfile",
        ),
        pytest.param(
            {"Containerfile": "FROM x\n", "Dockerfile": "FROM y\n", "requirements.txt": ""},
            None,
            "containerfile",
            "Containerfile",
            id="Containerfile before Dockerfile before a stack",
        ),
        pytest.param(
            {"Dockerfile": "FROM y\n", "package.json": PACKAGE},
            None,
            "containerfile",
            "Dockerfile",
            id="a Dockerfile before a stack",
        ),
        pytest.param(
            {"requirements.txt": "uvicorn\n", "main.py": FASTAPI, "package.json": PACKAGE},
            None,
            "stack",
            "stack python (requirements.txt)",
            id="Python before Node",
        ),
        pytest.param(
            {"package.json": PACKAGE, "package-lock.json": "{}", "go.mod": "go 1.22\n"},
            None,
            "stack",
            "stack node (package.json + package-lock.json)",
            id="Node before Go",
        ),
        pytest.param(
            {"go.mod": "module x\n\ngo 1.21.4\n"},
            None,
            "stack",
            "stack go (go.mod)",
            id="Go",
        ),
        pytest.param(
            {"app.py": "print(1)\n"},
            BuildChoice(command=("python3", "app.py")),
            "directory",
            "directory",
            id="nothing to build is a directory app",
        ),
    ],
)
def test_what_a_directory_is(
    files: dict[str, str], choice: BuildChoice | None, kind: str, made: str
) -> None:
    found = planned(files, choice)
    assert (found.kind, found.made) == (kind, made)


@pytest.mark.parametrize(
    ("files", "command", "start"),
    [
        pytest.param(
            {"requirements.txt": "fastapi\nuvicorn[standard]==0.30\n", "main.py": FASTAPI},
            (),
            "uvicorn main:app --host 0.0.0.0 --port $PORT",
            id="uvicorn and a FastAPI app in main.py",
        ),
        pytest.param(
            {"requirements.txt": "fastapi[standard]>=0.115\n", "main.py": FASTAPI},
            (),
            "uvicorn main:app --host 0.0.0.0 --port $PORT",
            id="fastapi[standard] brings uvicorn",
        ),
        pytest.param(
            {"requirements.txt": "Flask\ngunicorn\n", "wsgi.py": FLASK},
            (),
            "gunicorn --bind 0.0.0.0:$PORT wsgi:server",
            id="gunicorn and a Flask app named server in wsgi.py",
        ),
        pytest.param(
            {
                "requirements.txt": "fastapi\ngunicorn\nuvicorn\n",
                "app.py": FASTAPI.replace("app = ", "api: FastAPI = "),
            },
            (),
            "uvicorn app:api --host 0.0.0.0 --port $PORT",
            id="an annotated app object",
        ),
        pytest.param(
            {"requirements.txt": "fastapi\ngunicorn\n", "main.py": FASTAPI},
            (),
            "gunicorn --bind 0.0.0.0:$PORT -k uvicorn.workers.UvicornWorker main:app",
            id="an ASGI app under gunicorn alone gets uvicorn's worker",
        ),
        pytest.param(
            {"requirements.txt": "uvicorn\n", "main.py": FASTAPI, "Procfile": "web: ./run.sh\n"},
            (),
            "./run.sh",
            id="a Procfile's web line wins over the convention",
        ),
        pytest.param(
            {"package.json": PACKAGE},
            (),
            "node server.js",
            id="a start script that is node FILE runs node itself",
        ),
        pytest.param(
            {"package.json": json.dumps({"scripts": {"start": "next start"}})},
            (),
            "npm start",
            id="any other start script runs npm start",
        ),
        pytest.param(
            {"package.json": json.dumps({"main": "srv.js"}), "srv.js": ""},
            (),
            "node srv.js",
            id="no start script: main",
        ),
        pytest.param(
            {"package.json": "{}", "index.js": ""}, (), "node index.js", id="a usual file"
        ),
        pytest.param({"go.mod": "go 1.22\n"}, (), "/app/server", id="the built Go binary"),
    ],
)
def test_the_start_command(files: dict[str, str], command: tuple[str, ...], start: str) -> None:
    found = planned(files, BuildChoice(command=command))
    assert found.start == start
    assert found.generated is not None
    assert found.generated.endswith("CMD " + json.dumps(["/bin/sh", "-c", f"exec {start}"]) + "\n")


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        pytest.param(
            {"requirements.txt": "requests\n", "main.py": FASTAPI},
            "neither uvicorn nor gunicorn",
            id="no server among the dependencies",
        ),
        pytest.param(
            {"requirements.txt": "uvicorn\n", "main.py": "print(1)\n"},
            "no FastAPI, Starlette",
            id="no app object found",
        ),
        pytest.param({"package.json": "{}"}, "no `start` script", id="a Node app with nothing"),
        pytest.param(
            {"package.json": PACKAGE, "yarn.lock": ""}, "yarn.lock", id="yarn is not built yet"
        ),
        pytest.param({"package.json": "[1"}, "package.json: not valid JSON", id="bad JSON"),
        pytest.param({"pyproject.toml": "[project"}, "pyproject.toml", id="bad TOML"),
        pytest.param(
            {"requirements.txt": "uvicorn\n", ".python-version": "latest\n"},
            ".python-version",
            id="a Python version that is not one",
        ),
    ],
)
def test_what_cannot_be_built_says_what_to_add(files: dict[str, str], reason: str) -> None:
    with pytest.raises(PlanError, match=re.escape(reason)):
        planned(files)


def test_a_missing_named_containerfile_is_refused() -> None:
    with pytest.raises(PlanError, match=re.escape("build.containerfile")):
        planned({"Containerfile": ""}, BuildChoice(containerfile="Containerfile.prod"))


def lines(found: Plan) -> list[str]:
    assert found.generated is not None
    return found.generated.splitlines()


def before(found: Plan, first: str, then: str) -> bool:
    text = lines(found)
    return text.index(first) < text.index(then)


def test_dependencies_install_in_a_layer_before_the_code() -> None:
    found = planned({"requirements.txt": "uvicorn\n", "main.py": FASTAPI})
    install = next(line for line in lines(found) if "pip install -r requirements.txt" in line)
    assert before(found, "COPY requirements.txt ./", install)
    assert before(found, install, "COPY . .")
    assert "--mount=type=secret,id=extra_ca" in install  # a proxy's CA, never in a layer


def test_requirements_that_name_local_files_install_after_the_code() -> None:
    found = planned({"requirements.txt": "-e .\nuvicorn\n", "main.py": FASTAPI})
    install = next(line for line in lines(found) if "pip install -r requirements.txt" in line)
    assert before(found, "COPY . .", install)
    assert "COPY requirements.txt ./" not in lines(found)


def test_pyproject_dependencies_are_quoted_into_their_own_layer() -> None:
    project = (
        '[project]\nname = "x"\ndependencies = ["uvicorn>=0.30", "fastapi; python_version>\'3\'"]\n'
    )
    found = planned({"pyproject.toml": project, "main.py": FASTAPI})
    install = next(line for line in lines(found) if "pip install " in line)
    assert "'uvicorn>=0.30' 'fastapi; python_version>'\"'\"'3'\"'\"''" in install
    assert before(found, install, "COPY . .")


@pytest.mark.parametrize(
    ("lock", "tool"), [("uv.lock", "uv export --frozen"), ("poetry.lock", "poetry export")]
)
def test_a_lock_file_is_exported_in_a_stage_of_its_own(lock: str, tool: str) -> None:
    found = planned(
        {
            "pyproject.toml": '[project]\nname = "x"\n',
            lock: '[[package]]\nname = "uvicorn"\n',
            "main.py": FASTAPI,
        }
    )
    text = lines(found)
    assert text[1].endswith("AS lock") and any(tool in line for line in text)
    assert "COPY --from=lock /requirements.lock /tmp/requirements.lock" in text
    assert found.start == "uvicorn main:app --host 0.0.0.0 --port $PORT"  # uvicorn from the lock


def test_versions_and_bases() -> None:
    python = planned(
        {"requirements.txt": "uvicorn\n", "main.py": FASTAPI, ".python-version": "3.12.1\n"}
    )
    assert "FROM docker.io/library/python:3.12-slim" in lines(python)
    node = planned({"package.json": PACKAGE, ".nvmrc": "v22\n"})
    assert "FROM docker.io/library/node:22-slim" in lines(node)
    go = planned({"go.mod": "module x\n\ngo 1.23.2\n"})
    assert "FROM docker.io/library/golang:1.23 AS build" in lines(go)
    based = planned(
        {"requirements.txt": "uvicorn\n", "main.py": FASTAPI},
        BuildChoice(base="registry.example.com/py:3.11"),
    )
    assert "FROM registry.example.com/py:3.11" in lines(based)


def test_a_dependency_with_a_line_break_cannot_add_lines_to_the_containerfile() -> None:
    project = '[project]\ndependencies = ["x\\nRUN echo injected #"]\n'
    with pytest.raises(PlanError, match=re.escape("project.dependencies[0]")):
        planned({"pyproject.toml": project, "main.py": FASTAPI})


def test_an_app_object_is_looked_for_within_one_line() -> None:
    # Across lines, `a:` then `= FastAPI(` is no assignment (and a search that crossed lines
    # took quadratic time on a file of `a:` lines).
    with pytest.raises(PlanError, match="no FastAPI, Starlette"):
        planned({"requirements.txt": "uvicorn\n", "main.py": "a:\n= FastAPI()\n" * 3})


@pytest.mark.parametrize(
    "line",
    [
        "--find-links ./wheels",
        "-f wheels",
        "vendor/pkg.tar.gz",
        "pkg @ file:///app/vendor/pkg.whl",
        "../shared",
    ],
)
def test_requirements_naming_files_install_after_the_code(line: str) -> None:
    found = planned({"requirements.txt": f"{line}\nuvicorn\n", "main.py": FASTAPI})
    assert "COPY requirements.txt ./" not in lines(found)


def test_a_start_script_split_by_a_line_break_runs_the_script() -> None:
    package = json.dumps({"scripts": {"start": "node\nserver.js"}})
    assert planned({"package.json": package}).start == "node server.js"


def test_a_version_in_other_digits_is_refused() -> None:
    with pytest.raises(PlanError, match=re.escape(".python-version")):
        planned({"requirements.txt": "uvicorn\n", "main.py": FASTAPI, ".python-version": "٣.١٢"})


def test_wakeful_toml_s_command_is_the_image_s_cmd_as_it_is_run() -> None:
    command = ("python3", "-m", "mine", "--port", "$PORT")
    found = planned(
        {"requirements.txt": "uvicorn\n", "Procfile": "web: ./run.sh\n"},
        BuildChoice(command=command),
    )
    assert found.start is None  # no convention or Procfile: the command says
    assert lines(found)[-1] == "CMD " + json.dumps(list(command))
