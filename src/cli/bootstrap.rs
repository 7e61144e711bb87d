//! `dubbo-cp bootstrap`: a gRPC xDS bootstrap for a client in a namespace, ready for
//! `GRPC_XDS_BOOTSTRAP_CONFIG` (or a file named by `GRPC_XDS_BOOTSTRAP`).

use crate::xds::bootstrap::{Bootstrap, CALL_CREDS_ENV, Credentials};

#[derive(Debug, clap::Args)]
pub struct BootstrapArgs {
    /// The xDS server as clients reach it: `host:port` (the xDS port, or the TLS port with
    /// `--ca-file`).
    #[arg(long, env = "DUBBO_CP_XDS_SERVER", default_value = "127.0.0.1:15010")]
    pub xds_server: String,
    /// Deprecated spelling of `--xds-server` (everywhere else `--server` names the gRPC port);
    /// it wins, with a warning, so old scripts keep their address even where
    /// `DUBBO_CP_XDS_SERVER` is set.
    #[arg(long, hide = true)]
    pub server: Option<String>,
    /// The client's namespace: names resolve in it.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// The client's own application (the node's `cluster`).
    #[arg(short, long)]
    pub application: Option<String>,
    /// The node ID operators see in `dubbo-cp status` (default `<application>.<namespace>`).
    #[arg(long)]
    pub node_id: Option<String>,
    /// `region/zone/subzone` of the client.
    #[arg(long, default_value = "")]
    pub locality: String,
    /// TLS: the CA bundle that verifies the server (`dubbo-cp ca root` prints ours).
    #[arg(long)]
    pub ca_file: Option<String>,
    /// mTLS: the client's certificate (with `--key-file`; its SPIFFE ID is its identity).
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<String>,
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<String>,
    /// A file holding a bearer token (a service-account JWT) sent on every xDS call; needs TLS.
    #[arg(long)]
    pub token_file: Option<String>,
    /// The directory `dubbo-cp agent --out` keeps the workload certificate in: adds gRPC's
    /// `file_watcher` certificate provider, for mTLS between workloads (docs/security.md).
    /// Written as an absolute path (a relative one would resolve against the workload's
    /// working directory).
    #[arg(long)]
    pub certificates: Option<String>,
}

impl BootstrapArgs {
    pub fn bootstrap(&self) -> anyhow::Result<Bootstrap> {
        if self.locality.split('/').count() > 3 {
            anyhow::bail!(
                "--locality must be region/zone/subzone (at most three parts), not {:?}",
                self.locality
            );
        }
        let credentials = match (&self.ca_file, &self.cert_file, &self.key_file) {
            (None, None, None) => Credentials::Insecure,
            (None, _, _) => anyhow::bail!(
                "--cert-file and --key-file are for TLS: give --ca-file, the CA bundle that verifies the server"
            ),
            (Some(ca_file), Some(cert), Some(key)) => Credentials::Tls {
                ca_file: ca_file.clone(),
                certificate: Some((cert.clone(), key.clone())),
            },
            (Some(ca_file), _, _) => Credentials::Tls {
                ca_file: ca_file.clone(),
                certificate: None,
            },
        };
        if self.token_file.is_some() && credentials == Credentials::Insecure {
            anyhow::bail!(
                "--token-file: gRPC sends call credentials only over TLS; give --ca-file and the TLS port as --server"
            );
        }
        let application = self.application.clone();
        let node_id = self.node_id.clone().unwrap_or_else(|| {
            format!(
                "{}.{}",
                application.as_deref().unwrap_or("grpc-client"),
                self.namespace
            )
        });
        let server = match &self.server {
            Some(server) => {
                eprintln!(
                    "warning: `bootstrap --server` is deprecated: it names the xDS port here, where \
                     --server names the gRPC port everywhere else; use --xds-server \
                     (DUBBO_CP_XDS_SERVER)"
                );
                server.clone()
            }
            None => self.xds_server.clone(),
        };
        Ok(Bootstrap {
            server,
            credentials,
            token_file: self.token_file.clone(),
            node_id,
            namespace: self.namespace.clone(),
            application,
            locality: self.locality.clone(),
            certificates: self.certificates.as_deref().map(absolute).transpose()?,
        })
    }
}

/// `dir` made absolute against the operator's working directory: the bootstrap is read by a
/// workload whose own working directory a relative path would resolve against.
fn absolute(dir: &str) -> anyhow::Result<String> {
    let path = std::path::absolute(dir)
        .map_err(|err| anyhow::anyhow!("--certificates {dir:?}: cannot make it absolute: {err}"))?;
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("--certificates {dir:?}: not UTF-8 once made absolute"))
}

pub fn run(args: &BootstrapArgs) -> anyhow::Result<()> {
    let bootstrap = args.bootstrap()?;
    outln!("{}", serde_json::to_string_pretty(&bootstrap.to_json())?);
    if bootstrap.token_file.is_some() {
        // What a user would otherwise find out from a silent UNAUTHENTICATED.
        eprintln!("note: grpc-core clients read call_creds only with {CALL_CREDS_ENV}=true");
    }
    Ok(())
}
