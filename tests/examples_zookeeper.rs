//! docs/zookeeper.md's walk-through (`examples/zookeeper/walkthrough.sh`) run as a reader runs it,
//! on moved ports against a real ZooKeeper (Debian's): providers registered as Dubbo's SDKs
//! register them, a released grpcio client calling the interface by name, a weight and a tag rule
//! applied through dubbo-cp and seen in the split of the calls and in the config center.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use common::zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zookeeper_walkthrough_runs_as_written() {
    let zk = ZooKeeper::start().await;
    let python = released::venv(
        "grpcio-1.85.3-kazoo-2.11.0",
        "grpcio==1.85.3 kazoo==2.11.0",
        "import grpc, kazoo",
    );
    let stdout = common::walkthrough::run("zookeeper/walkthrough.sh", 2, |ports| {
        vec![
            ("PYTHON", python.display().to_string()),
            ("ZOOKEEPER", zk.address()),
            ("CALLS", "300".to_owned()),
            ("GREETER_PORTS", format!("{} {}", ports[0], ports[1])),
        ]
    })
    .await;
    for expected in [
        "== DynamicConfig: a weighs 400, b 100",
        "//#weight=400                  80.0%",
        "a answered 300 of 300 calls (100%)",
        "route 2: dubbo-tag=gray",
        "/dubbo/config/dubbo/greeter.configurators:",
        "/dubbo/config/dubbo/greeter.tag-router:",
        "== done",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in\n{stdout}");
    }
}
