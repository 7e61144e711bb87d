#!/usr/bin/env bash
# docs/xds.md's walk-through: a released gRPC client (grpcio) calls the Dubbo interface
# org.example.Greeter by name through dubbo-cp's xDS, and two backends share its calls 80/20.
#
# Needs a running control plane (`dubbo-cp serve`), `dubbo-cp` on PATH and python3. The CLI
# finds the control plane as every command does (DUBBO_CP_ADMIN, DUBBO_CP_SERVER and
# DUBBO_CP_XDS_SERVER, defaults 127.0.0.1:30070, :30060 and :15010). grpcio comes from PYTHON
# when it names a Python that has it, else from python3, else it is installed once (the release
# the tests use) in a virtual environment under ~/.cache/dubbo-cp-examples (Debian and Ubuntu:
# `apt-get install python3-venv` first). GREETER_PORTS moves the two backends (default
# "50051 50052"), CALLS sets the number of calls (1000).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
read -r port_a port_b <<<"${GREETER_PORTS:-50051 50052}"
calls=${CALLS:-1000}

python=${PYTHON:-python3}
if ! "$python" -c 'import grpc' 2>/dev/null; then
    venv="${XDG_CACHE_HOME:-$HOME/.cache}/dubbo-cp-examples/venv"
    if ! "$venv/bin/python" -c 'import grpc' 2>/dev/null; then
        echo "installing grpcio in $venv" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio==1.85.3
    fi
    python="$venv/bin/python"
fi

# 1. Two backends of application `greeter`, answering "a" and "b".
logs=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$logs"' EXIT
for backend in "a $port_a" "b $port_b"; do
    read -r name port <<<"$backend"
    "$python" "$here/greeter.py" serve "$port" "$name" >"$logs/$name" 2>&1 &
    pids+=($!)
done
for name in a b; do
    # Each prints one line once it listens (or its error, and exits).
    until grep -q serving "$logs/$name"; do
        if ! kill -0 "${pids[@]}" 2>/dev/null; then cat "$logs"/* >&2; exit 1; fi
        sleep 0.1
    done
done

# 2. Where they are: a ServiceEntry on loopback, one port per endpoint, weights 80 and 20.
sed -e "s/50051/$port_a/" -e "s/50052/$port_b/" "$here/greeter.yaml" | dubbo-cp apply -f -

# 3. What every Dubbo 3 provider does at start-up: interface org.example.Greeter is served by
#    application greeter (--wait: until clients are served it).
dubbo-cp register -n shop -a greeter org.example.Greeter --wait

# 4. The client's bootstrap: the xDS server and the client's namespace, where names resolve.
GRPC_XDS_BOOTSTRAP_CONFIG="$(dubbo-cp bootstrap -n shop -a web)"
export GRPC_XDS_BOOTSTRAP_CONFIG

# 5. The calls, by interface name: each backend's share.
"$python" "$here/greeter.py" call xds:///org.example.Greeter "$calls"
