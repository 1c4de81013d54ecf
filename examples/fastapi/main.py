"""A FastAPI app that `wakeful deploy examples/fastapi` builds from this directory (the top
README's "Builds from source")."""

import os

from fastapi import FastAPI

app = FastAPI()


@app.get("/")
def hello() -> dict[str, str]:
    return {"hello": "from a build", "greeting": os.environ.get("GREETING", "")}


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
