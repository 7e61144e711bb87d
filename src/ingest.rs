//! The registration gRPC service, at both paths SDKs call (wire.md §1): validate, hand to the
//! store, answer once durable. Errors that are the caller's fault get a gRPC status naming the
//! field; store trouble is `UNAVAILABLE` or `RESOURCE_EXHAUSTED`, which SDKs retry.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::mapping::validate_registration;
use crate::metrics::Metrics;
use crate::pb::dubbo::networking::v1alpha1::service_name_mapping_service_server as networking;
use crate::pb::snp::service_name_mapping_service_server as snp;
use crate::pb::snp::{ServiceMappingRequest, ServiceMappingResponse};
use crate::store::{EmbeddedStore, RegisterOutcome, StoreError};

/// The message of a registration that needed no write.
const ALREADY_REGISTERED: &str = "already registered";

#[derive(Clone)]
pub struct Ingest {
    store: EmbeddedStore,
    /// How long a caller waits for its commit before it is told to retry.
    commit_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Ingest {
    pub fn new(store: EmbeddedStore, commit_timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            commit_timeout,
            metrics,
        }
    }

    /// Registers and counts the result.
    async fn register(
        &self,
        request: ServiceMappingRequest,
    ) -> Result<ServiceMappingResponse, Status> {
        let result = self.register_uncounted(request).await;
        let label = match &result {
            Ok(response) if response.message == ALREADY_REGISTERED => "already_registered",
            Ok(_) => "stored",
            Err(status) => match status.code() {
                tonic::Code::InvalidArgument => "invalid",
                tonic::Code::ResourceExhausted => "exhausted",
                _ => "unavailable",
            },
        };
        self.metrics.registration(label);
        result
    }

    async fn register_uncounted(
        &self,
        request: ServiceMappingRequest,
    ) -> Result<ServiceMappingResponse, Status> {
        let registration = validate_registration(
            &request.namespace,
            &request.application_name,
            &request.interface_names,
        )
        .map_err(|err| {
            tracing::debug!(error = %err, "registration rejected");
            Status::invalid_argument(err.to_string())
        })?;
        let namespace = registration.namespace.clone();
        let application = registration.application.clone();
        let interfaces = registration.interfaces.len();
        let outcome = tokio::time::timeout(self.commit_timeout, self.store.register(registration))
            .await
            .map_err(|_| {
                Status::unavailable(format!(
                    "registration not confirmed within {:?}; retry (registering again is safe)",
                    self.commit_timeout
                ))
            })?
            .map_err(store_status)?;
        let message = match outcome {
            RegisterOutcome::AlreadyStored => ALREADY_REGISTERED.to_owned(),
            RegisterOutcome::Stored { added } => {
                tracing::info!(%namespace, %application, interfaces, added, "registration stored");
                format!("registered {added} new interface mapping(s)")
            }
        };
        Ok(ServiceMappingResponse {
            success: true,
            message,
        })
    }
}

fn store_status(err: StoreError) -> Status {
    match err {
        StoreError::Busy(_) => Status::resource_exhausted(err.to_string()),
        StoreError::ShuttingDown => Status::unavailable(err.to_string()),
        other => {
            tracing::error!(error = %other, "registration not stored");
            Status::unavailable(format!("registration not stored: {other}"))
        }
    }
}

#[tonic::async_trait]
impl snp::ServiceNameMappingService for Ingest {
    async fn register_service_app_mapping(
        &self,
        request: Request<ServiceMappingRequest>,
    ) -> Result<Response<ServiceMappingResponse>, Status> {
        self.register(request.into_inner()).await.map(Response::new)
    }
}

#[tonic::async_trait]
impl networking::ServiceNameMappingService for Ingest {
    async fn register_service_app_mapping(
        &self,
        request: Request<ServiceMappingRequest>,
    ) -> Result<Response<ServiceMappingResponse>, Status> {
        self.register(request.into_inner()).await.map(Response::new)
    }
}
