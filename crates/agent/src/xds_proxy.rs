//! `dubbo-cp agent --xds-proxy`: the xDS half of istio-agent. Workloads whose gRPC cannot
//! authenticate to the control plane (grpc-js-xds reads only `insecure` channel credentials from
//! its bootstrap, and cannot send call credentials) reach it through the agent: a plaintext ADS
//! port on loopback, every stream forwarded to the control plane's TLS port with the workload's
//! own certificate (read from the agent's directory at each stream, so a renewed one is used by
//! the next), which the control plane knows by its SPIFFE ID.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Request, Response, Status, Streaming};

use dubbo_cp_kit::workload::{CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE};

/// How long opening the upstream connection may take before the client is told to retry.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Keepalive pings on the upstream connection, and how long one may go unanswered.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(20);

/// The largest xDS response forwarded (a client with thousands of clusters gets megabytes).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Where the proxy forwards to, with which certificate.
#[derive(Clone)]
pub struct Proxy {
    /// `host:port` of the control plane's TLS port; `host` is also the name checked in its
    /// certificate.
    upstream: String,
    certificates: PathBuf,
    stats: ProxyStats,
}

#[derive(Clone, Default)]
pub struct ProxyStats {
    streams: Gauge,
    refused: Counter,
}

impl ProxyStats {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "agent_xds_streams",
            "xDS streams forwarded to the control plane now",
            self.streams.clone(),
        );
        registry.register(
            "agent_xds_upstream_failures",
            "xDS streams the agent could not open to the control plane (no certificate yet, TLS or connection failure)",
            self.refused.clone(),
        );
    }
}

/// Decrements the stream gauge when the forwarded stream ends.
struct Open<S> {
    inner: S,
    streams: Gauge,
}

impl<S> Drop for Open<S> {
    fn drop(&mut self) {
        self.streams.dec();
    }
}

impl<S: Stream + Unpin> Stream for Open<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl Proxy {
    /// `upstream` as `host:port`, or `https://host:port` (the CA address the webhook injects may
    /// carry the scheme); plaintext is refused: the stream carries the workload's identity.
    pub fn new(upstream: &str, certificates: PathBuf, stats: ProxyStats) -> anyhow::Result<Proxy> {
        anyhow::ensure!(
            !upstream.starts_with("http://"),
            "--xds-address {upstream}: the control plane's TLS port, not a plaintext one"
        );
        let upstream = upstream
            .trim_start_matches("https://")
            .trim_end_matches('/');
        anyhow::ensure!(
            upstream
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()),
            "--xds-address {upstream}: must be host:port"
        );
        Ok(Proxy {
            upstream: upstream.to_owned(),
            certificates,
            stats,
        })
    }

    /// A TLS channel to the control plane with the certificate on disk now.
    async fn channel(&self) -> Result<Channel, Status> {
        let read = |name: &str| {
            let path = self.certificates.join(name);
            std::fs::read(&path).map_err(|err| {
                Status::unavailable(format!(
                    "the agent has no certificate yet ({}: {err})",
                    path.display()
                ))
            })
        };
        // The agent renames the key, then the chain: a chain read again unchanged after the key
        // was read belongs to that key (else a renewal fell in between: read them again).
        let (mut chain, mut key) = (read(CERT_CHAIN_FILE)?, read(KEY_FILE)?);
        for _ in 0..3 {
            let again = read(CERT_CHAIN_FILE)?;
            if again == chain {
                break;
            }
            (chain, key) = (again, read(KEY_FILE)?);
        }
        let roots = read(ROOT_CERT_FILE)?;
        let host = self
            .upstream
            .rsplit_once(':')
            .map_or(self.upstream.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(roots))
            .identity(Identity::from_pem(chain, key))
            .domain_name(host);
        let endpoint = Channel::from_shared(format!("https://{}", self.upstream))
            .map_err(|err| Status::internal(format!("--xds-address {}: {err}", self.upstream)))?
            .tls_config(tls)
            .map_err(|err| Status::unavailable(format!("TLS to {}: {err}", self.upstream)))?
            .connect_timeout(CONNECT_TIMEOUT)
            // A control plane gone without a word (a node lost) is noticed in seconds, not when
            // TCP gives up: the client behind the proxy would keep stale configuration.
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true)
            .tcp_keepalive(Some(KEEPALIVE));
        endpoint.connect().await.map_err(|err| {
            Status::unavailable(format!(
                "cannot reach the control plane at {}: {err}",
                self.upstream
            ))
        })
    }

    async fn client(&self) -> Result<AggregatedDiscoveryServiceClient<Channel>, Status> {
        match self.channel().await {
            Ok(channel) => Ok(AggregatedDiscoveryServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)),
            Err(status) => {
                self.stats.refused.inc();
                tracing::warn!(upstream = %self.upstream, error = %status.message(), "xDS stream not forwarded");
                Err(status)
            }
        }
    }

    /// The control plane turned the stream away (the certificate refused, too many streams):
    /// counted and said, then passed on to the client.
    fn refused(&self, status: Status) -> Status {
        self.stats.refused.inc();
        tracing::warn!(upstream = %self.upstream, code = ?status.code(), error = %status.message(), "the control plane refused a forwarded xDS stream");
        status
    }

    fn opened<S>(&self, inner: S) -> Open<S> {
        self.stats.streams.inc();
        Open {
            inner,
            streams: self.stats.streams.clone(),
        }
    }
}

/// The client's requests until it ends its stream or breaks it.
fn requests<T: Send + 'static>(incoming: Streaming<T>) -> impl Stream<Item = T> + Send + 'static {
    incoming.map_while(Result::ok)
}

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Proxy {
    type StreamAggregatedResourcesStream = Answers<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Answers<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut client = self.client().await?;
        let answers = client
            .stream_aggregated_resources(requests(request.into_inner()))
            .await
            .map_err(|status| self.refused(status))?
            .into_inner();
        Ok(Response::new(Box::pin(self.opened(answers))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut client = self.client().await?;
        let answers = client
            .delta_aggregated_resources(requests(request.into_inner()))
            .await
            .map_err(|status| self.refused(status))?
            .into_inner();
        Ok(Response::new(Box::pin(self.opened(answers))))
    }
}

/// Serves the proxy on `listen` until the process ends.
pub async fn serve(listen: SocketAddr, proxy: Proxy) -> anyhow::Result<()> {
    // Whoever reaches it speaks as this workload: only the pod's own containers may.
    anyhow::ensure!(
        listen.ip().is_loopback(),
        "--xds-proxy {listen}: must be a loopback address (127.0.0.1, ::1): every stream on it \
         reaches the control plane as this workload"
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|err| anyhow::anyhow!("--xds-proxy {listen}: cannot listen: {err}"))?;
    tracing::info!(address = %listener.local_addr()?, upstream = %proxy.upstream, "xDS proxy listening");
    tonic::transport::Server::builder()
        .add_service(
            AggregatedDiscoveryServiceServer::new(proxy)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await?;
    Ok(())
}
