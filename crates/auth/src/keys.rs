//! The keys that sign the cluster's service-account tokens, from the API server's OIDC
//! discovery (`/.well-known/openid-configuration`, then the JWKS it names). They are fetched at
//! start, refreshed periodically and when a token names a key we do not know (at most once per
//! [`MIN_REFRESH`]), and kept across failed refreshes, so tokens verify locally through an
//! API-server outage.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::JwkSet;
use serde::Deserialize;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use crate::shutdown::signalled;

/// Unknown key IDs trigger a refresh at most this often, so forged tokens cannot hammer the
/// API server with JWKS requests.
pub const MIN_REFRESH: Duration = Duration::from_secs(10);
/// Longest wait for a discovery or JWKS answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The issuer and its keys, as last fetched.
#[derive(Debug)]
pub struct KeySet {
    pub issuer: String,
    pub jwks: JwkSet,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
}

pub struct ServiceAccountKeys {
    client: kube::Client,
    current: RwLock<Option<Arc<KeySet>>>,
    /// When the last fetch started; serialises fetches.
    last_fetch: Mutex<Option<Instant>>,
    /// Periodic fetches (and retries until the first works) start at most this often.
    min_refresh: Duration,
}

impl ServiceAccountKeys {
    /// Keys refreshed every `interval` (and on unknown key IDs, paced likewise).
    pub fn new(client: kube::Client, interval: Duration) -> Self {
        Self {
            client,
            current: RwLock::new(None),
            last_fetch: Mutex::new(None),
            min_refresh: interval.min(MIN_REFRESH),
        }
    }

    pub fn current(&self) -> Option<Arc<KeySet>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Fetches the keys again for a token naming an unknown key, unless a fetch started less
    /// than [`MIN_REFRESH`] ago (forged key IDs cannot make it fetch more often); concurrent
    /// callers wait for the one fetch. Returns the keys in force afterwards.
    pub async fn refresh_if_stale(&self) -> Option<Arc<KeySet>> {
        self.refresh_unless_within(MIN_REFRESH).await
    }

    async fn refresh_unless_within(&self, within: Duration) -> Option<Arc<KeySet>> {
        let mut last = self.last_fetch.lock().await;
        if last.is_some_and(|at| at.elapsed() < within) {
            return self.current();
        }
        *last = Some(Instant::now());
        match tokio::time::timeout(FETCH_TIMEOUT, self.fetch()).await {
            Ok(Ok(keys)) => {
                tracing::debug!(issuer = %keys.issuer, keys = keys.jwks.keys.len(), "service-account keys fetched");
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(keys));
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "cannot fetch the service-account keys; keeping the last ones")
            }
            Err(_) => {
                tracing::warn!("no answer for the service-account keys; keeping the last ones")
            }
        }
        self.current()
    }

    async fn fetch(&self) -> anyhow::Result<KeySet> {
        let discovery: Discovery = self.get_json("/.well-known/openid-configuration").await?;
        // The API server serves the keys at this path whatever `jwks_uri` says: with an external
        // issuer (EKS, GKE) the URI names another host, which we need not reach.
        let jwks: JwkSet = self.get_json("/openid/v1/jwks").await?;
        Ok(KeySet {
            issuer: discovery.issuer,
            jwks,
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let request = http::Request::get(path).body(Vec::new())?;
        let text = self.client.request_text(request).await?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Refreshes every `interval` (sooner until the first fetch worked) until shutdown.
    pub async fn run(self: Arc<Self>, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        loop {
            let wait = match self.refresh_unless_within(self.min_refresh).await {
                Some(_) => interval,
                None => self.min_refresh,
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = signalled(&mut shutdown) => return,
            }
        }
    }
}
