"""A Dubbo provider's traffic and metrics for the canary tests, on released grpcio.

provider NAME HOST APPLICATION FAIL_PERCENT DELAY_MS: one pod's provider. Serves every unary
method on HOST:0, answering NAME; FAIL_PERCENT of the calls (every one whose running share falls
due, so exactly that share) end with INTERNAL "injected failure", and each call takes DELAY_MS
longer. Exports Dubbo's provider metrics in Prometheus's text format on HOST:0 /metrics. Prints
"GRPC_PORT METRICS_PORT"; runs until stdin closes.

client TARGET: calls TARGET (an xds:/// URI, bootstrap from GRPC_XDS_BOOTSTRAP_CONFIG) one call
after another, from the first command until stdin closes, so traffic flows the whole run. The
calls carry the metadata ("key=value" words) of the last "count" or "settle" command. Commands on
stdin, each answered with one JSON line, each counting only calls started after it:
  "count N [key=value ...]": who answered the next N calls: {NAME: n, "injected": n, "error": n,
  "last_error": details}.
  "settle WHO RUN [key=value ...]": waits until WHO answered RUN calls in a row (the client
  applies a version a moment after it acknowledged it); {"settled": bool, "calls": n}, false after 5,000.
  "totals": the counts over every call so far (since the last "reset"), whatever their metadata.
  "reset": starts the totals afresh.
"""
import collections
import http.server
import json
import sys
import threading
import time
from concurrent import futures

import grpc

METHOD = "/dubbo.test.Echo/Who"
INJECTED = "injected failure"
# Dubbo computes its response-time quantiles over a sliding window; so does this.
WINDOW_SECONDS = 30


class Metrics:
    def __init__(self, application, host):
        self.lock = threading.Lock()
        self.total = 0
        self.succeeded = 0
        self.samples = collections.deque(maxlen=20000)  # (time, milliseconds)
        self.labels = 'application_name="%s",interface="dubbo.test.Echo",method="Who",ip="%s"' % (
            application,
            host,
        )

    def record(self, ok, millis):
        with self.lock:
            self.total += 1
            self.succeeded += 1 if ok else 0
            self.samples.append((time.monotonic(), millis))

    def text(self):
        with self.lock:
            horizon = time.monotonic() - WINDOW_SECONDS
            while self.samples and self.samples[0][0] < horizon:
                self.samples.popleft()
            recent = sorted(m for _, m in self.samples)
            total, succeeded = self.total, self.succeeded
        lines = [
            "# TYPE dubbo_provider_requests_total counter",
            "dubbo_provider_requests_total{%s} %d" % (self.labels, total),
            "# TYPE dubbo_provider_requests_succeed_total counter",
            "dubbo_provider_requests_succeed_total{%s} %d" % (self.labels, succeeded),
        ]
        if recent:
            p99 = recent[min(len(recent) - 1, (len(recent) * 99) // 100)]
            lines += [
                "# TYPE dubbo_provider_rt_milliseconds_p99 gauge",
                "dubbo_provider_rt_milliseconds_p99{%s} %.3f" % (self.labels, p99),
            ]
        return ("\n".join(lines) + "\n").encode()


def provider(name, host, application, fail_percent, delay_ms):
    answer = name.encode()
    fail_percent, delay = int(fail_percent), int(delay_ms) / 1000.0
    metrics = Metrics(application, host)
    calls = [0]
    calls_lock = threading.Lock()

    def who(request, context):
        started = time.monotonic()
        with calls_lock:
            calls[0] += 1
            n = calls[0]
        # Call n fails when the share of failures due rises with it: exactly fail_percent%.
        fail = (n * fail_percent) // 100 != ((n - 1) * fail_percent) // 100
        if delay:
            time.sleep(delay)
        metrics.record(not fail, (time.monotonic() - started) * 1000.0)
        if fail:
            context.abort(grpc.StatusCode.INTERNAL, INJECTED)
        return answer

    class Handler(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            return grpc.unary_unary_rpc_method_handler(who)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port(host + ":0")
    server.start()

    class Scrape(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = metrics.text()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    exporter = http.server.ThreadingHTTPServer((host, 0), Scrape)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    print(port, exporter.server_address[1], flush=True)
    sys.stdin.read()  # until the test closes stdin
    exporter.shutdown()
    server.stop(None)


def client(target):
    options = []
    if not target.startswith("xds:"):
        # Round robin: a direct target of several pods (a load tester's) reaches each of them.
        options.append(("grpc.service_config", '{"loadBalancingConfig": [{"round_robin": {}}]}'))
    channel = grpc.insecure_channel(target, options=options)
    call = channel.unary_unary(METHOD)
    state = threading.Condition()
    totals = {}
    # What the current command counts: only calls started after it, with its metadata.
    # "limit": a count's N, so a call that ends before the command reads its window is not
    # counted as an N+1th.
    current = {"generation": 0, "metadata": (), "window": {}, "done": 0, "streak": ["", 0],
               "limit": None}

    def calls():
        while True:
            with state:
                generation, metadata = current["generation"], current["metadata"]
            try:
                who = call(b"", timeout=10, metadata=metadata).decode()
                detail = None
            except grpc.RpcError as err:
                detail = str(err.details())
                who = "injected" if detail == INJECTED else "error"
            if who == "error":
                # An address with no endpoint fails at once: back off as a client would, so a
                # settle's 5,000 calls are not spent in a moment while the version converges.
                time.sleep(0.01)
            with state:
                totals[who] = totals.get(who, 0) + 1
                if who == "error":
                    totals["last_error"] = detail
                limit = current["limit"]
                if generation == current["generation"] and (limit is None or current["done"] < limit):
                    window, streak = current["window"], current["streak"]
                    window[who] = window.get(who, 0) + 1
                    streak[:] = [who, streak[1] + 1 if streak[0] == who else 1]
                    current["done"] += 1
                state.notify_all()

    started = False
    for line in sys.stdin:
        words = line.split()
        if not started:
            threading.Thread(target=calls, daemon=True).start()
            started = True
        with state:
            if words[:1] in (["count"], ["settle"]):
                metadata = tuple(tuple(w.split("=", 1)) for w in words if "=" in w)
                current.update(
                    generation=current["generation"] + 1,
                    metadata=metadata,
                    window={},
                    done=0,
                    streak=["", 0],
                    limit=int(words[1]) if words[0] == "count" else None,
                )
            if words[:1] == ["count"]:
                wanted = int(words[1])
                state.wait_for(lambda: current["done"] >= wanted)
                counts = dict(current["window"])
                if "error" in counts:
                    counts["last_error"] = totals["last_error"]
                print(json.dumps(counts), flush=True)
            elif words[:1] == ["settle"]:
                who, wanted = words[1], int(words[2])

                def settled():
                    return current["streak"][0] == who and current["streak"][1] >= wanted

                state.wait_for(lambda: settled() or current["done"] >= 5000)
                answer = {"settled": settled(), "calls": current["done"]}
                if not answer["settled"]:
                    # Who answered instead, so a failure says why.
                    answer["window"] = dict(current["window"])
                    answer["last_error"] = totals.get("last_error", "")
                print(json.dumps(answer), flush=True)
            elif words == ["totals"]:
                print(json.dumps(totals), flush=True)
            elif words == ["reset"]:
                totals.clear()
                print(json.dumps({"reset": True}), flush=True)
            else:
                print(json.dumps({"bad command": line.strip()}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "provider":
        provider(*sys.argv[2:7])
    else:
        client(sys.argv[2])
