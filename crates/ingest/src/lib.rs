//! The registration gRPC service, at both paths SDKs call (wire.md §1): authenticate, limit the
//! caller's rate, validate, authorize the namespace, hand to the store, answer once durable.
//! Errors that are the caller's fault get a gRPC status naming the field; store trouble is
//! `UNAVAILABLE` or `RESOURCE_EXHAUSTED`, which SDKs retry. With legacy answers on, refusals of
//! authentication and authorization are OK with `success: false`, as old SDKs expect.

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_auth as auth;
use dubbo_cp_domain::mapping;
use dubbo_cp_kit::{metrics, ratelimit};
use dubbo_cp_store as store;

pub mod config;
pub mod pb;

pub use config::IngestConfig;

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tonic::{Request, Response, Status};

use crate::auth::{Policy, Refusal};
use crate::mapping::validate_registration;
use crate::metrics::Metrics;
use crate::pb::dubbo::networking::v1alpha1::service_name_mapping_service_server as networking;
use crate::pb::snp::service_name_mapping_service_server as snp;
use crate::pb::snp::{ServiceMappingRequest, ServiceMappingResponse};
use crate::ratelimit::RateLimiter;
use crate::store::{Durable, RegisterOutcome, StoreError};

/// The message of a registration that needed no write.
const ALREADY_REGISTERED: &str = "already registered";
/// Callers tracked for rate limiting; past this the table starts afresh, so memory stays
/// bounded whatever the number of distinct callers.
const MAX_TRACKED_CALLERS: usize = 100_000;

/// Per-caller token buckets.
struct CallerLimits {
    per_second: f64,
    burst: u32,
    buckets: DashMap<String, Arc<RateLimiter>>,
}

impl CallerLimits {
    fn allow(&self, caller: &str) -> bool {
        if let Some(bucket) = self.buckets.get(caller) {
            return bucket.try_acquire();
        }
        if self.buckets.len() >= MAX_TRACKED_CALLERS {
            self.buckets.clear();
        }
        let bucket = self
            .buckets
            .entry(caller.to_owned())
            .or_insert_with(|| Arc::new(RateLimiter::new(self.per_second, self.burst)))
            .clone();
        bucket.try_acquire()
    }
}

#[derive(Clone)]
pub struct Ingest {
    store: Durable,
    /// How long a caller waits for its commit before it is told to retry.
    commit_timeout: Duration,
    policy: Policy,
    limits: Arc<CallerLimits>,
    metrics: Arc<Metrics>,
}

