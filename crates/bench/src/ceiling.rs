//! The transport's ceiling: a bare tonic server with the same `registerServiceAppMapping`
//! signature that answers `success` without doing anything.

use std::net::SocketAddr;

use dubbo_cp::pb::snp::service_name_mapping_service_server::{
    ServiceNameMappingService, ServiceNameMappingServiceServer,
};
use dubbo_cp::pb::snp::{ServiceMappingRequest, ServiceMappingResponse};
use tonic::{Request, Response, Status};

struct Bare;

#[tonic::async_trait]
impl ServiceNameMappingService for Bare {
    async fn register_service_app_mapping(
        &self,
        _request: Request<ServiceMappingRequest>,
    ) -> Result<Response<ServiceMappingResponse>, Status> {
        Ok(Response::new(ServiceMappingResponse {
            success: true,
            message: "success".into(),
        }))
    }
}

/// Starts the bare server on loopback; it runs until the process ends.
pub async fn start() -> anyhow::Result<SocketAddr> {
    start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
}

/// Starts the bare server on `addr`; it runs until the process ends.
pub async fn start_on(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    // The same TCP settings as dubbo-cp's own listeners, so the comparison is fair.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ServiceNameMappingServiceServer::new(Bare))
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}
