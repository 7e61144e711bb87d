//! The transport's ceiling: a bare tonic server with the same `registerServiceAppMapping`
//! signature that answers `success` without doing anything.

use std::net::SocketAddr;

use dubbo_cp::pb::snp::service_name_mapping_service_server::{
    ServiceNameMappingService, ServiceNameMappingServiceServer,
};
use dubbo_cp::pb::snp::{ServiceMappingRequest, ServiceMappingResponse};
use tokio_stream::wrappers::TcpListenerStream;
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ServiceNameMappingServiceServer::new(Bare))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Ok(addr)
}
