//! How the gRPC sub-commands (`register`, `watch`, `get mappings`) reach the control plane:
//! `host:port`, `http://` or `https://` (TLS, trusting `--ca-file`), with the caller's token
//! sent as SDKs send it (`authorization: Bearer`, optional `authorization-type`). Errors name
//! what was asked, where, and what to try, including the likely mix-up of the gRPC and admin
//! ports.

use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Where the gRPC sub-commands find the control plane, and as whom.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArg {
    /// The control plane's gRPC address: `host:port` (plain), `http://host:port` or
    /// `https://host:port` (the TLS port, 30062 by default).
    #[arg(
        long = "server",
        env = "DUBBO_CP_SERVER",
        default_value = "127.0.0.1:30060"
    )]
    pub address: String,
    /// The bearer token (`--token`, `DUBBO_CP_TOKEN`): taken from [`TokenArg`], or from the
    /// admin arguments where a command has both.
    #[arg(skip)]
    pub token: Option<String>,
    /// `authorization-type` sent with the token: `kubernetes` (the server's default),
    /// `dubbo-ca-token` or `dubbo-jwt`.
    #[arg(long, env = "DUBBO_CP_TOKEN_TYPE")]
    pub token_type: Option<String>,
    /// PEM roots to trust for `https://` (the control plane's CA: `dubbo-cp ca root`).
    #[arg(long, env = "DUBBO_CP_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// The name to check in the server's certificate, when the address is not one of its names
    /// (e.g. `localhost` when connecting to 127.0.0.1).
    #[arg(long, env = "DUBBO_CP_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// How long a call may wait for the server's (first) answer: a port that accepts and never
    /// answers would otherwise hold the command forever.
    #[arg(skip = REPLY_TIMEOUT)]
    pub timeout: Duration,
}

/// How long [`ServerArg::within`] waits.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The caller's token, for commands that talk only gRPC.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArg {
    /// Bearer token sent with every call (needed when the server authenticates callers).
    #[arg(long, env = "DUBBO_CP_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// What follows every connection failure to the gRPC port.
const PORT_HINT: &str = "is it the control plane's gRPC port? (--server, default 127.0.0.1:30060 \
     plain, or https://host:30062 with --ca-file for the TLS port; the admin port 30070 speaks \
     HTTP/1.1 and is --admin)";

/// What follows a call that died in transport without TLS: the TLS port answers plain text by
/// closing the connection, which tonic reports as cancelled or as an HTTP/2 protocol error.
const PLAIN_TO_TLS_HINT: &str = "if that is the TLS port (30062 by default), use \
     https://host:port with --ca-file";

/// `host:port`, `http://…` or `https://…` as a URI tonic takes, and whether it is TLS.
pub fn normalize(address: &str) -> anyhow::Result<(String, bool)> {
    let address = address.trim().trim_end_matches('/');
    if let Some(rest) = address.strip_prefix("https://") {
        return Ok((format!("https://{rest}"), true));
    }
    if address.starts_with("http://") {
        return Ok((address.to_owned(), false));
    }
    anyhow::ensure!(
        !address.contains("://"),
        "--server {address:?}: use host:port, http://host:port or https://host:port"
    );
    anyhow::ensure!(
        !address.is_empty(),
        "--server is empty: use host:port, e.g. 127.0.0.1:30060"
    );
    Ok((format!("http://{address}"), false))
}

impl ServerArg {
    /// A connected channel, or an error that says where and what to try.
    pub async fn connect(&self) -> anyhow::Result<Channel> {
        let (uri, tls) = normalize(&self.address)?;
        let mut endpoint = Endpoint::from_shared(uri.clone())
            .with_context(|| format!("--server {:?} is not an address", self.address))?
            .connect_timeout(Duration::from_secs(5));
        if tls {
            let ca_file = self.ca_file.as_ref().with_context(|| {
                format!(
                    "{uri} is TLS: give the roots to trust with --ca-file \
                     (the control plane's CA: `dubbo-cp ca root > ca.pem`)"
                )
            })?;
            let pem = std::fs::read(ca_file)
                .with_context(|| format!("cannot read --ca-file {}", ca_file.display()))?;
            // A file without a certificate trusts nothing: every handshake would fail as
            // "UnknownIssuer", which does not say the file is the fault.
            let certificates = pem::parse_many(&pem)
                .map(|blocks| blocks.iter().filter(|b| b.tag() == "CERTIFICATE").count())
                .unwrap_or(0);
            anyhow::ensure!(
                certificates > 0,
                "--ca-file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the \
                 control plane's root bundle, `dubbo-cp ca root > ca.pem`",
                ca_file.display()
            );
            let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            if let Some(name) = &self.tls_server_name {
                config = config.domain_name(name.clone());
            }
            endpoint = endpoint
                .tls_config(config)
                .with_context(|| format!("cannot set up TLS for {uri}"))?;
        }
        endpoint.connect().await.map_err(|err| {
            let cause = chain(&err);
            anyhow::anyhow!(
                "cannot connect to {uri}: {cause}; {}",
                self.transport_hint(&cause, tls)
            )
        })
    }

