"""docs/security.md's greeter: an xDS-enabled grpcio server (gRFC A36) that takes its TLS and
RBAC from dubbo-cp. No generated code: every unary method (org.example.Greeter's SayHello, and
Delete, which the walk-through's DENY policy names) answers with the server's name and the
caller's SPIFFE ID (empty on plaintext), as JSON {"who": NAME, "peer": ID}.

  server.py HOST PORT NAME    serves on HOST:PORT until stopped; the bootstrap comes from
                              GRPC_XDS_BOOTSTRAP_CONFIG (dubbo-cp bootstrap)
"""
import json
import sys
from concurrent import futures

import grpc

def peer_id(context):
    auth = context.auth_context()
    for key in ("peer_spiffe_id", "x509_subject_alternative_name"):
        for value in auth.get(key, []):
            text = value.decode(errors="replace")
            if text.startswith("spiffe://"):
                return text
    return ""


def main(host, port, name):
    class Greeter(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            def answer(request, context):
                return json.dumps({"who": name, "peer": peer_id(context)}).encode()

            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), xds=True)
    server.add_generic_rpc_handlers((Greeter(),))
    # xDS server credentials: TLS when the control plane says so (STRICT), else plaintext.
    server.add_secure_port(
        "%s:%s" % (host, port),
        grpc.xds_server_credentials(grpc.insecure_server_credentials()),
    )
    server.start()  # serves once its listener arrives from dubbo-cp
    print("greeter %s started on %s:%s" % (name, host, port), flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:4])
