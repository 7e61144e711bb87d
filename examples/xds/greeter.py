"""The xDS walk-through's gRPC programs, on released grpcio with no generated code.

  greeter.py serve PORT NAME     a backend of org.example.Greeter on 127.0.0.1:PORT, answering
                                 every call with NAME, until it is stopped
  greeter.py call TARGET CALLS   CALLS calls of /org.example.Greeter/SayHello to TARGET (an
                                 xds:/// name; the bootstrap comes from GRPC_XDS_BOOTSTRAP_CONFIG),
                                 then each backend's share of the answers
"""
import sys
from concurrent import futures

import grpc

METHOD = "/org.example.Greeter/SayHello"


def serve(port, name):
    answer = name.encode()

    class Greeter(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            if handler_call_details.method != METHOD:
                return None
            return grpc.unary_unary_rpc_method_handler(lambda request, context: answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Greeter(),))
    server.add_insecure_port("127.0.0.1:%d" % port)
    server.start()
    print("greeter %s serving on 127.0.0.1:%d" % (name, port), flush=True)
    server.wait_for_termination()


def call(target, calls):
    channel = grpc.insecure_channel(target)
    say_hello = channel.unary_unary(METHOD)
    answers = {}
    for _ in range(calls):
        try:
            # wait_for_ready: the first call waits while the client fetches its configuration.
            who = say_hello(b"", timeout=20, wait_for_ready=True).decode()
        except grpc.RpcError as err:
            print("call failed: %s %s" % (err.code(), err.details()), file=sys.stderr)
            sys.exit(1)
        answers[who] = answers.get(who, 0) + 1
    for who, count in sorted(answers.items()):
        print("%s answered %d of %d calls (%d%%)" % (who, count, calls, round(100 * count / calls)))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "call":
        call(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
