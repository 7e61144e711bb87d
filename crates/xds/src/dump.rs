//! What each client was served, in the shape of a config dump: one CSDS `ClientConfig`
//! (`envoy.service.status.v3`, what gRPC clients and Envoy expose of themselves through CSDS)
//! per stream, so an operator can set ours beside the client's own and compare.
//!
//! The JSON is protobuf's canonical JSON with proto field names, as Envoy's admin
//! `/config_dump` prints it, resources expanded from their `Any`. It is rendered by
//! `prost-reflect` from Envoy's descriptors: `dump/envoy.binpb` holds the descriptors of the
//! types a dump can contain (trimmed from the set `envoy-types` ships; a test keeps it current),
//! because `envoy-types` has no serde of its own.

use std::sync::OnceLock;

use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};

use crate::clients::ClientStatus;

/// Envoy's descriptors for the types a dump holds (see the module's doc).
pub const DESCRIPTORS: &[u8] = include_bytes!("dump/envoy.binpb");

/// The files whose types a dump holds; the descriptor file is their closure.
/// Every `typed_config` the generator emits must be defined here (`dump/kinds_tests.rs` renders
/// each resource kind and fails on one that is not).
pub const DUMPED_FILES: [&str; 9] = [
    "envoy/service/status/v3/csds.proto",
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
    "envoy/extensions/filters/http/router/v3/router.proto",
    "envoy/extensions/filters/http/rbac/v3/rbac.proto",
    "envoy/extensions/transport_sockets/tls/v3/tls.proto",
];

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("the Envoy descriptors built into dubbo-cp do not load: {0}")]
    Descriptors(String),
    #[error("cannot render a config dump as JSON: {0}")]
    Render(String),
}

fn pool() -> Result<&'static DescriptorPool, DumpError> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| DumpError::Descriptors(e.clone()))
}

/// One client's served configuration as a CSDS `ClientConfig`: each resource it was last sent,
/// with its version and where the client stands on it:
/// - `ACKED` / `SYNCED`: the response that carried it was acknowledged (or a later one);
/// - `UNKNOWN` / `STALE`: sent, not answered yet;
/// - `NACKED` / `ERROR`: the response that carried it was rejected; `error_state` has the
///   client's message and the rejected resource, `xds_config` what the client keeps (state of
///   the world: the last acknowledged version of it, if any);
/// - `DOES_NOT_EXIST` / `NOT_SENT`: subscribed, and the client was told it does not exist.
pub fn client_config(client: &ClientStatus) -> ClientConfig {
    let mut configs = Vec::new();
    for (type_url, status) in &client.types {
        for (name, held) in status.held.iter() {
            let version = held
                .version
                .as_deref()
                .map(str::to_owned)
                .or_else(|| status.sent.clone())
                .unwrap_or_default();
            let mut config = GenericXdsConfig {
                type_url: (*type_url).to_owned(),
                name: name.to_string(),
                version_info: version,
                xds_config: held.resource.as_deref().cloned(),
                ..Default::default()
            };
            let rejected = status
                .nack
                .as_ref()
                .filter(|nack| held.nonce != 0 && nack.nonce == held.nonce);
            let (client_status, config_status) = if let Some(nack) = rejected {
                config.error_state = Some(UpdateFailureState {
                    failed_configuration: held.resource.as_deref().cloned(),
                    details: nack.message.clone(),
                    version_info: nack.version.clone(),
                    ..Default::default()
                });
                let kept = status.accepted.get(name);
                config.xds_config = kept.and_then(|k| k.resource.as_deref().cloned());
                config.version_info = kept
                    .map(|_| status.acked.clone().unwrap_or_default())
                    .unwrap_or_default();
                (ClientResourceStatus::Nacked, ConfigStatus::Error)
            } else if held.nonce <= status.acked_nonce {
                (ClientResourceStatus::Acked, ConfigStatus::Synced)
            } else {
                (ClientResourceStatus::Unknown, ConfigStatus::Stale)
            };
            config.client_status = client_status as i32;
            config.config_status = config_status as i32;
            configs.push(config);
        }
        for name in status.absent.iter() {
            configs.push(GenericXdsConfig {
                type_url: (*type_url).to_owned(),
                name: name.clone(),
                client_status: ClientResourceStatus::DoesNotExist as i32,
                config_status: ConfigStatus::NotSent as i32,
                ..Default::default()
            });
        }
    }
    ClientConfig {
        node: Some(Node {
            id: client.node_id.clone(),
            metadata: Some(Struct {
                fields: [(
                    "NAMESPACE".to_owned(),
                    Value {
                        kind: Some(value::Kind::StringValue(client.namespace.clone())),
                    },
                )]
                .into(),
            }),
            ..Default::default()
        }),
        generic_xds_configs: configs,
        ..Default::default()
    }
}

/// `config` as protobuf JSON (proto field names, resources expanded), as Envoy prints dumps.
pub fn to_json(config: &ClientConfig) -> Result<serde_json::Value, DumpError> {
    let pool = pool()?;
    let descriptor = pool
        .get_message_by_name("envoy.service.status.v3.ClientConfig")
        .ok_or_else(|| DumpError::Descriptors("no envoy.service.status.v3.ClientConfig".into()))?;
    let message = DynamicMessage::decode(descriptor, config.encode_to_vec().as_slice())
        .map_err(|e| DumpError::Render(e.to_string()))?;
    let options = SerializeOptions::new().use_proto_field_name(true);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| DumpError::Render(e.to_string()))
}

#[cfg(test)]
mod kinds_tests;
#[cfg(test)]
mod tests;
