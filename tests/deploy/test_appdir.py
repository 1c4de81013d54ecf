from __future__ import annotations

import re
from pathlib import Path

import pytest

from wakeful.deploy.appdir import AppDirError, load_app_dir, parse_duration

EXAMPLE = Path(__file__).parents[2] / "examples" / "hello"


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "wakeful.toml").write_text(text)
    return tmp_path


def test_the_sample_app_loads() -> None:
    app = load_app_dir(EXAMPLE)
    assert app.definition.name == "hello"
    assert app.definition.spec.concurrency.scale_down_delay == 60
    assert app.definition.spec.health.path == "/healthz"


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("90s", 90.0), ("5m", 300.0), ("250ms", 0.25), (12, 12), ("1.5h", 5400.0)],
    ids=["seconds", "minutes", "millis", "number", "hours"],
)
def test_durations(raw: object, seconds: float) -> None:
    assert parse_duration(raw) == seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('name = "Bad Name"\ncommand = ["x"]', "name", id="bad-name"),
        pytest.param('name = "ok"', "command: required (or image", id="missing-command"),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[concurrency]\nrequests_per_instance = 0',
            "concurrency.requests_per_instance",
            id="zero-target",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[concurrency]\nscale_down_delay = "soon"',
            "'soon'",
            id="bad-duration",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[concurrency]\nsuspend_delay = "0.5s"',
            "suspend_delay (0.5) must be 0 (no suspended tier) or at least 1 second",
            id="suspend-delay-below-a-second",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[concurrency]\nsuspend_delay = true',
            "concurrency.suspend_delay: must be a number of seconds or a duration such as 90s, "
            "5m, 1.5h or 250ms (got True)",
            id="suspend-delay-a-flag",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[concurrency]\nsuspend_delay = "-1"',
            "'-1'",
            id="suspend-delay-negative",
        ),
        pytest.param('name = "ok"\ncommand = ["x"]\nbogus = 1', "bogus", id="unknown-field"),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[concurrency]\nscale_down_delay = "5 minutes"',
            "concurrency.scale_down_delay: must be a number of seconds or a duration such as "
            "90s, 5m, 1.5h or 250ms (got '5 minutes')",
            id="a duration in words: what it takes",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\nshutdown_timeout = "soon"\n[health]\ntimeout = "10 s"',
            "health.timeout: must be a number of seconds or a duration such as 90s, 5m, 1.5h or "
            "250ms (got '10 s'); shutdown_timeout: must be a number",
            id="timeouts as durations too",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[resources]\nmemory = "1Ki"',
            "resources.memory: must be between 16Mi and 64Gi (got 1Ki)\n",
            id="a size out of bounds: its value once",
        ),
        pytest.param(
            'name = "ok"\ncommand = []', "command: empty: the program", id="empty command"
        ),
        pytest.param('command = ["x"]', "wakeful.toml: name: required\n", id="no name"),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[concurrency]\nscale_down_delay = "\u0661\u0660m"',
            "concurrency.scale_down_delay",
            id="a duration in other digits",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[rollout]\nmax_error_ratio = "0.05"',
            "rollout.max_error_ratio",
            id="rollout: a string for a number",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[rollout]\nmin_requests = true',
            "rollout.min_requests",
            id="rollout: a flag for a number",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[rollout]\nmax_p99_ratio = 0.5',
            "rollout.max_p99_ratio",
            id="rollout: below 1",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\nenv = { PORT = "1" }', "PORT", id="reserved-env"
        ),
        pytest.param('name = = "ok"', "not valid TOML", id="not-toml"),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\ndefault_host = "no"', "default_host", id="bad-flag"
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[state]\npath = "data"',
            "state: an app with [state] runs one sandbox at a time, so it needs "
            "concurrency.max_instances = 1 (got 20)",
            id="stateful-without-one-instance",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[state]\npath = "../up"\n[concurrency]\n'
            "max_instances = 1",
            "state.path: '../up' must name a directory inside the app's tree",
            id="state-outside-the-tree",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[state]\npath = "/abs"\n[concurrency]\n'
            "max_instances = 1",
            "state.path: String should match pattern",
            id="state-absolute",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\nhosts = ["ok.example.com", "127.0.0.1"]',
            "hosts: 127.0.0.1 is reserved: a browser reads it as an IP address",
            id="an-ip-address-host",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\nhosts = ["0x7f.1"]',
            "hosts: 0x7f.1 is reserved: a browser reads it as an IP address",
            id="an-ip-address-host-in-hex",
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\nhosts = ["localhost"]',
            "hosts: localhost is reserved: it reaches the control plane's dashboard",
            id="localhost",
        ),
    ],
)
def test_a_bad_manifest_names_the_file_field_and_reason(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(AppDirError) as refused:
        load_app_dir(write(tmp_path, text))
    message = str(refused.value)
    assert message.startswith(str(tmp_path / "wakeful.toml"))
    assert expected in f"{message}\n"  # `expected` ending in a newline: the message ends there


def test_a_link_to_an_app_directory_is_that_directory(tmp_path: Path) -> None:
    """Packing never follows links inside the app, so the app's own path is resolved first:
    `wakeful deploy ./link-to-app` must not deploy an empty artifact."""
    link = tmp_path / "link"
    link.symlink_to(EXAMPLE)
    assert load_app_dir(link).path == EXAMPLE.resolve()


def test_the_stateful_sample_app_loads() -> None:
    notes = load_app_dir(EXAMPLE.parent / "notes").definition.spec
    assert notes.state is not None and notes.state.path == "data"
    assert notes.concurrency.max_instances == 1


def test_an_app_may_opt_out_of_its_default_host(tmp_path: Path) -> None:
    app = load_app_dir(write(tmp_path, 'name = "ok"\ncommand = ["x"]\ndefault_host = false'))
    assert app.definition.default_host is False
    assert load_app_dir(EXAMPLE).definition.default_host is True


def test_a_directory_without_a_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AppDirError, match="missing"):
        load_app_dir(tmp_path)


