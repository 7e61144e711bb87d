//! gRPC's xDS bootstrap (`GRPC_XDS_BOOTSTRAP_CONFIG`), as `dubbo-cp bootstrap` prints it and the
//! webhook injects it: the server and its credentials, and a node that says its namespace and
//! application (what this server resolves names in) and its locality.
//!
//! Formats released clients read (gRPC's `doc/grpc_xds_bootstrap_format.md`): channel
//! credentials `insecure` or `tls` (gRFC A65: the CA, and optionally a client certificate for
//! mTLS, from files that are re-read as they change); call credentials `jwt_token_file` (gRFC
//! A97: a bearer token re-read from a file, for Kubernetes' projected service-account tokens),
//! which grpc-core 1.85 reads only with `GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true`.

use serde_json::{Value, json};

/// The environment variable that makes grpc-core read `call_creds` from the bootstrap.
pub const CALL_CREDS_ENV: &str = "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS";

/// What an xDS-enabled gRPC server (gRFC A36) asks for: the Listener named by this with `%s`
/// replaced by its `IP:port` (gRFC A36's example spelling). There is no default in gRPC: without
/// it grpc-js refuses to build an `XdsServer` and grpc-core serves without xDS.
pub const SERVER_LISTENER_TEMPLATE: &str = "grpc/server?xds.resource.listening_address=%s";
/// The template up to `%s`: a listener name starting so is a server's.
pub const SERVER_LISTENER_PREFIX: &str = "grpc/server?xds.resource.listening_address=";
/// The certificate provider instance (gRFC A29) every TLS context we send names.
pub const CERTIFICATE_PROVIDER: &str = "default";
/// The files `dubbo-cp agent` writes and gRPC's `file_watcher` provider reads (istio-agent's
/// names, so tooling that knows those finds ours).
pub use dubbo_cp_kit::workload::{CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE};
/// How often gRPC re-reads those files (the agent renews long before expiry).
pub const CERTIFICATE_REFRESH: &str = "60s";

/// How a client reaches the xDS server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Plain gRPC (the xDS port on loopback, or with authentication off).
    Insecure,
    /// TLS verified with the CA bundle at `ca_file`; with `certificate` (certificate file, key
    /// file) the client presents it (mTLS: its SPIFFE ID is its identity).
    Tls {
        ca_file: String,
        certificate: Option<(String, String)>,
    },
}

/// One client's bootstrap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// `host:port` of the xDS server.
    pub server: String,
    pub credentials: Credentials,
    /// A file holding a bearer token (a service-account JWT), sent on every xDS call.
    pub token_file: Option<String>,
    pub node_id: String,
    pub namespace: String,
    /// The client's own application, as the node's `cluster` (what Envoy and Istio put there).
    pub application: Option<String>,
    /// `region/zone/subzone`, any part may be empty.
    pub locality: String,
    /// The directory `dubbo-cp agent` writes the workload certificate to: gRPC's `file_watcher`
    /// provider reads it for mTLS between workloads (gRFC A29). `None`: no certificates, so
    /// clients and servers stay plaintext whatever the policies say.
    pub certificates: Option<String>,
}

