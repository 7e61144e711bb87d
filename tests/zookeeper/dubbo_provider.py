"""A Dubbo provider on the released Python SDK (PyPI `apache-dubbo`), registered in ZooKeeper.

provider ZK_ADDRESS SERVICE NAME APPLICATION: serves SERVICE's unary method `Who` over Triple on
127.0.0.1 (a free port), answering NAME, and registers it at interface level in ZooKeeper, as the
SDK does (an ephemeral node under /dubbo/SERVICE/providers). Prints the port once registered; runs
until stdin closes, then unregisters (its session ends, so its node goes).
"""
import socket
import sys

import dubbo
from dubbo.configs import ApplicationConfig, RegistryConfig, ServiceConfig
from dubbo.proxy.handlers import RpcMethodHandler, RpcServiceHandler


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(zk, service, name, application):
    answer = name.encode()
    handler = RpcServiceHandler(
        service_name=service,
        method_handlers=[
            RpcMethodHandler.unary(
                lambda request: answer,
                method_name="Who",
                request_deserializer=lambda data: data,
                response_serializer=lambda data: data,
            )
        ],
    )
    port = free_port()
    bootstrap = dubbo.Dubbo(
        application_config=ApplicationConfig(name=application),
        registry_config=RegistryConfig.from_url("zookeeper://" + zk),
    )
    server = bootstrap.create_server(ServiceConfig(handler, host="127.0.0.1", port=port))
    server.start()
    print(port, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(*sys.argv[1:])
