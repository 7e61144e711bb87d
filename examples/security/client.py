"""docs/security.md's caller: a grpcio client with xDS channel credentials, so it gets mTLS to a
STRICT server from the clusters dubbo-cp sends it, with no configuration of its own.

  client.py TARGET METHOD CALLS [plain]
      CALLS calls of METHOD (SayHello or Delete of org.example.Greeter) to TARGET (an xds:///
      name; the bootstrap comes from GRPC_XDS_BOOTSTRAP_CONFIG), then how many ended with each
      status and which SPIFFE ID the server saw. `plain`: no xDS credentials (no TLS whatever
      the control plane says). Exits 0 whatever the calls' outcome.
"""
import json
import sys

import grpc
import grpc.experimental


def main(target, method, calls, mode):
    if mode == "plain":
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(
            target,
            grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials()),
        )
    call = channel.unary_unary("/org.example.Greeter/%s" % method)
    outcomes, peers = {}, {}
    for i in range(calls):
        try:
            # The first call waits while the client fetches its configuration (a plain client
            # of a STRICT server would wait for a connection that never comes).
            wait = i == 0 and mode != "plain"
            answer = json.loads(call(b"", timeout=20, wait_for_ready=wait).decode())
            outcomes["OK"] = outcomes.get("OK", 0) + 1
            peer = answer["peer"] or "(plaintext)"
            peers[peer] = peers.get(peer, 0) + 1
        except grpc.RpcError as err:
            code = err.code().name
            outcomes[code] = outcomes.get(code, 0) + 1
    for code, count in sorted(outcomes.items()):
        print("%s: %d of %d calls" % (code, count, calls))
    for peer, count in sorted(peers.items()):
        print("  the server saw %s on %d" % (peer, count))


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) == 5 else "xds")
