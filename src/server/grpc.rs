//! The gRPC ports: the services, one tonic router over any listener (plain or TLS), the ports
//! that serve it, and the shutdown wait.

use super::*;
use crate::coalesce::Coalesced;
use tokio_stream::StreamExt as _;

/// The registration service, the discovery stream, health and the CA service, with the
/// discovery stream's metrics registered.
pub(super) async fn grpc_services(
    config: &Config,
    source: &Source,
    security: &Security,
    wiring: &mut Wiring,
) -> (Services, Edges) {
    let Security { authority, policy } = security;
    let registry = &mut wiring.registry;
    let ingest = Ingest::new(
        source.durable.clone(),
        &config.ingest,
        policy.clone(),
        wiring.metrics.clone(),
    );
    let index = &source.index;
    let encoder = Arc::new(crate::dds::encode::Encoder::default());
    encoder.register_metrics(registry);
    let rules = RuleService::new(
        index.clone(),
        encoder.clone(),
        config.dds,
        policy.clone(),
        wiring.metrics.clone(),
        wiring.shutdown_rx.clone(),
    );
    let dds_stats = rules.stats();
    dds_stats.register_metrics(registry);
    let clients = rules.clients();
    clients.register_metrics(index.clone(), registry);
    registry.register_collector(Box::new(crate::digest::DigestMetric(
        index.clone(),
        encoder.clone(),
    )));
    let health = tonic_health::server::HealthReporter::new();
    let health_service = tonic_health::pb::health_server::HealthServer::new(
        tonic_health::server::HealthService::from_health_reporter(health.clone()),
    );
    health.set_serving::<RegistrationServer>().await;
    let ca_service = authority.clone().map(|authority| {
        CaService::new(
            authority,
            policy.clone(),
            IssueLimits {
                per_second: config.ca.issues_per_second,
                burst: config.ca.issue_burst,
                concurrency: std::thread::available_parallelism()
                    .map(|n| n.get() / 2)
                    .unwrap_or(1),
            },
        )
    });
    let ads = config
        .xds
        .enabled
        .then(|| xds_service(config, index, policy, wiring));
    let edges = Edges {
        encoder,
        dds_stats,
        clients,
        xds_clients: ads.as_ref().map(crate::xds::server::Ads::clients),
        xds_snapshots: ads.as_ref().map(crate::xds::server::Ads::snapshots),
        health,
    };
    ((ingest, rules, health_service, ca_service, ads), edges)
}

/// The xDS edge: the task that builds its snapshots from the index, and the ADS service over
/// them, authenticated like the other gRPC services, with its metrics registered.
fn xds_service(
    config: &Config,
    index: &Arc<Index>,
    policy: &Policy,
    wiring: &mut Wiring,
) -> crate::xds::server::Ads {
    use crate::xds::{server::Ads, snapshot::Snapshot, source};
    let (snapshots, rx) = watch::channel(Arc::new(Snapshot::default()));
    let ads = Ads::new(rx, config.xds.max_streams)
        .with_authentication(Arc::new(PolicyAuthentication(policy.clone())))
        .with_shutdown(wiring.shutdown_rx.clone());
    let index = index.clone();
    let window = config.xds.debounce;
    let encodes = ads.stats().encodes.clone();
    let settings = crate::xds::security::Settings {
        // What the CA puts in the certificates it issues (an empty setting accepts any domain
        // on the TLS port, but issues in the default one).
        trust_domain: Some(config.tls.trust_domain.as_str())
            .filter(|domain| !domain.is_empty())
            .unwrap_or(crate::auth::DEFAULT_TRUST_DOMAIN)
            .to_owned(),
        root_namespace: config.rules.root_namespace.clone(),
    };
    // Ends with the server: operators' views (the clients' "behind", the split) keep a
    // receiver of the snapshots for the server's life, so the last receiver going is not a
    // shutdown signal.
    let mut shutdown = wiring.shutdown_rx.clone();
    wiring.tasks.spawn("xDS snapshots", async move {
        tokio::select! {
            () = source::run(index, snapshots, window, encodes, settings) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        Ok(())
    });
    ads.stats()
        .register_metrics(&ads.clients(), &mut wiring.registry);
    ads
}

/// The xDS edge's authentication: the same policy as every gRPC port (service-account token,
/// static token, or a client certificate from our CA on the TLS port).
struct PolicyAuthentication(Policy);

#[tonic::async_trait]
impl crate::xds::server::Authenticate for PolicyAuthentication {
    async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        peer_certificates: Option<Vec<Vec<u8>>>,
    ) -> Result<Option<String>, tonic::Status> {
        match self
            .0
            .authenticate(metadata, peer_certificates.as_deref())
            .await
        {
            Ok(identity) => Ok(identity.map(|identity| identity.namespace)),
            Err(refusal) => Err(refusal.into_status()),
        }
    }
}

