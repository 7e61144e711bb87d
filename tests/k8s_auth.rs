//! Kubernetes-mode authentication against the API-server fixture: service-account tokens
//! verified locally (keys from OIDC discovery, the bound pod from the pod watch), through an
//! API-server outage; garbage tokens cost a bounded number of TokenReviews.

// Tests and their helpers: a failure is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::apiserver::ApiServer;
use common::sa_tokens::{Claims, Issuer};
use common::{client, http_get, metric, request, start};
use dubbo_cp::auth::Authenticator;
use dubbo_cp::auth::keys::ServiceAccountKeys;
use dubbo_cp::auth::pods::PodView;
use dubbo_cp::auth::serviceaccount::{CacheSettings, ServiceAccountAuthenticator};
use dubbo_cp::auth::tokenreview::TokenReviewer;
use dubbo_cp::config::Config;
use dubbo_cp::pb::snp::ServiceMappingResponse;
use dubbo_cp::ratelimit::RateLimiter;
use serde_json::json;
use tonic::Code;
use tonic::metadata::MetadataMap;

fn config(dir: &std::path::Path, api: &ApiServer) -> Config {
    let mut config = common::kubernetes_config(dir, api.url());
    // Refreshes keep failing through the outage below; the keys must survive them.
    config.auth.keys_refresh_interval = Duration::from_millis(100);
    config
}

async fn register(
    addr: std::net::SocketAddr,
    token: &str,
    kind: Option<&str>,
) -> Result<ServiceMappingResponse, tonic::Status> {
    let mut call = tonic::Request::new(request("demo", "app", &["I"]));
    call.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
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

async fn wait_until<F: AsyncFnMut() -> bool>(what: &str, mut condition: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_verify_locally_and_through_an_api_outage() {
    let (api, issuer) = common::sa_tokens::cluster_with_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api)).await;
    let addr = server.grpc_addr;
    let admin = server.admin_addr;
    wait_until("ready", async || http_get(admin, "/readyz").await.0 == 200).await;

    let token = issuer.mint(&Claims::bound("demo", "provider", ("provider-1", "uid-1")));
    let answer = register(addr, &token, None).await;
    assert!(answer.is_ok_and(|r| r.success));
    assert_eq!(
        api.token_reviews(),
        0,
        "a cluster token needs no TokenReview"
    );
    assert_eq!(
        metric(admin, "dubbo_cp_auth_tokens_verified_locally_total").await,
        1.0
    );

    // Tokens made for dubbo-ca, as injected pods send them.
    let ca_token = issuer.mint(&Claims {
        audiences: &["dubbo-ca"],
        ..Claims::bound("demo", "provider", ("provider-1", "uid-1"))
    });
    assert!(
        register(addr, &ca_token, Some("dubbo-ca-token"))
            .await
            .is_ok()
    );
    let wrong = register(addr, &token, Some("dubbo-ca-token")).await.err();
    assert_eq!(
        wrong.as_ref().map(|s| s.code()),
        Some(Code::Unauthenticated)
    );
    assert!(wrong.is_some_and(|s| s.message().contains("audience")));

    // The API server goes away for longer than any cache or key refresh interval here.
    api.set_down(true);
    let down_since = api.requests();
    wait_until("key refreshes fail during the outage", async || {
        api.requests() > down_since + 5
    })
    .await;
    // A token never seen before, of a pod the watch knows: accepted without the API server.
    let fresh = issuer.mint(&Claims {
        expires_in: 1800,
        ..Claims::bound("demo", "provider", ("provider-1", "uid-1"))
    });
    let during = register(addr, &fresh, None).await;
    assert!(
        during.as_ref().is_ok_and(|r| r.success),
        "a valid token was refused during the outage: {during:?}"
    );
    // Decided answers need no API server either.
    let expired = issuer.mint(&Claims {
        expires_in: -120,
        ..Claims::bound("demo", "provider", ("provider-1", "uid-1"))
    });
    let refused = register(addr, &expired, None).await.err();
    assert_eq!(
        refused.as_ref().map(|s| s.code()),
        Some(Code::Unauthenticated)
    );
    assert!(refused.is_some_and(|s| s.message().contains("expired")));
    let forger = Issuer::new("key-1");
    let forged = forger.mint(&Claims::bound("demo", "provider", ("provider-1", "uid-1")));
    let refused = register(addr, &forged, None).await.err();
    assert_eq!(
        refused.as_ref().map(|s| s.code()),
        Some(Code::Unauthenticated)
    );
    assert!(refused.is_some_and(|s| s.message().contains("signature")));
    api.set_down(false);

    // A token of a pod that was replaced (same name, new UID) or deleted is refused.
    let replaced = issuer.mint(&Claims::bound("demo", "provider", ("provider-1", "uid-0")));
    assert_eq!(
        register(addr, &replaced, None)
            .await
            .err()
            .map(|s| s.code()),
        Some(Code::Unauthenticated)
    );
    api.delete_pod("demo", "provider-1");
    // Each attempt is a new token (its own exp), so no cached answer hides the deletion.
    let mut expires_in = 1700;
    let mut last = None;
    wait_until("the pod's deletion refuses its tokens", async || {
        expires_in += 1;
        let token = issuer.mint(&Claims {
            expires_in,
            ..Claims::bound("demo", "provider", ("provider-1", "uid-1"))
        });
        last = register(addr, &token, None).await.err();
        last.is_some()
    })
    .await;
    assert_eq!(last.as_ref().map(|s| s.code()), Some(Code::Unauthenticated));
    assert!(last.is_some_and(|s| s.message().contains("no longer exists")));
    assert_eq!(
        api.token_reviews(),
        0,
        "every token here was decided locally"
    );
    assert!(server.stop().await.is_ok());
}

