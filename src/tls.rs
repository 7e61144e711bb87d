//! The TLS gRPC port (30062): our own acceptor in front of tonic, because its certificate and
//! the roots client certificates are checked against change while it serves. With no
//! `--tls-cert` the certificate is issued by our CA for `localhost` and the Service's names and
//! renewed at two thirds of its life, or at once when the roots rotate; open connections keep
//! the certificate they started with, new ones get the new one. Client certificates issued by
//! the CA (or by `--tls-client-ca`) are accepted and their SPIFFE ID becomes the identity.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;

use crate::ca::{Authority, Bundle};

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; connections beyond it are closed at once (a flood of
/// silent clients must not stop the accept loop).
const MAX_HANDSHAKES: usize = 1024;
/// Pause after a failed accept (e.g. out of file descriptors), instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Shortest time between two renewals, whatever the validity.
const MIN_RENEWAL: Duration = Duration::from_secs(1);

/// Where the port's certificate comes from.
#[derive(Clone)]
pub enum ServingIdentity {
    /// `--tls-cert`/`--tls-key`: used as given.
    Files { cert: PathBuf, key: PathBuf },
    /// Issued by our CA for these DNS names.
    Ca { names: Vec<String> },
}

#[derive(Default)]
pub struct TlsStats {
    handshake_failures: Counter,
    renewals: Counter,
}

impl TlsStats {
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes on the TLS gRPC port that failed or timed out",
            self.handshake_failures.clone(),
        );
        registry.register(
            "tls_serving_certificate_renewals",
            "Serving certificates issued by the CA for the TLS gRPC port",
            self.renewals.clone(),
        );
    }
}

/// The TLS settings as they change: built once from files, or re-issued by the CA. `None`
/// while the CA has no roots yet (Kubernetes mode, first start during an API outage):
/// connections are then closed before the handshake.
pub struct TlsConfigs {
    pub current: watch::Receiver<Option<Arc<ServerConfig>>>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config: this certificate chain, and client certificates optional but verified
/// against `client_roots` when given.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: &[CertificateDer<'static>],
    alpn: &[&[u8]],
) -> anyhow::Result<ServerConfig> {
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let mut config = if client_roots.is_empty() {
        builder.with_no_client_auth().with_single_cert(chain, key)?
    } else {
        let mut roots = RootCertStore::empty();
        for root in client_roots {
            roots.add(root.clone())?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()?;
        builder
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)?
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn read_certificates(path: &PathBuf) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?
        .collect();
    let certs = certs.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", path.display());
    Ok(certs)
}

/// The roots client certificates are verified against: the CA's and the configured file's.
fn client_roots(
    bundle: Option<&Bundle>,
    extra: &[CertificateDer<'static>],
) -> Vec<CertificateDer<'static>> {
    bundle
        .into_iter()
        .flat_map(|b| b.trusted())
        .map(|root| CertificateDer::from(root.der.clone()))
        .chain(extra.iter().cloned())
        .collect()
}

impl TlsConfigs {
    /// The first config, and the task that keeps it current (renewals, rotated roots).
    pub fn start(
        identity: ServingIdentity,
        client_ca: Option<PathBuf>,
        authority: Option<Authority>,
        stats: Arc<TlsStats>,
        alpn: &'static [&'static [u8]],
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<(TlsConfigs, impl std::future::Future<Output = ()> + use<>)> {
        let extra = match &client_ca {
            Some(path) => read_certificates(path)?,
            None => Vec::new(),
        };
        let files = match &identity {
            ServingIdentity::Files { cert, key } => {
                let chain = read_certificates(cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| anyhow::anyhow!("cannot read the key {}: {e}", key.display()))?;
                Some((chain, key))
            }
            ServingIdentity::Ca { .. } => None,
        };
        let build = {
            let identity = identity.clone();
            let authority = authority.clone();
            let stats = stats.clone();
            move || -> anyhow::Result<Option<(ServerConfig, Option<SystemTime>)>> {
                let bundle = authority.as_ref().and_then(Authority::current);
                let roots = client_roots(bundle.as_deref(), &extra);
                match (&identity, &files, bundle) {
                    (ServingIdentity::Files { .. }, Some((chain, key)), _) => Ok(Some((
                        server_config(chain.clone(), key.clone_key(), &roots, alpn)?,
                        None,
                    ))),
                    (ServingIdentity::Ca { names }, _, Some(bundle)) => {
                        let validity = authority
                            .as_ref()
                            .map(|a| a.settings.cert_validity)
                            .unwrap_or(Duration::from_secs(3600));
                        let now = SystemTime::now();
                        let serving = bundle.issue_serving(names, validity, now)?;
                        stats.renewals.inc();
                        let life = serving.not_after.duration_since(now).unwrap_or_default();
                        let renew_at = now + (life * 2 / 3).max(MIN_RENEWAL);
                        let config = server_config(
                            serving
                                .chain
                                .into_iter()
                                .map(CertificateDer::from)
                                .collect(),
                            PrivateKeyDer::try_from(serving.key_der)
                                .map_err(|e| anyhow::anyhow!("serving key: {e}"))?,
                            &roots,
                            alpn,
                        )?;
                        Ok(Some((config, Some(renew_at))))
                    }
                    // The CA's roots are not loaded yet; their arrival rebuilds.
                    (ServingIdentity::Ca { .. }, _, None) if authority.is_some() => Ok(None),
                    _ => anyhow::bail!("the TLS port needs --tls-cert and --tls-key, or the CA"),
                }
            }
        };
        let first = build()?;
        let mut renew_at = first.as_ref().and_then(|(_, at)| *at);
        let (tx, rx) = watch::channel(first.map(|(config, _)| Arc::new(config)));
        let mut roots_changed = authority.as_ref().map(Authority::subscribe);
        let mut shutdown = shutdown;
        let maintain = async move {
            loop {
                let wait = renew_at
                    .map(|at| at.duration_since(SystemTime::now()).unwrap_or_default())
                    .unwrap_or(Duration::MAX);
                tokio::select! {
                    _ = crate::shutdown::signalled(&mut shutdown) => return,
                    () = tokio::time::sleep(wait.min(Duration::from_secs(3600))), if renew_at.is_some() => {}
                    open = changed(&mut roots_changed) => if !open { roots_changed = None; continue },
                }
                match build() {
                    Ok(Some((config, next))) => {
                        tx.send_replace(Some(Arc::new(config)));
                        renew_at = next;
                    }
                    Ok(None) => renew_at = None,
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot renew the TLS port's certificate; retrying");
                        renew_at = Some(SystemTime::now() + Duration::from_secs(5));
                    }
                }
            }
        };
        Ok((TlsConfigs { current: rx }, maintain))
    }
}

