"""Released grpcio's xDS clients, with or without xDS credentials, driven line by line by the
tests (the servers are the shipped examples/security/server.py and server.js). No generated code.

client TARGET MODE: MODE "xds" (xDS channel credentials, plaintext fallback) or "plain" (no TLS
whatever the control plane says). Reads lines from stdin:
  "call N METHOD [PAUSE_MS]" makes N calls (PAUSE_MS apart) and prints {"OK": n, CODE: n, ...,
  "peers": {id: n}, "last_error": s};
  "settle OUTCOME RUN METHOD" calls until OUTCOME (OK or a status code name) comes RUN times in a
  row, for at most 30 s, and prints {"calls": n, "settled": bool, "last": outcome, "details": s}.
The bootstrap comes from GRPC_XDS_BOOTSTRAP_CONFIG.
"""
import json
import sys
import time

import grpc
import grpc.experimental


def client(target, mode):
    if mode == "xds":
        channel = grpc.secure_channel(
            target,
            grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials()),
        )
    else:
        channel = grpc.insecure_channel(target)
    callables = {}

    def outcome(method):
        call = callables.setdefault(method, channel.unary_unary(method))
        try:
            return "OK", json.loads(call(b"", timeout=10).decode()), None
        except grpc.RpcError as err:
            return err.code().name, None, err.details()

    for line in sys.stdin:
        words = line.split()
        if len(words) in (3, 4) and words[0] == "call":
            result = {"peers": {}}
            pause = int(words[3]) / 1000 if len(words) == 4 else 0
            for _ in range(int(words[1])):
                if pause:
                    time.sleep(pause)
                code, answer, details = outcome(words[2])
                result[code] = result.get(code, 0) + 1
                if answer is not None:
                    result["peers"][answer["peer"]] = result["peers"].get(answer["peer"], 0) + 1
                if details is not None:
                    result["last_error"] = details
            print(json.dumps(result), flush=True)
        elif len(words) == 4 and words[0] == "settle":
            calls, run, wanted, last, details = 0, 0, int(words[2]), None, None
            # Bounded in time, not calls: failing calls can be quick, and a configuration takes
            # a moment to reach both ends.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and run < wanted:
                calls += 1
                last, _, details = outcome(words[3])
                run = run + 1 if last == words[1] else 0
                if run == 0:
                    time.sleep(0.005)
            print(json.dumps({"calls": calls, "settled": run >= wanted, "last": last,
                              "details": details}), flush=True)
        else:
            print(json.dumps({"error": "bad command " + line.strip()}), flush=True)


if __name__ == "__main__":
    client(sys.argv[2], sys.argv[3])
