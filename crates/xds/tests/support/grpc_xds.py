"""Real gRPC xDS traffic for the tests: released grpcio, no generated code.

backend NAME [HOST]: serves every unary method on HOST:0 (127.0.0.1), answering NAME; prints the
port.
client TARGET: reads "count N" lines on stdin, makes N unary calls to TARGET (an xds:/// URI,
bootstrap from GRPC_XDS_BOOTSTRAP_CONFIG) and prints a JSON object {backend: answers, "error": n}.
"count N running" also prints the line "running" once a tenth of the calls are done, so a test
can change the configuration while the rest run; words "key=value" after N are sent as metadata.
"settle WHO RUN [key=value ...]" calls until WHO answers RUN calls in a row (WHO "error": until
calls fail), at most 5,000 calls, and prints {"calls": n, "settled": bool}: a client applies a version it acknowledged a moment
later (its balancer is rebuilt after the ACK), so a test settles before it counts.
"callers N M HEADER" plays N callers, caller i making M calls with metadata HEADER=caller-i, and
prints {WHO: callers only WHO answered, "mixed": callers answered by several, "by": {caller: WHO}}.
"""
import json
import sys
from concurrent import futures

import grpc

METHOD = "/dubbo.test.Echo/Who"


def backend(name, host="127.0.0.1"):
    answer = name.encode()

    class Handler(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            return grpc.unary_unary_rpc_method_handler(lambda request, context: answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port(host + ":0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()  # until the test closes stdin
    server.stop(None)


def client(target):
    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(METHOD)
    def who_answers(metadata):
        try:
            return call(b"", timeout=10, metadata=metadata).decode()
        except grpc.RpcError:
            return "error"

    for line in sys.stdin:
        words = line.split()
        if len(words) == 4 and words[0] == "callers":
            result = {"by": {}}
            for i in range(int(words[1])):
                caller = "caller-%d" % i
                answered = {who_answers(((words[3], caller),)) for _ in range(int(words[2]))}
                who = answered.pop() if len(answered) == 1 else "mixed"
                result[who] = result.get(who, 0) + 1
                result["by"][caller] = who
            print(json.dumps(result), flush=True)
            continue
        if len(words) >= 3 and words[0] == "settle":
            metadata = tuple(tuple(w.split("=", 1)) for w in words[3:] if "=" in w)
            calls, run, wanted = 0, 0, int(words[2])
            while calls < 5000 and run < wanted:
                calls += 1
                run = run + 1 if who_answers(metadata) == words[1] else 0
            print(json.dumps({"calls": calls, "settled": run >= wanted}), flush=True)
            continue
        if len(words) < 2 or words[0] != "count":
            print(json.dumps({"error": "bad command " + line.strip()}), flush=True)
            continue
        total = int(words[1])
        running = "running" in words[2:]
        metadata = tuple(tuple(w.split("=", 1)) for w in words[2:] if "=" in w)
        counts = {}
        for i in range(total):
            if running and i == total // 10:
                print("running", flush=True)
            try:
                who = call(b"", timeout=10, metadata=metadata).decode()
            except grpc.RpcError as err:
                who = "error"
                counts.setdefault("last_error", str(err.details()))
            counts[who] = counts.get(who, 0) + 1
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "backend":
        backend(*sys.argv[2:4])
    else:
        client(sys.argv[2])