async fn changed(roots: &mut Option<watch::Receiver<Option<Arc<Bundle>>>>) -> bool {
    match roots {
        Some(roots) => roots.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Accepted TLS connections for tonic: each handshake runs in its own task (bounded, timed
/// out), with the config current when the client connected.
pub fn incoming(
    listener: TcpListener,
    configs: watch::Receiver<Option<Arc<ServerConfig>>>,
    keepalive: Duration,
    stats: Arc<TlsStats>,
) -> ReceiverStream<Result<TlsStream<TcpStream>, io::Error>> {
    let (tx, rx) = mpsc::channel(128);
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        let mut tcp = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(keepalive));
        loop {
            let accepted = tokio::select! {
                // tonic dropped the stream (shutdown): stop accepting.
                () = tx.closed() => return,
                accepted = tcp.next() => accepted,
            };
            let stream = match accepted {
                None => return,
                Some(Ok(stream)) => stream,
                Some(Err(err)) => {
                    tracing::debug!(error = %err, "TLS port: accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                stats.handshake_failures.inc();
                tracing::debug!("TLS port: too many handshakes in progress; connection closed");
                continue;
            };
            let Some(config) = configs.borrow().clone() else {
                stats.handshake_failures.inc();
                tracing::debug!(
                    "TLS port: no certificate yet (the CA has no roots); connection closed"
                );
                continue;
            };
            let acceptor = TlsAcceptor::from(config);
            let sender = tx.clone();
            let stats = stats.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = sender.send(Ok(tls)).await;
                    }
                    Ok(Err(err)) => {
                        stats.handshake_failures.inc();
                        tracing::debug!(error = %err, "TLS handshake failed");
                    }
                    Err(_) => {
                        stats.handshake_failures.inc();
                        tracing::debug!("TLS handshake timed out");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The TLS connections of [`incoming`] as an axum listener (the webhook's HTTPS server).
pub struct TlsListener {
    pub incoming: ReceiverStream<Result<TlsStream<TcpStream>, io::Error>>,
    pub addr: std::net::SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(io)) => {
                    let peer = io.get_ref().0.peer_addr().unwrap_or(self.addr);
                    return (io, peer);
                }
                Some(Err(_)) => continue,
                // The acceptor stopped (shutdown): the server's graceful shutdown ends it.
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
