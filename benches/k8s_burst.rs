//! Kubernetes-mode write coalescing against the API-server fixture: a burst of 100 SDK replicas
//! of one application, each registering 50 interfaces (one call per interface, then all again),
//! spread over two control-plane replicas. Prints API writes, writes per object, time to
//! convergence and the request rate the fixture saw. Then a burst of 10,000 watch events
//! (kubectl-style edits: 100 objects x 100 edits) and what it cost the index: object encodes and
//! state assemblies. Asserts nothing.
//!
//! `cargo bench --bench k8s_burst`

#[path = "../tests/common/apiserver.rs"]
mod apiserver;

use std::time::{Duration, Instant};

use apiserver::ApiServer;
use dubbo_cp::config::{Config, Mode};
use dubbo_cp::pb::snp::ServiceMappingRequest;
use dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use tonic::transport::Channel;

const SDK_REPLICAS: usize = 100;
const INTERFACES: usize = 50;
const CONTROL_PLANES: usize = 2;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let api = ApiServer::start().await;
    let mut dirs = Vec::new();
    let mut planes = Vec::new();
    for _ in 0..CONTROL_PLANES {
        let dir = tempfile::tempdir()?;
        let config = Config {
            grpc_addr: ([127, 0, 0, 1], 0).into(),
            admin_addr: ([127, 0, 0, 1], 0).into(),
            data_dir: dir.path().to_path_buf(),
            tls: dubbo_cp::config::TlsConfig {
                addr: ([127, 0, 0, 1], 0).into(),
                ..Config::default().tls
            },
            webhook: dubbo_cp::config::WebhookConfig {
                addr: ([127, 0, 0, 1], 0).into(),
                ..Config::default().webhook
            },
            mode: Mode::Kubernetes,
            auth: dubbo_cp::config::AuthConfig {
                token_review: Some(false),
                ..Config::default().auth
            },
            kubernetes: dubbo_cp::config::KubernetesConfig {
                api_server: Some(api.url()),
                ..Config::default().kubernetes
            },
            // The canary controller's Lease would add requests to the count.
            canary: dubbo_cp::config::CanaryConfig {
                enabled: false,
                ..Config::default().canary
            },
            ..Config::default()
        };
        planes.push(dubbo_cp::server::start(config).await?);
        dirs.push(dir);
    }
    let mut channels = Vec::new();
    for plane in &planes {
        channels.push(
            Channel::from_shared(format!("http://{}", plane.grpc_addr))?
                .connect()
                .await?,
        );
    }

    let requests_before = api.requests();
    let started = Instant::now();
    let mut sdks = Vec::new();
    for replica in 0..SDK_REPLICAS {
        let mut client =
            ServiceNameMappingServiceClient::new(channels[replica % CONTROL_PLANES].clone());
        sdks.push(tokio::spawn(async move {
            // Each interface registered, then everything once more (an SDK restart).
            for round in 0..2 {
                for i in 0..INTERFACES {
                    let request = ServiceMappingRequest {
                        namespace: "bench".into(),
                        application_name: "burst-provider".into(),
                        interface_names: vec![format!("org.apache.dubbo.bench.Service{i}")],
                    };
                    let ok = client
                        .register_service_app_mapping(request)
                        .await
                        .is_ok_and(|r| r.get_ref().success);
                    assert!(ok, "replica {replica} round {round} interface {i} failed");
                }
            }
        }));
    }
    for sdk in sdks {
        sdk.await?;
    }
    let acked = started.elapsed();
    let converged = loop {
        let done = (0..INTERFACES).all(|i| {
            api.applications("bench", &format!("org-apache-dubbo-bench-service{i}"))
                == vec!["burst-provider".to_string()]
        });
        if done {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("no convergence within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Let late upserts (the other replica's reads) finish before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = api.writes();
    let per_object = api.writes_per_object();
    let max_per_object = per_object.values().copied().max().unwrap_or(0);
    let requests = api.requests() - requests_before;
    let times = api.write_times();
    let span = match (times.first(), times.last()) {
        (Some(first), Some(last)) => last.duration_since(*first),
        _ => Duration::ZERO,
    };
    let mut kube_requests = 0;
    let mut conflicts = 0;
    for plane in &planes {
        if let Some(stats) = &plane.kube_stats {
            kube_requests += stats.requests.load(std::sync::atomic::Ordering::Relaxed);
            conflicts += stats.conflicts.load(std::sync::atomic::Ordering::Relaxed);
        }
    }
    let registrations = SDK_REPLICAS * INTERFACES * 2;
    println!(
        "# k8s_burst: {SDK_REPLICAS} SDK replicas x {INTERFACES} interfaces x 2 rounds = {registrations} registrations, {CONTROL_PLANES} control planes, default debounce and kubernetes settings"
    );
    println!(
        "all acknowledged after        {:>8.1} ms",
        acked.as_secs_f64() * 1000.0
    );
    println!(
        "converged after               {:>8.1} ms",
        converged.as_secs_f64() * 1000.0
    );
    println!(
        "API writes (create + update)  {writes:>8} for {} objects (max {max_per_object} per object)",
        per_object.len()
    );
    println!(
        "API requests seen by fixture  {requests:>8} (control planes sent {kube_requests}; {conflicts} conflicts)"
    );
    println!(
        "writes span                   {:>8.1} ms",
        span.as_secs_f64() * 1000.0
    );
    println!(
        "request rate over convergence {:>8.1} req/s",
        requests as f64 / converged.as_secs_f64().max(0.001)
    );
    watch_burst(&api, &planes[0]).await?;
    for plane in planes {
        plane.stop().await?;
    }
    Ok(())
}

/// 10,000 watch events for 100 objects, as fast as the fixture takes them; counts what the index
/// of one control plane did with them.
async fn watch_burst(
    api: &ApiServer,
    plane: &dubbo_cp::server::RunningServer,
) -> anyhow::Result<()> {
    const OBJECTS: usize = 100;
    const EDITS: usize = 100;
    let kind = dubbo_cp::index::Kind::ServiceNameMapping;
    let stats = plane.index.stats();
    let publishes = stats.publishes_of(kind);
    let started = Instant::now();
    for edit in 0..EDITS {
        for object in 0..OBJECTS {
            api.kubectl_apply(
                "watch-burst",
                &format!("obj-{object}"),
                serde_json::json!({
                    "interfaceName": format!("org.apache.dubbo.burst.Service{object}"),
                    "applicationNames": [format!("app-{edit}")],
                }),
            );
        }
    }
    let applied = started.elapsed();
    let mut rx = plane.index.subscribe(kind);
    let last = format!("app-{}", EDITS - 1);
    tokio::time::timeout(
        Duration::from_secs(60),
        rx.wait_for(|state| {
            (0..OBJECTS).all(|object| {
                state
                    .objects
                    .get(&format!("obj-{object}/watch-burst"))
                    .is_some_and(|o| match &o.value {
                        dubbo_cp::index::Resource::Mapping { applications, .. } => {
                            *applications == vec![last.clone()]
                        }
                        _ => false,
                    })
            })
        }),
    )
    .await??;
    let published = started.elapsed();
    println!(
        "# watch burst: {} events ({OBJECTS} objects x {EDITS} edits) applied in {:.1} ms, in the index after {:.1} ms",
        OBJECTS * EDITS,
        applied.as_secs_f64() * 1000.0,
        published.as_secs_f64() * 1000.0
    );
    // Objects are encoded by the protocol edges that read a state (once per changed object),
    // not by the index: what the index does is publish once per debounce window.
    println!(
        "states published (windows)    {:>8}",
        stats.publishes_of(kind) - publishes
    );
    Ok(())
}
