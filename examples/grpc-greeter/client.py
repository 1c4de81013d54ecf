"""Call the greeter through wakeful's ingress: `python client.py [TARGET] [NAME]`.

TARGET is the ingress's address (`localhost:8080`); the app is chosen by its name, sent as
the call's authority (`grpc-greeter.localhost`), as a browser's Host header would.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
protos, services = grpc.protos_and_services("greeter.proto")


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "localhost:8080"
    name = sys.argv[2] if len(sys.argv) > 2 else "world"
    options = [("grpc.default_authority", "grpc-greeter.localhost")]
    with grpc.insecure_channel(target, options=options) as channel:
        greeter = services.GreeterStub(channel)
        print(greeter.SayHello(protos.HelloRequest(name=name), timeout=30).message)
        print([r.message for r in greeter.CountTo(protos.CountRequest(count=3), timeout=30)])
        many = iter([protos.HelloRequest(name=n) for n in ("ann", "bob")])
        print(greeter.HelloAll(many, timeout=30).message)
        chat = iter([protos.HelloRequest(name=n) for n in ("cy", "di")])
        print([r.message for r in greeter.Chat(chat, timeout=30)])


if __name__ == "__main__":
    main()
