//! The gRPC ports: one tonic router over any listener (plain or TLS), and the shutdown wait.

use super::*;

/// The gRPC server on `incoming` (plain TCP, or TLS connections), until shutdown: every
/// service and the connection settings.
pub(super) fn grpc_serve<H, I, IO>(
    config: &Config,
    metrics: Arc<Metrics>,
    (ingest, rules, health, ca): (
        Ingest,
        RuleService,
        tonic_health::pb::health_server::HealthServer<H>,
        Option<CaService>,
    ),
    incoming: I,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<
    impl std::future::Future<Output = Result<(), tonic::transport::Error>> + use<H, I, IO>,
>
where
    H: tonic_health::pb::health_server::Health,
    I: tokio_stream::Stream<Item = Result<IO, std::io::Error>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + Unpin + Send + 'static,
{
    // grpcurl and most tools speak v1alpha; newer clients v1.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::ingest::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(crate::dds::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(crate::ca::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let snp_service =
        pb::snp::service_name_mapping_service_server::ServiceNameMappingServiceServer::new(
            ingest.clone(),
        )
        .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES);
    let networking_service =
        pb::dubbo::networking::v1alpha1::service_name_mapping_service_server::ServiceNameMappingServiceServer::new(ingest)
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES);
    let authority = ca.clone().map(|ca| {
        pb::ca::authority_service_server::AuthorityServiceServer::new(ca)
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
    });
    let certificates = ca.map(|ca| {
        pb::ca::dubbo_certificate_service_server::DubboCertificateServiceServer::new(ca)
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
    });
    let grpc = &config.grpc;
    Ok(tonic::transport::Server::builder()
        .layer(metrics::CountOversize::layer(metrics))
        // Detect dead peers: long-lived streams would otherwise pin memory forever.
        .http2_keepalive_interval(Some(grpc.keepalive_interval))
        .http2_keepalive_timeout(Some(grpc.keepalive_timeout))
        // Old connections are closed (after a grace period) so clients rebalance across replicas.
        .max_connection_age(grpc.max_connection_age)
        .max_connection_age_grace(grpc.max_connection_age_grace)
        .max_concurrent_streams(grpc.max_concurrent_streams)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(snp_service)
        .add_service(networking_service)
        .add_service(rules)
        .add_optional_service(authority)
        .add_optional_service(certificates)
        .serve_with_incoming_shutdown(incoming, wait_for_shutdown(shutdown)))
}

pub(super) async fn wait_for_shutdown(mut rx: watch::Receiver<bool>) {
    signalled(&mut rx).await;
}
