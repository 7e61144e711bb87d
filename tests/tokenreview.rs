//! Kubernetes mode authenticates callers with TokenReview against the API-server fixture.
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::apiserver::ApiServer;
use common::{Observer, SNP_TYPE, channel, client, http_get, request, start};
use dubbo_cp::config::Config;
use dubbo_cp::pb::snp::ServiceMappingResponse;
use tonic::Code;

fn config(dir: &std::path::Path, api: &ApiServer) -> Config {
    common::kubernetes_config(dir, api.url())
}

async fn register(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    kind: Option<&str>,
    namespace: &str,
) -> Result<ServiceMappingResponse, tonic::Status> {
    let mut call = tonic::Request::new(request(namespace, "app", &["I"]));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        call.metadata_mut().insert("authorization", value);
    }
    if let Some(kind) = kind {
        call.metadata_mut()
            .insert("authorization-type", kind.parse().unwrap());
    }
    client(addr)
        .await
        .register_service_app_mapping(call)
        .await
        .map(|r| r.into_inner())
}

fn code<T>(result: Result<T, tonic::Status>) -> Option<Code> {
    result.err().map(|s| s.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_are_reviewed_and_cached() {
    let api = ApiServer::start().await;
    api.add_token("sa-token", "system:serviceaccount:demo:provider", &[]);
    api.add_token(
        "ca-token",
        "system:serviceaccount:demo:provider",
        &["dubbo-ca"],
    );
    api.add_token("user-token", "kubernetes-admin", &[]);
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api)).await;
    let addr = server.grpc_addr;

    // Accepted, and the second call within the cache time costs no TokenReview.
    assert!(register(addr, Some("sa-token"), None, "demo").await.is_ok());
    let reviews = api.token_reviews();
    assert!(
        register(addr, Some("sa-token"), Some("kubernetes"), "demo")
            .await
            .is_ok()
    );
    assert_eq!(
        api.token_reviews(),
        reviews,
        "a cached token was reviewed again"
    );

    // Rejected: unknown token, no token, not a service account.
    assert_eq!(
        code(register(addr, Some("nope"), None, "demo").await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(register(addr, None, None, "demo").await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(register(addr, Some("user-token"), None, "demo").await),
        Some(Code::Unauthenticated)
    );

    // Audience dubbo-ca: only tokens made for it.
    assert!(
        register(addr, Some("ca-token"), Some("dubbo-ca-token"), "demo")
            .await
            .is_ok()
    );
    let wrong_audience = register(addr, Some("sa-token"), Some("dubbo-ca-token"), "demo")
        .await
        .err();
    assert_eq!(
        wrong_audience.as_ref().map(|s| s.code()),
        Some(Code::Unauthenticated)
    );
    assert!(
        wrong_audience
            .map(|s| s.message().to_owned())
            .unwrap_or_default()
            .contains("audience")
    );
    assert_eq!(
        code(register(addr, Some("sa-token"), Some("dubbo-jwt"), "demo").await),
        Some(Code::Unauthenticated)
    );

    // Cross-namespace.
    let denied = register(addr, Some("sa-token"), None, "other").await.err();
    assert_eq!(denied.map(|s| s.code()), Some(Code::PermissionDenied));

    // Streams need a reviewed token too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while http_get(server.admin_addr, "/readyz").await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = Observer::connect_as(channel(addr).await, None).await.err();
    assert_eq!(refused.map(|s| s.code()), Some(Code::Unauthenticated));
    let mut observer = Observer::connect_as(channel(addr).await, Some("sa-token"))
        .await
        .unwrap();
    observer.subscribe(SNP_TYPE).await;
    assert_eq!(observer.next().await.nonce, "1");
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_is_unavailable_not_unauthenticated() {
    let api = ApiServer::start().await;
    api.add_token("sa-token", "system:serviceaccount:demo:provider", &[]);
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api)).await;
    api.set_down(true);
    assert_eq!(
        code(register(server.grpc_addr, Some("sa-token"), None, "demo").await),
        Some(Code::Unavailable)
    );
    api.set_down(false);
    assert!(
        register(server.grpc_addr, Some("sa-token"), None, "demo")
            .await
            .is_ok()
    );
    assert!(server.stop().await.is_ok());
}