/// The authenticator on its own, to see the identity it builds.
async fn authenticator(api: &ApiServer, reviews: (f64, u32)) -> ServiceAccountAuthenticator {
    let client = dubbo_cp::k8s::client(Some(&api.url())).await.unwrap();
    let keys = Arc::new(ServiceAccountKeys::new(
        client.clone(),
        Duration::from_millis(100),
    ));
    assert!(keys.refresh_if_stale().await.is_some(), "keys fetched");
    let requests = Arc::new(RateLimiter::new(reviews.0, reviews.1));
    let pods = Arc::new(PodView::new(client.clone(), requests.clone()));
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(pods.clone().run(shutdown));
    let synced = pods.clone();
    wait_until("pods listed", async || synced.is_synced()).await;
    ServiceAccountAuthenticator::new(
        keys,
        pods,
        TokenReviewer::new(client),
        requests,
        Vec::new(),
        CacheSettings {
            ttl: Duration::from_secs(30),
            negative_ttl: Duration::from_secs(30),
            max_bytes: 8 << 20,
        },
    )
}

fn bearer(token: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    metadata
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_identity_carries_the_bound_pod() {
    let api = ApiServer::start().await;
    let issuer = Issuer::new("key-1");
    api.set_jwks(issuer.jwks.clone());
    api.put_pod(
        "demo",
        "provider-1",
        "uid-1",
        json!({"app": "provider", "version": "v2"}),
        &["10.0.0.7", "fd00::7"],
    );
    let authn = authenticator(&api, (10.0, 10)).await;
    let token = issuer.mint(&Claims::bound("demo", "provider", ("provider-1", "uid-1")));
    let identity = authn.authenticate(&bearer(&token)).await.unwrap();
    assert_eq!(identity.namespace, "demo");
    assert_eq!(identity.name, "demo/provider");
    let pod = identity.pod.expect("the bound pod");
    assert_eq!(
        (pod.name.as_str(), pod.uid.as_str()),
        ("provider-1", "uid-1")
    );
    assert_eq!(pod.ips, vec!["10.0.0.7", "fd00::7"]);
    assert_eq!(pod.labels.get("version").map(String::as_str), Some("v2"));
    assert_eq!(api.pod_gets(), 0, "the watch knew the pod");

    // A pod created after the list, not yet seen by the watch, is read once.
    let unseen = issuer.mint(&Claims::bound("demo", "provider", ("provider-2", "uid-2")));
    assert!(authn.authenticate(&bearer(&unseen)).await.is_err());
    assert_eq!(api.pod_gets(), 1);
    // ... and the refusal is cached.
    assert!(authn.authenticate(&bearer(&unseen)).await.is_err());
    assert_eq!(api.pod_gets(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_tokens_cost_a_bounded_number_of_reviews() {
    let api = ApiServer::start().await;
    let issuer = Issuer::new("key-1");
    api.set_jwks(issuer.jwks.clone());
    let (per_second, burst) = (5.0, 10);
    let authn = Arc::new(authenticator(&api, (per_second, burst)).await);
    let started = tokio::time::Instant::now();
    let stranger = Issuer::new("unknown-kid");
    let mut tokens: Vec<String> = (0..500).map(|i| format!("garbage-{i}")).collect();
    // JWTs from a key the cluster does not have: not verifiable locally.
    tokens.extend((0..500).map(|i| {
        stranger.mint(&Claims {
            expires_in: 3600 + i,
            ..Claims::bound("demo", "provider", ("p", "u"))
        })
    }));
    let mut calls = tokio::task::JoinSet::new();
    for round in 0..2 {
        for token in &tokens {
            let (authn, token) = (authn.clone(), token.clone());
            calls.spawn(async move { authn.authenticate(&bearer(&token)).await });
        }
        while let Some(result) = calls.join_next().await {
            let refused = result.unwrap().err();
            assert!(
                refused.is_some(),
                "round {round}: a garbage token was accepted"
            );
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let bound = f64::from(burst) + per_second * elapsed + 1.0;
    let reviews = api.token_reviews() as f64;
    println!(
        "2,000 garbage authentications in {elapsed:.2}s caused {reviews} TokenReviews (bound {bound:.0})"
    );
    assert!(reviews >= 1.0, "the fallback was used");
    assert!(
        reviews <= bound,
        "{reviews} reviews exceed the bound {bound}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_admitted_before_any_authentication_work() {
    let api = ApiServer::start().await;
    api.set_jwks(Issuer::new("key-1").jwks);
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), &api);
    // One new stream, then none for a long while.
    config.dds.new_streams_burst = 1;
    config.dds.new_streams_per_second = 0.001;
    let server = start(config).await;
    let admin = server.admin_addr;
    wait_until("ready", async || http_get(admin, "/readyz").await.0 == 200).await;

    let first =
        common::Observer::connect_as(common::channel(server.grpc_addr).await, Some("opaque-1"))
            .await
            .err();
    assert_eq!(first.map(|s| s.code()), Some(Code::Unauthenticated));
    assert_eq!(api.token_reviews(), 1, "an opaque token is reviewed");
    // Beyond the admission rate: refused before its token is looked at.
    for i in 0..20 {
        let token = format!("opaque-more-{i}");
        let refused =
            common::Observer::connect_as(common::channel(server.grpc_addr).await, Some(&token))
                .await
                .err();
        assert_eq!(refused.map(|s| s.code()), Some(Code::Unavailable));
    }
    assert_eq!(
        api.token_reviews(),
        1,
        "refused streams cost no TokenReview"
    );
    assert!(server.stop().await.is_ok());
}