def test_hosts_only_the_control_plane_knows_are_reserved_are_left_to_it(tmp_path: Path) -> None:
    """`*.localhost` covers the default hosts only if the base domain is localhost, which is
    the control plane's setting: it refuses the deploy (`test_deploy_api.py`)."""
    text = 'name = "ok"\ncommand = ["x"]\nhosts = ["*.localhost", "a.localhost"]'
    assert load_app_dir(write(tmp_path, text)).definition.hosts == ["*.localhost", "a.localhost"]


def test_an_image_app_needs_no_command(tmp_path: Path) -> None:
    app = load_app_dir(write(tmp_path, 'name = "shop"\nimage = "registry.example/shop:1.4"'))
    assert app.definition.spec.image == "registry.example/shop:1.4"
    assert app.definition.spec.command == [] and app.archive is None


def test_an_image_archive_is_a_file_of_the_directory(tmp_path: Path) -> None:
    (tmp_path / "shop.tar").write_bytes(b"not checked here")
    app = load_app_dir(write(tmp_path, 'name = "shop"\nimage = "oci-archive:shop.tar"'))
    assert app.archive == tmp_path.resolve() / "shop.tar"


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("oci-archive:missing.tar", "is not a file"),
        ("docker-archive:../outside.tar", "must name a file inside the app directory"),
        ("oci-archive:/etc/passwd", "must name a file inside the app directory"),
        ("oci-archive:", "must name a file inside the app directory"),
    ],
    ids=["missing", "parent", "absolute", "empty"],
)
def test_an_archive_outside_the_directory_or_missing_is_refused(
    tmp_path: Path, image: str, expected: str
) -> None:
    with pytest.raises(AppDirError, match=f"image: .*{expected}"):
        load_app_dir(write(tmp_path, f'name = "shop"\nimage = "{image}"'))


