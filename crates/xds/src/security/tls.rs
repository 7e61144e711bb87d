//! The TLS contexts of gRFC A29, naming the bootstrap's certificate provider instance (the
//! files `dubbo-cp agent` keeps). Only what released clients accept is set: the current
//! `*_certificate_provider_instance` fields (not Istio's deprecated duplicates, which one Rust
//! client refuses), no SAN matcher on servers (grpc-core NACKs it there), and nothing grpc-core
//! NACKs on either side (`tls_params`, SNI requirements, OCSP, CRLs, SDS).

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, UpstreamTlsContext, common_tls_context,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use crate::bootstrap::CERTIFICATE_PROVIDER;

/// The transport socket name gRPC accepts (any other is NACKed).
pub const TLS_SOCKET: &str = "envoy.transport_sockets.tls";

fn provider() -> CertificateProviderPluginInstance {
    CertificateProviderPluginInstance {
        instance_name: CERTIFICATE_PROVIDER.to_owned(),
        certificate_name: String::new(),
    }
}

/// Our identity, and our roots to verify the peer with (checking the SANs `sans` match).
fn common(sans: Vec<StringMatcher>) -> CommonTlsContext {
    #[allow(deprecated)]
    let validation = CertificateValidationContext {
        ca_certificate_provider_instance: Some(provider()),
        // gRFC A29 reads this field (the typed one is newer than released clients).
        match_subject_alt_names: sans,
        ..Default::default()
    };
    CommonTlsContext {
        tls_certificate_provider_instance: Some(provider()),
        validation_context_type: Some(
            common_tls_context::ValidationContextType::ValidationContext(validation),
        ),
        ..Default::default()
    }
}

/// A STRICT server's socket: our certificate, client certificates required and verified
/// against our roots. Who may call is RBAC's business (principals), not a SAN list.
pub fn downstream_strict() -> TransportSocket {
    let context = DownstreamTlsContext {
        common_tls_context: Some(common(Vec::new())),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket {
        name: TLS_SOCKET.to_owned(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    }
}

/// A client's socket to a STRICT server of `namespace`: our certificate, and the server's must
/// carry a SPIFFE ID of the trust domain and that namespace (the service model has no service
/// accounts, so any account of the namespace).
pub fn upstream_mtls(trust_domain: &str, namespace: &str) -> TransportSocket {
    let san = StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Prefix(format!(
            "spiffe://{trust_domain}/ns/{namespace}/sa/"
        ))),
        ignore_case: false,
    };
    let context = UpstreamTlsContext {
        common_tls_context: Some(common(vec![san])),
        ..Default::default()
    };
    TransportSocket {
        name: TLS_SOCKET.to_owned(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    }
}
