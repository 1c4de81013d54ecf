# One image for every piece of wakeful; the entry point is the `wakeful` CLI.
#
#   podman build --format docker -t wakeful .          (or: docker build -t localhost/wakeful .)
#
# The README's "As containers" says how to run it: the flags that give apps their sandboxes,
# the volume, the ports, and docker-compose.yml. The base is Debian's own slim image;
# `scripts/base-image` makes it locally where no image registry is reachable.
ARG BASE=docker.io/library/debian:bookworm-slim

# -- build: a virtual environment with wakeful and its dependencies, nothing else ----------
# The ingress's per-request modules are compiled here with mypyc (setup.py, wakeful/native.py),
# so the build stage has a C compiler and Python's headers; the image itself has neither.
FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
        libc6-dev ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/wakeful
WORKDIR /src
# An optional extra CA bundle for pip, where the build host reaches PyPI through a proxy with
# its own CA:  --secret id=extra_ca,src=/path/to/bundle.pem  (the file is never in a layer).
# The dependencies first, in a layer of their own that a change of wakeful's code reuses;
# with them the build's own needs and mypy (pinned in the test extra: mypyc is what compiles).
COPY pyproject.toml README.md ./
RUN --mount=type=secret,id=extra_ca \
    if [ -s /run/secrets/extra_ca ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /run/secrets/extra_ca > /tmp/ca.pem; \
        export PIP_CERT=/tmp/ca.pem; \
    fi \
    && python3 -c 'import tomllib; t = tomllib.load(open("pyproject.toml", "rb")); \
        mypy = [d for d in t["project"]["optional-dependencies"]["test"] if d.startswith("mypy==")]; \
        print("\n".join(t["project"]["dependencies"] + t["build-system"]["requires"] + mypy))' \
        > /tmp/requirements.txt \
    && /opt/wakeful/bin/pip install --quiet -r /tmp/requirements.txt \
    && rm -f /tmp/ca.pem
# wakeful/ links to the four component folders beside it; the wheel gets real files.
COPY wakeful ./wakeful
COPY activator ./activator
COPY ingress ./ingress
COPY idle_monitor ./idle_monitor
COPY deploy ./deploy
COPY setup.py ./
# Compiled against the dependencies installed above (their types are the compiled code's).
# The compiler goes once it has run (the compiled code needs none of it), and the build fails
# unless the compiled exchange is what the image's Python imports.
RUN /opt/wakeful/bin/pip install --quiet --no-deps --no-build-isolation . \
    && /opt/wakeful/bin/pip uninstall --quiet --yes mypy mypy_extensions pathspec ast_serialize \
        librt setuptools pip \
    && /opt/wakeful/bin/python -c 'import sys, wakeful, wakeful.ingress.edge; \
        print("the ingress is", wakeful.NATIVE); sys.exit(wakeful.NATIVE != "compiled")'

# -- the image: Python, the sandbox tools, the venv, an unprivileged user ----------------------
FROM ${BASE}
# container=oci: systemd's convention; wakeful's refusals then name the container flags.
ENV container=oci PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/wakeful/bin:/usr/sbin:/usr/bin:/sbin:/bin
# python3: the venv's interpreter; bubblewrap and nftables: sandbox isolation (util-linux's
# setpriv and prlimit are already in the base); tini: PID 1, which passes SIGTERM on to wakeful
# and reaps what sandboxes leave behind.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 bubblewrap nftables tini \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group wakeful \
    && mkdir -p /data /artifacts /secret-keys \
    && chown wakeful:wakeful /data /artifacts /secret-keys
COPY --from=build /opt/wakeful /opt/wakeful
COPY examples /opt/wakeful/examples

# Everything wakeful keeps (store, tokens, artifacts, secrets keys, logs) is in this one
# volume. /artifacts and /secret-keys: for WAKEFUL_ARTIFACT_DIR and WAKEFUL_SECRETS_KEYS, where
# several activators share one of each (docker-compose.yml).
VOLUME /data
WORKDIR /data
USER wakeful
# 8080: the ingress (apps' traffic); 8082: the control API, the dashboard (/ui) and /metrics.
EXPOSE 8080 8082
# Healthy when a control API (8082: `up`, `activator`) or an ingress's admin port (8081) on
# this container answers /healthz, asked directly (never through a proxy the environment
# names). A node agent serves no port: docker-compose.yml turns the check off for nodes.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["python3", "-c", \
    "import sys, urllib.request as u\nask = u.build_opener(u.ProxyHandler({})).open\nfor p in (8082, 8081):\n    try:\n        ask(f'http://127.0.0.1:{p}/healthz', timeout=2); sys.exit(0)\n    except OSError: pass\nsys.exit(1)"]
STOPSIGNAL SIGTERM
# The data directory is ./.wakeful, in /data: `podman exec C wakeful status` finds it too.
ENTRYPOINT ["/usr/bin/tini", "--", "wakeful"]
CMD ["up", "--listen", "0.0.0.0:8080", "--api-listen", "0.0.0.0:8082", "/opt/wakeful/examples/hello"]
