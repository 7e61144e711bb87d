#!/usr/bin/env bash
# Everything side by side: installs Debian's zookeeper package (and its Java) if missing, builds
# in release mode, and runs `dubbo-cp-bench all`. Extra arguments go to `all`
# (e.g. --runs 5, --skip-zookeeper).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/java/zookeeper.jar ]; then
  echo "installing Debian's zookeeper package for the ZooKeeper baseline" >&2
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq zookeeper >/dev/null
fi

cargo build --release --workspace --bins
exec ./target/release/dubbo-cp-bench all "$@"
