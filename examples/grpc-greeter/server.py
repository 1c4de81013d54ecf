"""A gRPC greeter behind wakeful: `wakeful up examples/grpc-greeter`, then call it through
the ingress (h2c on the plain listener, or h2 on the TLS one); see client.py.

The messages come from greeter.proto at start (`grpc.protos_and_services`, grpcio-tools):
nothing generated is kept in the repository. It serves the standard health service too, so
`[health] grpc = true` probes it the way Kubernetes' gRPC probes do.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
protos, services = grpc.protos_and_services("greeter.proto")
INSTANCE = uuid.uuid4().hex[:8]


class Greeter(services.GreeterServicer):
    def SayHello(self, request, context):
        if request.delay:
            time.sleep(request.delay)
        return protos.HelloReply(message=f"hello {request.name}", instance=INSTANCE)

    def CountTo(self, request, context) -> Iterator[object]:
        for i in range(1, request.count + 1):
            if not context.is_active():
                return
            yield protos.HelloReply(message=str(i), instance=INSTANCE)
            if request.interval:
                time.sleep(request.interval)

    def HelloAll(self, requests, context):
        names = [request.name for request in requests]
        return protos.HelloReply(message="hello " + ", ".join(names), instance=INSTANCE)

    def Chat(self, requests, context) -> Iterator[object]:
        for request in requests:
            yield protos.HelloReply(message=f"hello {request.name}", instance=INSTANCE)


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    services.add_GreeterServicer_to_server(Greeter(), server)
    checks = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    address = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '50051')}"
    server.add_insecure_port(address)
    server.start()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    print(f"greeter {INSTANCE} serving on {address}", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
