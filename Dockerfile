# One image for every piece; the entry point is the `wakeful` CLI.
#   docker build -t wakeful .
#   docker run --rm -p 8080:8080 wakeful up --listen 0.0.0.0:8080 examples/hello
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends util-linux \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/wakeful
COPY pyproject.toml README.md ./
# wakeful/ links to the four component folders beside it; the wheel gets real files.
COPY wakeful ./wakeful
COPY activator ./activator
COPY ingress ./ingress
COPY idle_monitor ./idle_monitor
COPY deploy ./deploy
COPY examples ./examples
RUN pip install . && useradd --create-home --uid 10001 wakeful \
    && mkdir /data && chown wakeful /data

USER wakeful
WORKDIR /data
EXPOSE 8080 8082
ENTRYPOINT ["wakeful", "--data-dir", "/data/.wakeful"]
CMD ["up", "--listen", "0.0.0.0:8080", "/opt/wakeful/examples/hello"]