/// How one call ended, with the label it is counted under.
type Counted = (Result<ServiceMappingResponse, Status>, &'static str);

impl Ingest {
    pub fn new(
        store: Durable,
        config: &IngestConfig,
        policy: Policy,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            commit_timeout: config.commit_timeout,
            policy,
            limits: Arc::new(CallerLimits {
                per_second: config.rate_per_caller,
                burst: config.burst_per_caller,
                buckets: DashMap::new(),
            }),
            metrics,
        }
    }

    async fn handle(
        &self,
        request: Request<ServiceMappingRequest>,
    ) -> Result<Response<ServiceMappingResponse>, Status> {
        let (result, label) = self.register(request).await;
        self.metrics.registration(label);
        result.map(Response::new)
    }

    fn refuse(&self, refusal: Refusal) -> Counted {
        let label = refusal.metric_result();
        tracing::debug!(?refusal, "registration refused");
        if self.policy.legacy_answers {
            let message = refusal.into_status().message().to_owned();
            return (
                Ok(ServiceMappingResponse {
                    success: false,
                    message,
                }),
                label,
            );
        }
        (Err(refusal.into_status()), label)
    }

    async fn register(&self, request: Request<ServiceMappingRequest>) -> Counted {
        let identity = match self.policy.authenticate_request(&request).await {
            Ok(identity) => identity,
            Err(refusal) => return self.refuse(refusal),
        };
        // Rates are limited per authenticated identity; without authentication every caller
        // looks alike (often one address), and the bounded ingest queue is the limit.
        if let Some(identity) = &identity
            && !self.limits.allow(&identity.name)
        {
            self.metrics.rejected("caller_rate");
            let status = Status::resource_exhausted(format!(
                "{} exceeds {} registrations per second; retry later",
                identity.name, self.limits.per_second
            ));
            return (Err(status), "exhausted");
        }
        let caller = identity
            .as_ref()
            .map(|i| i.name.clone())
            .unwrap_or_default();
        let pod = identity
            .as_ref()
            .and_then(|i| i.pod.as_ref().map(|pod| pod.name.clone()))
            .unwrap_or_default();
        let request = request.into_inner();
        let mut registration = match validate_registration(
            &request.namespace,
            &request.application_name,
            &request.interface_names,
        ) {
            Ok(registration) => registration,
            Err(err) => {
                tracing::debug!(error = %err, "registration rejected");
                return (Err(Status::invalid_argument(err.to_string())), "invalid");
            }
        };
        if let Err(refusal) = self
            .policy
            .authorize(identity.as_ref(), &registration.namespace)
        {
            return self.refuse(refusal);
        }
        // The pod is recorded so the application can expire once its pods are gone; only a
        // pod of the registration's own namespace (an admin's pod elsewhere is not tracked).
        registration.pod = identity
            .as_ref()
            .filter(|i| i.namespace == registration.namespace)
            .and_then(|i| i.pod.as_ref())
            .map(|pod| crate::mapping::registrants::pod_entry(&pod.name, &pod.uid));
        let namespace = registration.namespace.clone();
        let application = registration.application.clone();
        let interfaces = registration.interfaces.len();
        let outcome = match tokio::time::timeout(
            self.commit_timeout,
            self.store.register(registration),
        )
        .await
        {
            Err(_) => {
                let status = Status::unavailable(format!(
                    "registration not confirmed within {:?}; retry (registering again is safe)",
                    self.commit_timeout
                ));
                return (Err(status), "unavailable");
            }
            Ok(Err(err)) => return store_refusal(err),
            Ok(Ok(outcome)) => outcome,
        };
        let (message, label) = match outcome {
            RegisterOutcome::AlreadyStored => (ALREADY_REGISTERED.to_owned(), "already_registered"),
            RegisterOutcome::Stored { added } => {
                // DEBUG: a counter counts them; at INFO a start-up storm floods the logs.
                tracing::debug!(%namespace, %application, interfaces, added, caller, pod, "registration stored");
                (
                    format!("registered {added} new interface mapping(s)"),
                    "stored",
                )
            }
        };
        (
            Ok(ServiceMappingResponse {
                success: true,
                message,
            }),
            label,
        )
    }
}

fn store_refusal(err: StoreError) -> Counted {
    match err {
        StoreError::Busy(_) | StoreError::TooManyApplications { .. } => (
            Err(Status::resource_exhausted(err.to_string())),
            "exhausted",
        ),
        StoreError::ShuttingDown => (Err(Status::unavailable(err.to_string())), "unavailable"),
        StoreError::Refused(reason) => (Err(Status::invalid_argument(reason)), "invalid"),
        other => {
            // The message stands alone, so it carries the sources (`commit failed: disk I/O
            // error`).
            let error = format!("{:#}", anyhow::Error::new(other));
            tracing::error!(%error, "registration not stored");
            let status = Status::unavailable(format!("registration not stored: {error}"));
            (Err(status), "unavailable")
        }
    }
}

#[tonic::async_trait]
impl snp::ServiceNameMappingService for Ingest {
    async fn register_service_app_mapping(
        &self,
        request: Request<ServiceMappingRequest>,
    ) -> Result<Response<ServiceMappingResponse>, Status> {
        self.handle(request).await
    }
}

#[tonic::async_trait]
impl networking::ServiceNameMappingService for Ingest {
    async fn register_service_app_mapping(
        &self,
        request: Request<ServiceMappingRequest>,
    ) -> Result<Response<ServiceMappingResponse>, Status> {
        self.handle(request).await
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_failed_commit_keeps_its_source_and_the_caller_sees_it() {
        let sqlite = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
            Some("disk I/O error".into()),
        );
        let err = StoreError::CommitFailed(Arc::new(sqlite));
        let source = err.source().expect("a source");
        assert!(source.downcast_ref::<Arc<rusqlite::Error>>().is_some());
        let (answer, label) = store_refusal(err);
        let status = answer.expect_err("a refusal");
        assert_eq!(label, "unavailable");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status
                .message()
                .starts_with("registration not stored: commit failed: disk I/O error"),
            "{}",
            status.message()
        );
    }
}
