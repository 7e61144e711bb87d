//! `/metrics` exposes the documented series, and they move when traffic flows.
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Observer, SNP_TYPE, client, http_get, request, start};

/// The value of the series `name` (with labels, exactly as printed), if present.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_series_exist_and_move_with_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(common::undebounced_config(dir.path())).await;

    let (status, before) = http_get(server.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    for series in [
        "dubbo_cp_ingest_queue_depth 0",
        "dubbo_cp_store_commits_total 0",
        "dubbo_cp_dds_streams_open 0",
        "dubbo_cp_dds_pushes_total 0",
        "dubbo_cp_store_commit_duration_seconds_count 0",
        "dubbo_cp_debounce_flush_delay_seconds_count 0",
    ] {
        assert!(before.contains(series), "{series} missing from:\n{before}");
    }

    let mut sdk = client(server.grpc_addr).await;
    assert!(
        sdk.register_service_app_mapping(request("ns", "app", &["I"]))
            .await
            .is_ok()
    );
    assert!(
        sdk.register_service_app_mapping(request("ns", "app", &["I"]))
            .await
            .is_ok()
    );
    assert!(
        sdk.register_service_app_mapping(request("NS", "app", &["I"]))
            .await
            .is_err()
    );
    common::wait_published(&server, 1).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let _ = observer.next().await;
    observer.send("999", SNP_TYPE).await;
    // Counted once the stream has handled it.
    let stale = &server.dds_stats.stale_nonces;
    let counted = tokio::time::timeout(Duration::from_secs(10), async {
        while stale.load(std::sync::atomic::Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "the stale nonce was never counted");

    let (_, after) = http_get(server.admin_addr, "/metrics").await;
    let expect = |name: &str, wanted: f64| {
        assert_eq!(value(&after, name), Some(wanted), "{name} in:\n{after}");
    };
    expect("dubbo_cp_registrations_total{result=\"stored\"}", 1.0);
    expect(
        "dubbo_cp_registrations_total{result=\"already_registered\"}",
        1.0,
    );
    expect("dubbo_cp_registrations_total{result=\"invalid\"}", 1.0);
    expect("dubbo_cp_store_commits_total", 1.0);
    expect("dubbo_cp_store_pairs_written_total", 1.0);
    expect("dubbo_cp_store_commit_duration_seconds_count", 1.0);
    expect("dubbo_cp_debounce_flush_size_count", 1.0);
    expect("dubbo_cp_debounce_flush_delay_seconds_count", 1.0);
    expect("dubbo_cp_dds_streams_open", 1.0);
    expect("dubbo_cp_dds_pushes_total", 1.0);
    expect("dubbo_cp_dds_push_delay_seconds_count", 1.0);
    expect("dubbo_cp_dds_stale_nonces_total", 1.0);
    assert!(after.contains("# TYPE dubbo_cp_store_commit_duration_seconds histogram"));
    assert!(after.ends_with("# EOF\n"), "not OpenMetrics text");
    assert!(server.stop().await.is_ok());
}