    /// What to try after a transport failure whose text is `cause`.
    fn transport_hint(&self, cause: &str, tls: bool) -> String {
        let ca_file = self
            .ca_file
            .as_ref()
            .map_or_else(String::new, |f| f.display().to_string());
        if cause.contains("UnknownIssuer") || cause.contains("unknown issuer") {
            format!(
                "the server's certificate is not signed by a root in --ca-file {ca_file}: give \
                 the control plane's root bundle (`dubbo-cp ca root > ca.pem`)"
            )
        } else if cause.contains("not valid for name") || cause.contains("NotValidForName") {
            "the address is not one of the names in the server's certificate: pass one of them \
             with --tls-server-name (the control plane's own certificate names localhost, not \
             127.0.0.1)"
                .to_owned()
        } else if tls && (cause.contains("InvalidContentType") || cause.contains("corrupt message"))
        {
            format!(
                "that port does not speak TLS: for the plain gRPC port use host:port or \
                 http://; {PORT_HINT}"
            )
        } else if !tls && !cause.contains("refused") {
            // Something listens but hung up: plain text to the TLS port, the likely mix-up.
            format!("{PLAIN_TO_TLS_HINT}; {PORT_HINT}")
        } else {
            PORT_HINT.to_owned()
        }
    }

    /// `call` (asking for `what`) within the timeout, or an error naming it, where and the fix.
    pub async fn within<T>(
        &self,
        what: &str,
        call: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{what} at {}: no answer within {}; {PORT_HINT}",
                    self.address,
                    humantime::format_duration(self.timeout)
                )
            })?
    }

    /// `message` with the token's metadata, as an SDK sends it.
    pub fn request<T>(&self, message: T) -> anyhow::Result<tonic::Request<T>> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .context("--token holds characters a header cannot carry")?;
            request.metadata_mut().insert("authorization", value);
        }
        if let Some(kind) = &self.token_type {
            let value = kind
                .parse()
                .context("--token-type holds characters a header cannot carry")?;
            request.metadata_mut().insert("authorization-type", value);
        }
        Ok(request)
    }

    /// A failed call of `what` as an error that names it, the server, and what to try.
    pub fn failed(&self, what: &str, status: &tonic::Status) -> anyhow::Error {
        // An HTTP server that is not gRPC (the admin port) answers without a gRPC status.
        let not_grpc = status.message().contains("grpc-status header missing");
        let hint = match status.code() {
            _ if not_grpc => format!("; that is an HTTP server, not gRPC: {PORT_HINT}"),
            tonic::Code::Unauthenticated => {
                " (send a token with --token or DUBBO_CP_TOKEN; --token-type for a dubbo-ca-token or dubbo-jwt)"
                    .to_owned()
            }
            tonic::Code::PermissionDenied => " (the token's identity may not do this here)".to_owned(),
            // Transport trouble: a TLS port asked in plain text, the admin port, a proxy.
            tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Cancelled => {
                let plain = normalize(&self.address).is_ok_and(|(_, tls)| !tls);
                if plain {
                    format!("; {PLAIN_TO_TLS_HINT}; {PORT_HINT}")
                } else {
                    format!("; {PORT_HINT}")
                }
            }
            _ => String::new(),
        };
        let message = if status.message().is_empty() {
            "no message".to_owned()
        } else {
            status.message().to_owned()
        };
        anyhow::anyhow!(
            "{what} at {}: {:?}: {message}{hint}",
            self.address,
            status.code()
        )
    }
}

/// An error and its sources as one line (the kit's, shared with the agent).
pub use dubbo_cp_kit::error_chain as chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_every_usual_form() {
        assert_eq!(
            normalize("localhost:30060").unwrap(),
            ("http://localhost:30060".to_owned(), false)
        );
        assert_eq!(
            normalize("http://127.0.0.1:30060/").unwrap(),
            ("http://127.0.0.1:30060".to_owned(), false)
        );
        assert_eq!(
            normalize("https://dubbo-cp.dubbo-system.svc:30062").unwrap(),
            ("https://dubbo-cp.dubbo-system.svc:30062".to_owned(), true)
        );
        let refused = normalize("grpc://x:1").unwrap_err().to_string();
        assert!(refused.contains("use host:port"), "{refused}");
    }
}
