"""What an image app runs: its command, environment and working directory (`what_runs`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wakeful.domain.models import AppSpec, ImageConfig, ImageRecord
from wakeful.node.sandbox.launch import Launch, ports, what_runs
from wakeful.node.sandbox.ports import PortPool

DIGEST = "sha256:" + "ab" * 32


def image(**config: object) -> ImageRecord:
    return ImageRecord(
        ref="registry.example/shop:1",
        digest=DIGEST,
        manifest=DIGEST,
        config_digest=DIGEST,
        layers=[],
        config=ImageConfig.model_validate(config),
    )


def launch(
    spec: dict[str, object], record: ImageRecord | None, app_port: int | None = None
) -> Launch:
    return Launch(
        spec=AppSpec.model_validate(spec),
        app="shop",
        base=Path("/nonexistent"),
        packed=None,
        host="127.0.0.1",
        port=41000,
        image=record,
        app_port=app_port,
    )


SHOP = image(
    entrypoint=["/bin/shop"],
    cmd=["--listen", "$PORT"],
    env=["PATH=/opt/shop/bin:/usr/bin", "MODE=image", "BROKEN"],
    working_dir="/srv",
)


def test_an_image_runs_its_entrypoint_and_cmd_unexpanded_as_docker_does() -> None:
    command, _, run = what_runs(launch({"image": "shop:1"}, SHOP), {})
    assert command == ["/bin/shop", "--listen", "$PORT"]
    assert run is not None and run.workdir == "/srv" and run.record is SHOP


def test_a_manifest_command_overrides_both_and_is_expanded() -> None:
    spec = {"image": "shop:1", "command": ["/bin/shop", "--port", "${PORT}"]}
    command, _, _ = what_runs(launch(spec, SHOP), {})
    assert command == ["/bin/shop", "--port", "41000"]


@pytest.mark.parametrize(
    ("manifest_env", "secrets", "name", "expected"),
    [
        ({}, {}, "PATH", "/opt/shop/bin:/usr/bin"),  # the image's PATH beats the base one
        ({"MODE": "toml"}, {}, "MODE", "toml"),  # wakeful.toml's env over the image's
        ({}, {"MODE": "secret"}, "MODE", "secret"),  # the secrets over both
        ({}, {}, "PORT", "41000"),  # and PORT over everything
        ({}, {}, "LANG", "C.UTF-8"),  # what every sandbox gets, when the image says nothing
    ],
    ids=["image PATH", "toml over image", "secret over image", "PORT", "base env"],
)
def test_the_image_env_lies_under_the_manifest_secrets_and_port(
    manifest_env: dict[str, str], secrets: dict[str, str], name: str, expected: str
) -> None:
    _, env, _ = what_runs(launch({"image": "shop:1", "env": manifest_env}, SHOP), secrets)
    assert env[name] == expected
    assert "BROKEN" not in env


def test_an_image_without_a_working_dir_runs_in_its_root() -> None:
    _, _, run = what_runs(launch({"image": "shop:1"}, image(cmd=["/bin/sh"])), {})
    assert run is not None and run.workdir == "/"


def test_a_directory_app_runs_as_before() -> None:
    command, env, run = what_runs(launch({"command": ["python3", "$PORT"]}, None), {})
    assert (command, env["PORT"], run) == (["python3", "41000"], "41000", None)


def test_in_its_own_network_an_image_app_listens_on_its_port_on_every_address() -> None:
    spec = {"image": "shop:1", "command": ["/bin/shop", "$HOST:$PORT"]}
    command, env, run = what_runs(launch(spec, SHOP, app_port=80), {})
    assert command == ["/bin/shop", "0.0.0.0:80"]
    assert (env["PORT"], env["HOST"]) == ("80", "0.0.0.0")
    assert run is not None and (run.app_port, run.node_host, run.node_port) == (
        80,
        "127.0.0.1",
        41000,
    )


@pytest.mark.parametrize(
    ("spec", "record", "inside", "given_back"),
    [
        ({"command": ["x"]}, None, None, True),
        ({"command": ["x"], "port": 41999}, None, None, False),
        ({"image": "shop:1"}, image(exposed_ports=["80/tcp"]), 80, True),
        ({"image": "shop:1", "port": 9000}, image(exposed_ports=["80/tcp"]), 9000, True),
        ({"image": "shop:1"}, image(exposed_ports=["80/tcp", "443/tcp"]), "node", True),
        ({"image": "shop:1"}, image(), "node", True),
    ],
    ids=[
        "a directory app gets a free port",
        "a directory app's fixed port is its own, not the pool's",
        "an image's one EXPOSE is where it listens; its node port is free",
        "wakeful.toml's port wins over EXPOSE",
        "two EXPOSEs: the node port's number, passed in PORT",
        "no EXPOSE: the same",
    ],
)
def test_ports(
    spec: dict[str, object], record: ImageRecord | None, inside: object, given_back: bool
) -> None:
    pool = PortPool(41000, 41099)
    port, app_port, taken = ports(pool, AppSpec.model_validate(spec), record)
    if record is None:
        assert app_port is None
        assert port == (spec.get("port") or taken)
    else:
        assert 41000 <= port <= 41099 and taken == port
        assert app_port == (port if inside == "node" else inside)
    assert (taken is not None) is given_back