impl Bootstrap {
    pub fn to_json(&self) -> Value {
        let channel_creds = match &self.credentials {
            Credentials::Insecure => json!([{"type": "insecure"}]),
            Credentials::Tls {
                ca_file,
                certificate,
            } => {
                let mut config = json!({"ca_certificate_file": ca_file});
                if let Some((certificate, key)) = certificate {
                    config["certificate_file"] = json!(certificate);
                    config["private_key_file"] = json!(key);
                }
                json!([{"type": "tls", "config": config}])
            }
        };
        let mut server = json!({
            "server_uri": self.server,
            "channel_creds": channel_creds,
            "server_features": ["xds_v3"],
        });
        if let Some(token_file) = &self.token_file {
            server["call_creds"] =
                json!([{"type": "jwt_token_file", "config": {"jwt_token_file": token_file}}]);
        }
        let mut parts = self.locality.splitn(3, '/');
        let mut part = || parts.next().unwrap_or_default().to_owned();
        // grpc-js-xds refuses a node without a locality, so it is always there.
        let locality = json!({"region": part(), "zone": part(), "sub_zone": part()});
        let mut node = json!({
            "id": self.node_id,
            "locality": locality,
            // Istio's bootstrap names the namespace so; the server resolves names in it.
            "metadata": {"NAMESPACE": self.namespace},
        });
        if let Some(application) = &self.application {
            node["cluster"] = json!(application);
            node["metadata"]["APPLICATION"] = json!(application);
        }
        let mut bootstrap = json!({
            "xds_servers": [server],
            "node": node,
            "server_listener_resource_name_template": SERVER_LISTENER_TEMPLATE,
        });
        if let Some(dir) = &self.certificates {
            let dir = dir.trim_end_matches('/');
            bootstrap["certificate_providers"] = json!({CERTIFICATE_PROVIDER: {
                "plugin_name": "file_watcher",
                "config": {
                    "certificate_file": format!("{dir}/{CERT_CHAIN_FILE}"),
                    "private_key_file": format!("{dir}/{KEY_FILE}"),
                    "ca_certificate_file": format!("{dir}/{ROOT_CERT_FILE}"),
                    "refresh_interval": CERTIFICATE_REFRESH,
                },
            }});
        }
        bootstrap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_names_server_credentials_node_and_locality() {
        let bootstrap = Bootstrap {
            server: "dubbo-cp.dubbo-system.svc:30062".into(),
            credentials: Credentials::Tls {
                ca_file: "/ca.crt".into(),
                certificate: Some(("/c.pem".into(), "/c.key".into())),
            },
            token_file: Some("/token".into()),
            node_id: "greeter-0.shop".into(),
            namespace: "shop".into(),
            application: Some("greeter".into()),
            locality: "eu/west-1a".into(),
            certificates: Some("/var/run/dubbo-cp/certs/".into()),
        };
        assert_eq!(
            bootstrap.to_json(),
            json!({
                "xds_servers": [{
                    "server_uri": "dubbo-cp.dubbo-system.svc:30062",
                    "channel_creds": [{"type": "tls", "config": {
                        "ca_certificate_file": "/ca.crt",
                        "certificate_file": "/c.pem",
                        "private_key_file": "/c.key",
                    }}],
                    "call_creds": [{"type": "jwt_token_file", "config": {"jwt_token_file": "/token"}}],
                    "server_features": ["xds_v3"],
                }],
                "node": {
                    "id": "greeter-0.shop",
                    "cluster": "greeter",
                    "locality": {"region": "eu", "zone": "west-1a", "sub_zone": ""},
                    "metadata": {"NAMESPACE": "shop", "APPLICATION": "greeter"},
                },
                "server_listener_resource_name_template": "grpc/server?xds.resource.listening_address=%s",
                "certificate_providers": {"default": {"plugin_name": "file_watcher", "config": {
                    "certificate_file": "/var/run/dubbo-cp/certs/cert-chain.pem",
                    "private_key_file": "/var/run/dubbo-cp/certs/key.pem",
                    "ca_certificate_file": "/var/run/dubbo-cp/certs/root-cert.pem",
                    "refresh_interval": "60s",
                }}},
            })
        );
        let plain = Bootstrap {
            credentials: Credentials::Insecure,
            token_file: None,
            application: None,
            locality: String::new(),
            certificates: None,
            ..bootstrap
        };
        let json = plain.to_json();
        assert_eq!(
            json["xds_servers"][0]["channel_creds"],
            json!([{"type": "insecure"}])
        );
        assert!(json["xds_servers"][0].get("call_creds").is_none());
        assert!(json.get("certificate_providers").is_none());
        assert_eq!(
            json["node"]["locality"],
            json!({"region": "", "zone": "", "sub_zone": ""})
        );
    }
}
