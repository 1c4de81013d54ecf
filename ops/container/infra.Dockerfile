# The pieces wakeful does not make, for docker-compose.yml: Debian's etcd-server (the store)
# and haproxy (the load balancer in front of the ingresses). Built like wakeful's image, from
# Debian's bookworm-slim (`scripts/base-image` makes it where no registry is reachable):
#   podman build --format docker -f ops/container/infra.Dockerfile -t wakeful-infra ops/container
ARG BASE=docker.io/library/debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends etcd-server haproxy tini \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/etcd/data && chown etcd:etcd /var/lib/etcd /var/lib/etcd/data
COPY haproxy.cfg /etc/haproxy/haproxy.cfg
ENTRYPOINT ["/usr/bin/tini", "--"]