def test_a_directory_with_requirements_is_built_and_needs_no_command(tmp_path: Path) -> None:
    app = write(tmp_path, 'name = "shop"')
    (app / "requirements.txt").write_text("fastapi\nuvicorn\n")
    (app / "main.py").write_text("from fastapi import FastAPI\napp = FastAPI()\n")
    loaded = load_app_dir(app)
    assert (loaded.plan.kind, loaded.plan.made) == ("stack", "stack python (requirements.txt)")
    assert loaded.definition.spec.image == "built:shop"


def test_build_disabled_keeps_the_directory_app_it_was(tmp_path: Path) -> None:
    app = write(
        tmp_path, 'name = "shop"\ncommand = ["python3", "app.py"]\n[build]\nenabled = false'
    )
    (app / "requirements.txt").write_text("fastapi\n")
    loaded = load_app_dir(app)
    assert loaded.plan.kind == "directory"
    assert loaded.definition.spec.image is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[build]\nenabled = "no"', "build.enabled", id="a bool"
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[build]\nbogus = 1', "build.bogus", id="unknown field"
        ),
        pytest.param(
            'name = "ok"\ncommand = ["x"]\n[build]\ncontainerfile = "../Containerfile"',
            "build.containerfile",
            id="a containerfile outside the top",
        ),
        pytest.param(
            'name = "ok"\nimage = "built:ok"', "`built:` names an image wakeful built", id="built:"
        ),
        pytest.param(
            'name = "ok"\n[build]\ncontainerfile = "Containerfile.\u00e9"',
            "build.containerfile",
            id="a containerfile name the version record could not hold",
        ),
        pytest.param(
            'name = "ok"\n[build]\npush = "127.0.0.1:5000/team/ok:1"',
            "names a tag: give the repository alone",
            id="a push target with a tag",
        ),
        pytest.param(
            'name = "ok"\n[build]\ncontainerfile = "Containerfile.prod"',
            "'Containerfile.prod' is not a file",
            id="a named containerfile that is not there",
        ),
    ],
)
def test_a_bad_build_section_names_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(AppDirError, match=re.escape(expected)):
        load_app_dir(write(tmp_path, text))


def test_a_containerfile_that_is_a_link_is_refused(tmp_path: Path) -> None:
    app = write(tmp_path, 'name = "ok"\ncommand = ["x"]')
    (app / "docker").mkdir()
    (app / "docker" / "Containerfile").write_text("FROM scratch\n")
    (app / "Containerfile").symlink_to("docker/Containerfile")
    with pytest.raises(AppDirError, match="a link; a Containerfile must be a file"):
        load_app_dir(app)


def test_a_directory_that_is_built_needs_no_manifest_and_is_named_after_itself(
    tmp_path: Path,
) -> None:
    app = tmp_path / "shop"
    app.mkdir()
    (app / "requirements.txt").write_text("fastapi[standard]\n")
    (app / "main.py").write_text("from fastapi import FastAPI\napp = FastAPI()\n")
    loaded = load_app_dir(app)
    assert (loaded.definition.name, loaded.definition.spec.image) == ("shop", "built:shop")
    assert loaded.plan.start == "uvicorn main:app --host 0.0.0.0 --port $PORT"


@pytest.mark.parametrize(
    ("name", "files", "reason"),
    [
        pytest.param("My Shop", {"Containerfile": "FROM scratch\n"}, "not a DNS label", id="name"),
        pytest.param("plain", {"app.py": "print(1)\n"}, "unless it is built", id="not built"),
    ],
)
def test_a_directory_without_a_manifest_says_what_it_needs(
    tmp_path: Path, name: str, files: dict[str, str], reason: str
) -> None:
    app = tmp_path / name
    app.mkdir()
    for file, text in files.items():
        (app / file).write_text(text)
    with pytest.raises(AppDirError, match=reason):
        load_app_dir(app)
