"""The stateful sample app (examples/notes) for a test: its directory, and adding and reading
notes through an ingress."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

NOTES = Path(__file__).parents[2] / "examples" / "notes"


HOST = {"Host": "notes.localhost"}


def notes_app(root: Path, delay: str = "60s", activation: str = "120s") -> Path:
    target = root / "notes"
    shutil.copytree(NOTES, target)
    manifest = (target / "wakeful.toml").read_text()
    manifest = manifest.replace('scale_down_delay = "60s"', f'scale_down_delay = "{delay}"')
    manifest = manifest.replace(
        'name = "notes"', f'name = "notes"\nactivation_timeout = "{activation}"'
    )
    (target / "wakeful.toml").write_text(manifest)
    return target


def add(client: httpx.Client, note: str) -> None:
    answer = client.post("/", content=note, headers=HOST)
    assert answer.status_code == 201, answer.text


def read(client: httpx.Client) -> list[str]:
    answer = client.get("/", headers=HOST)
    assert answer.status_code == 200, answer.text
    return answer.text.splitlines()
