#!/usr/bin/env bash
# docs/security.md's standalone walk-through, end to end: a control plane with a token per
# workload, an agent per workload keeping its certificate, an xDS-enabled grpcio server (and a
# @grpc/grpc-js-xds one) that take mTLS and RBAC from policies, and a grpcio client that gets mTLS
# to them with no configuration of its own.
#
# Starts its own control plane (`dubbo-cp serve`, on the ports the DUBBO_CP_* variables name,
# defaults 30060/30070/15010/30062; its data in a temporary directory), so nothing may run on
# them. Needs `dubbo-cp` on PATH and python3. grpcio comes from PYTHON when it names a Python that
# has it, else from python3, else the virtual environment examples/xds/walkthrough.sh makes under
# ~/.cache/dubbo-cp-examples (made here when missing; Debian: `apt-get install python3-venv`).
# The grpc-js server runs when Node.js finds @grpc/grpc-js-xds (NODE_PATH, or installed once with
# npm under ~/.cache/dubbo-cp-examples when node and npm exist; NO_GRPC_JS=1 skips it).
# GREETER_PORTS moves the two greeters (default "50051 50061"), XDS_PROXY the grpc-js agent's
# xDS proxy (default 127.0.0.1:15011: the control plane's own 15010 is taken on one host).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
read -r port js_port <<<"${GREETER_PORTS:-50051 50061}"
proxy=${XDS_PROXY:-127.0.0.1:15011}
tls_port=${DUBBO_CP_TLS_ADDR:-127.0.0.1:30062}; tls_port=${tls_port##*:}
cache="${XDG_CACHE_HOME:-$HOME/.cache}/dubbo-cp-examples"

python=${PYTHON:-python3}
if ! "$python" -c 'import grpc' 2>/dev/null; then
    if ! "$cache/venv/bin/python" -c 'import grpc' 2>/dev/null; then
        echo "installing grpcio in $cache/venv" >&2
        python3 -m venv "$cache/venv"
        "$cache/venv/bin/pip" install --quiet --disable-pip-version-check grpcio==1.85.3
    fi
    python="$cache/venv/bin/python"
fi
js=no
if [ "${NO_GRPC_JS:-0}" != 1 ] && command -v node >/dev/null; then
    if ! node -e "require('@grpc/grpc-js-xds')" 2>/dev/null && command -v npm >/dev/null; then
        if [ ! -d "$cache/node_modules/@grpc/grpc-js-xds" ]; then
            echo "installing @grpc/grpc-js-xds in $cache" >&2
            npm install --silent --no-audit --no-fund --prefix "$cache" \
                @grpc/grpc-js-xds@1.14.1 @grpc/grpc-js@1.14.7 >/dev/null
        fi
        export NODE_PATH="$cache/node_modules${NODE_PATH:+:$NODE_PATH}"
    fi
    node -e "require('@grpc/grpc-js-xds')" 2>/dev/null && js=yes
fi

work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
# Waits until FILE has a line matching PATTERN, or fails showing the logs.
wait_for() {
    for _ in $(seq 300); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "never: $2 in $1" >&2; tail -n 20 "$work"/*.log >&2; exit 1
}
# Runs the client until its answer has every line given (a policy reaches servers and clients a
# moment apart), at most 30 times; prints the last answer.
until_answered() {
    local target=$1 method=$2 mode=$3 node=$4 certs=$5; shift 5
    local answer
    for _ in $(seq 30); do
        answer=$(GRPC_XDS_BOOTSTRAP_CONFIG="$(boot web "$node" "$certs")" \
            "$python" "$here/client.py" "$target" "$method" 10 "$mode")
        local all=yes
        for wanted in "$@"; do grep -q "$wanted" <<<"$answer" || all=no; done
        if [ $all = yes ]; then echo "$answer"; return 0; fi
        sleep 1
    done
    echo "$answer"; echo "never answered: $*" >&2; exit 1
}

# 1. The control plane, with a token per workload identity (serviceAccount makes the SPIFFE ID)
#    and an admin token for rules.
cat > tokens.yaml <<'YAML'
tokens:
  - {token: admin-secret, namespace: ops, identity: ops-admin}
  - {token: shop-secret, namespace: shop, serviceAccount: greeter}
  - {token: web-secret, namespace: web, serviceAccount: frontend}
YAML
DUBBO_CP_DATA_DIR="$work/data" dubbo-cp serve --token-file tokens.yaml --auth-admins ops-admin \
    >serve.log 2>&1 &
pids+=($!)
dubbo-cp status --wait-ready

# 2. One agent per workload: it trades the token for a certificate (from the CA at
#    DUBBO_CP_SERVER, or DUBBO_CA_ADDRESS), then renews it.
printf shop-secret > shop.token && printf web-secret > web.token
dubbo-cp agent --out ./shop-certs --token-file shop.token >shop-agent.log 2>&1 &
pids+=($!)
dubbo-cp agent --out ./web-certs --token-file web.token >web-agent.log 2>&1 &
pids+=($!)
wait_for shop-agent.log "certificate issued"
wait_for web-agent.log "certificate issued"

# 3. Where the greeters serve.
sed -e "s/50051/$port/" -e "s/50061/$js_port/" "$here/greeter.yaml" |
    dubbo-cp apply -f - --token admin-secret --wait

# 4. Bootstraps: the control plane's TLS port, authenticated by the workload's own certificate,
#    and the certificate provider on the agent's directory.
boot() { dubbo-cp bootstrap --xds-server "localhost:$tls_port" -n "$1" --node-id "$2" \
    --ca-file "$3/root-cert.pem" --cert-file "$3/cert-chain.pem" --key-file "$3/key.pem" \
    --certificates "$3"; }
GRPC_XDS_BOOTSTRAP_CONFIG="$(boot shop greeter-0 ./shop-certs)" \
    "$python" "$here/server.py" 127.0.0.1 "$port" greeter >server.log 2>&1 &
pids+=($!)
wait_for server.log started
echo "== no policy: plaintext, everyone in"
until_answered xds:///greeter.shop:7070 SayHello xds frontend-0 ./web-certs "OK: 10 of 10" "(plaintext)"

# 5. and 6. mTLS for namespace shop; only callers of namespace web; nobody may call Delete.
dubbo-cp apply -f "$here/../rules/zero-trust.yaml" --token admin-secret --wait
echo "== STRICT: the client gets mTLS from its clusters, the server sees its SPIFFE ID"
until_answered xds:///greeter.shop:7070 SayHello xds frontend-0 ./web-certs \
    "OK: 10 of 10" "spiffe://cluster.local/ns/web/sa/frontend"
echo "== the DENY policy names Delete"
until_answered xds:///greeter.shop:7070 Delete xds frontend-0 ./web-certs "PERMISSION_DENIED: 10 of 10"
echo "== a client without xDS credentials cannot connect to a STRICT server"
until_answered xds:///greeter.shop:7070 SayHello plain plain-0 ./web-certs "UNAVAILABLE: 10 of 10"

if [ $js = yes ]; then
    # 7. The same policies on a grpc-js server. grpc-js reads no TLS credentials for the control
    #    plane from its bootstrap: it reaches the control plane through an agent's xDS proxy,
    #    on a port of its own, which forwards the stream over TLS with the workload's certificate.
    dubbo-cp agent --out ./shop-js-certs --token-file shop.token \
        --xds-proxy "$proxy" --xds-address "localhost:$tls_port" >shop-js-agent.log 2>&1 &
    pids+=($!)
    wait_for shop-js-agent.log "certificate issued"
    GRPC_XDS_BOOTSTRAP_CONFIG="$(dubbo-cp bootstrap --xds-server "$proxy" -n shop \
        --node-id greeter-js-0 --certificates ./shop-js-certs)" GRPC_XDS_EXPERIMENTAL_RBAC=true \
        node "$here/server.js" 127.0.0.1 "$js_port" greeter-js >server-js.log 2>&1 &
    pids+=($!)
    wait_for server-js.log started
    echo "== grpc-js server, STRICT and RBAC"
    until_answered xds:///greeter-js.shop:7070 SayHello xds frontend-1 ./web-certs \
        "OK: 10 of 10" "spiffe://cluster.local/ns/web/sa/frontend"
    until_answered xds:///greeter-js.shop:7070 Delete xds frontend-1 ./web-certs \
        "PERMISSION_DENIED: 10 of 10"
fi
echo "== done"
