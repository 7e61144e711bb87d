"""Registers gRPC backends in ZooKeeper as Dubbo providers register themselves, and keeps them
registered until stopped: one ephemeral node per provider at
/dubbo/<interface>/providers/<URL-encoded tri:// URL>, the URL naming the application and the
interface as Dubbo's SDKs write it (docs/zookeeper.md, "Providers as xDS endpoints").

  provider.py ZOOKEEPER INTERFACE APPLICATION PORT [PORT...]
      ZOOKEEPER is host:port; each PORT is a backend on 127.0.0.1. Prints "registered" once
      every node is written, then waits until it is stopped (the nodes go with its session).
"""
import signal
import sys
import time
import urllib.parse

from kazoo.client import KazooClient


def url(interface, application, port):
    parameters = urllib.parse.urlencode({
        "application": application,
        "interface": interface,
        "side": "provider",
        "release": "3.3.1",
        "timestamp": int(time.time() * 1000),
    })
    return "tri://127.0.0.1:%d/%s?%s" % (port, interface, parameters)


def main(zookeeper, interface, application, ports):
    zk = KazooClient(hosts=zookeeper)
    zk.start(timeout=30)
    directory = "/dubbo/%s/providers" % interface
    zk.ensure_path(directory)
    for port in ports:
        node = urllib.parse.quote(url(interface, application, port), safe="")
        zk.create("%s/%s" % (directory, node), b"", ephemeral=True)
    print("registered", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    finally:
        zk.stop()


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], [int(p) for p in sys.argv[4:]])
