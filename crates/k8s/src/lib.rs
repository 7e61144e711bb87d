//! Kubernetes mode: the custom resources, the per-key queue that writes mappings, and the
//! watches that feed what is in the cluster to the index (and to the [`cluster::ClusterView`]),
//! and the expiry of applications whose registering pods are gone ([`expiry`]).

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_auth as auth;
use dubbo_cp_canary as canary;
use dubbo_cp_debounce as debounce;
use dubbo_cp_domain::{mapping, rules};
use dubbo_cp_index as index;
use dubbo_cp_kit::{metrics, ratelimit, shutdown};
use dubbo_cp_store as store;

pub mod cluster;
pub mod config;
pub mod crd;
pub mod expiry;
pub mod services;
pub mod watch;
pub mod writer;

pub use config::{KubernetesConfig, MappingConfig, WriterConfig};
pub use crd::{ServiceNameMapping, ServiceNameMappingSpec};

/// A client for the API server at `api_server`, or from the usual places (`KUBECONFIG`,
/// `~/.kube/config`, the in-cluster service account) when it is `None`.
///
/// kube's own retry layer is off: it would retry 429/503/504 for minutes inside one call,
/// hiding outages from our capped, jittered, metered retries and stalling authentication.
pub async fn client(api_server: Option<&str>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let mut config = match api_server {
        Some(url) => {
            let uri: http::Uri = url
                .parse()
                .with_context(|| format!("invalid API server URL {url}"))?;
            kube::Config::new(uri)
        }
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration found (KUBECONFIG, ~/.kube/config or in-cluster)",
        )?,
    };
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}