/// Serves `services` on the gRPC port and the TLS port (if any) and starts the webhook (if
/// any); returns the admin port's listener, which is served last.
pub(super) fn serve_grpc(
    config: &Config,
    listeners: Listeners,
    services: Services,
    security: &Security,
    kube_client: Option<&kube::Client>,
    wiring: &mut Wiring,
) -> anyhow::Result<TcpListener> {
    let Listeners {
        grpc,
        tls,
        admin,
        webhook,
        xds,
    } = listeners;
    let Wiring {
        tasks,
        registry,
        metrics,
        shutdown_rx,
        ..
    } = wiring;
    let authority = &security.authority;
    let tls_stats = Arc::new(TlsStats::default());
    tls_stats.register_metrics(registry);
    let tls_port = tls.as_ref().map_or(Ok(config.tls.addr.port()), |(l, _)| {
        l.local_addr().map(|addr| addr.port())
    })?;
    if let (Some(listener), Some(authority), Some(client)) = (webhook, authority, kube_client) {
        start_webhook(
            config,
            (listener, tls_port),
            authority,
            client,
            tls_stats.clone(),
            registry,
            tasks,
        )?;
    }
    if let Some((listener, identity)) = tls {
        let (configs, maintain) = TlsConfigs::start(
            identity,
            config.tls.client_ca_file.clone(),
            authority.clone(),
            tls_stats.clone(),
            GRPC_ALPN,
            shutdown_rx.clone(),
        )?;
        tasks.spawn("TLS certificate", async move {
            maintain.await;
            Ok(())
        });
        let incoming = crate::tls::incoming(listener, configs.current, TCP_KEEPALIVE, tls_stats);
        let serve = grpc_serve(
            config,
            metrics.clone(),
            services.clone(),
            incoming,
            shutdown_rx.clone(),
        )?;
        tasks.spawn("TLS gRPC server", async move {
            serve.await.context("TLS gRPC server failed")
        });
    }
    if let (Some(listener), Some(ads)) = (xds, services.4.clone()) {
        let serve = xds_serve(config, metrics.clone(), ads, listener, shutdown_rx.clone());
        tasks.spawn("xDS server", async move {
            serve.await.context("xDS server failed")
        });
    }
    let serve = grpc_serve(
        config,
        metrics.clone(),
        services,
        // Our own listener, so NODELAY and keepalive must be set on the incoming stream.
        TcpIncoming::from(grpc)
            .with_nodelay(Some(true))
            .with_keepalive(Some(TCP_KEEPALIVE)),
        shutdown_rx.clone(),
    )?;
    tasks.spawn("gRPC server", async move {
        serve.await.context("gRPC server failed")
    });
    Ok(admin)
}

/// The gRPC server on `incoming` (plain TCP, or TLS connections), until shutdown: every
/// service and the connection settings.
pub(super) fn grpc_serve<I, IO>(
    config: &Config,
    metrics: Arc<Metrics>,
    (ingest, rules, health, ca, ads): Services,
    incoming: I,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<
    impl std::future::Future<Output = Result<(), tonic::transport::Error>> + use<I, IO>,
>
where
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
        .add_optional_service(ads.map(xds_server))
        .serve_with_incoming_shutdown(incoming, wait_for_shutdown(shutdown)))
}

/// The ADS service as served: requests as large as any gRPC port takes (a subscription of
/// thousands of names), responses as large as a big mesh's clusters.
fn xds_server(ads: crate::xds::server::Ads) -> crate::xds::service::AdsService {
    crate::xds::service::AdsService::new(ads, MAX_DECODING_MESSAGE_BYTES)
}

/// The xDS port (plain gRPC, Istio's 15010): ADS only, with the gRPC ports' connection settings.
fn xds_serve(
    config: &Config,
    metrics: Arc<Metrics>,
    ads: crate::xds::server::Ads,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = Result<(), tonic::transport::Error>> + use<> {
    let grpc = &config.grpc;
    tonic::transport::Server::builder()
        .layer(metrics::CountOversize::layer(metrics))
        .http2_keepalive_interval(Some(grpc.keepalive_interval))
        .http2_keepalive_timeout(Some(grpc.keepalive_timeout))
        // Clients reconnect (keeping their configuration meanwhile): they rebalance across
        // replicas and are authenticated again, so a token outlives its pod by this at most.
        .max_connection_age(grpc.max_connection_age)
        .max_connection_age_grace(grpc.max_connection_age_grace)
        .max_concurrent_streams(grpc.max_concurrent_streams)
        .add_service(xds_server(ads))
        .serve_with_incoming_shutdown(
            // A push writes once per connection, not once per stream.
            TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(TCP_KEEPALIVE))
                .map(|accepted| accepted.map(Coalesced::new)),
            wait_for_shutdown(shutdown),
        )
}

pub(super) async fn wait_for_shutdown(mut rx: watch::Receiver<bool>) {
    signalled(&mut rx).await;
}
