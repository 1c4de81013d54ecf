"""A FastAPI app, run from an OCI image: `examples/fastapi/README` in the top README's
"Apps from images" says how to build and deploy it."""

import os

from fastapi import FastAPI

app = FastAPI()


@app.get("/")
def hello() -> dict[str, str]:
    return {"hello": "from an image", "greeting": os.environ.get("GREETING", "")}


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
