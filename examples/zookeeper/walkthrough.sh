#!/usr/bin/env bash
# docs/zookeeper.md's walk-through: Dubbo's registry and config center in a real ZooKeeper, two
# gRPC backends registered there as Dubbo providers of org.example.Greeter (application
# greeter), a released gRPC client (grpcio) calling the interface by name through dubbo-cp's xDS,
# then a weight (DynamicConfig) and a tag rule (TagRoute) applied through dubbo-cp, written where
# Dubbo's SDKs read them, and seen in the split of the calls.
#
# ZOOKEEPER names the ensemble (host:port); unset, a ZooKeeper of Debian's `zookeeper` package
# (`apt-get install zookeeper`) is started on ZK_PORT (default 2181) with its data in a temporary
# directory. Starts its own control plane (`dubbo-cp serve --zookeeper`, on the ports the
# DUBBO_CP_* variables name, defaults 30060/30070/15010/30062), so nothing may run on them.
# Needs `dubbo-cp` on PATH and python3: grpcio and kazoo come from PYTHON when it names a Python
# that has both, else from a virtual environment made once under ~/.cache/dubbo-cp-examples
# (Debian: `apt-get install python3-venv`). GREETER_PORTS moves the two backends (default
# "50071 50072"), CALLS sets the calls per look (1000).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
read -r port_a port_b <<<"${GREETER_PORTS:-50071 50072}"
calls=${CALLS:-1000}
cache="${XDG_CACHE_HOME:-$HOME/.cache}/dubbo-cp-examples"

python=${PYTHON:-python3}
if ! "$python" -c 'import grpc, kazoo' 2>/dev/null; then
    venv="$cache/venv-zookeeper"
    if ! "$venv/bin/python" -c 'import grpc, kazoo' 2>/dev/null; then
        echo "installing grpcio and kazoo in $venv" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio==1.85.3 kazoo==2.11.0
    fi
    python="$venv/bin/python"
fi

work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
# Waits until FILE has a line matching PATTERN, or fails showing the logs.
wait_for() {
    for _ in $(seq 600); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "never: $2 in $1" >&2; tail -n 20 "$work"/*.log >&2; exit 1
}

# 1. The registry and config center: ZooKeeper.
if [ -z "${ZOOKEEPER:-}" ]; then
    jar=/usr/share/java/zookeeper.jar
    [ -f $jar ] || { echo "no ZooKeeper: set ZOOKEEPER=host:port or apt-get install zookeeper" >&2; exit 1; }
    ZOOKEEPER=127.0.0.1:${ZK_PORT:-2181}
    mkdir -p "$work/zk"
    printf 'tickTime=500\ndataDir=%s\nclientPort=%s\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n' \
        "$work/zk" "${ZOOKEEPER##*:}" > "$work/zoo.cfg"
    java -Xmx256m -cp "$jar:/etc/zookeeper/conf" org.apache.zookeeper.server.ZooKeeperServerMain \
        "$work/zoo.cfg" >"$work/zookeeper.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 600); do
        (: >"/dev/tcp/127.0.0.1/${ZOOKEEPER##*:}") 2>/dev/null && break
        sleep 0.1
    done
fi

# 2. The control plane on it: ZooKeeper mode (mappings, rules and providers are ZooKeeper's).
DUBBO_CP_DATA_DIR="$work/data" dubbo-cp serve --zookeeper "$ZOOKEEPER" >"$work/serve.log" 2>&1 &
pids+=($!)
dubbo-cp status --wait-ready

# 3. Two backends, answering "a" and "b", registered as providers of org.example.Greeter of
#    application greeter, as a Dubbo SDK registers them (ephemeral nodes).
for backend in "a $port_a" "b $port_b"; do
    read -r name port <<<"$backend"
    "$python" "$here/../xds/greeter.py" serve "$port" "$name" >"$work/$name.log" 2>&1 &
    pids+=($!)
    wait_for "$work/$name.log" serving
done
"$python" "$here/provider.py" "$ZOOKEEPER" org.example.Greeter greeter "$port_a" "$port_b" \
    >"$work/provider.log" 2>&1 &
pids+=($!)
wait_for "$work/provider.log" registered

# 4. The client's bootstrap: the xDS server and the client's namespace (ZooKeeper's /dubbo root
#    is namespace default).
GRPC_XDS_BOOTSTRAP_CONFIG="$(dubbo-cp bootstrap -n default -a web)"
export GRPC_XDS_BOOTSTRAP_CONFIG

# Calls until a's share is within [$1, $2] percent (a rule reaches the client a moment after it
# is applied), at most 30 looks; prints the last split.
split_until() {
    local low=$1 high=$2 shares share
    for _ in $(seq 30); do
        shares=$("$python" "$here/../xds/greeter.py" call xds:///org.example.Greeter "$calls")
        share=$(sed -n 's/^a answered .*(\([0-9]*\)%)$/\1/p' <<<"$shares")
        share=${share:-0}
        if [ "$share" -ge "$low" ] && [ "$share" -le "$high" ]; then echo "$shares"; return 0; fi
        sleep 1
    done
    echo "$shares"; echo "a's share never came within [$low, $high]%" >&2; exit 1
}

# 5. The calls, by interface name: both providers, alike.
echo "== both providers, weight 100 each"
split_until 35 65

# 6. A weight: a takes four times b's calls (80/20).
sed "s/50071/$port_a/" "$here/weight.yaml" | dubbo-cp apply -f - --wait
echo "== DynamicConfig: a weighs 400, b 100"
split_until 70 90
dubbo-cp xds split org.example.Greeter -n default

# 7. A tag: b is gray, so calls without a tag go to a alone; a call tagged gray goes to b.
sed "s/50072/$port_b/" "$here/tag.yaml" | dubbo-cp apply -f - --wait
echo "== TagRoute: b is gray, untagged calls go to a"
split_until 100 100
dubbo-cp xds split org.example.Greeter -n default --header dubbo-tag:gray

# 8. What the SDKs read: the rules where Dubbo's config center keeps them.
echo "== in ZooKeeper"
"$python" - "$ZOOKEEPER" <<'PY'
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1]); zk.start(timeout=30)
for key in ("greeter.configurators", "greeter.tag-router"):
    data, _ = zk.get("/dubbo/config/dubbo/" + key)
    print("/dubbo/config/dubbo/%s:\n%s" % (key, data.decode()))
zk.stop()
PY
echo "== done"
