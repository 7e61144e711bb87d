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

use crate::clients::{ClientStatus, TypeStatus};

/// Envoy's descriptors for the types a dump holds (see the module's doc).
pub const DESCRIPTORS: &[u8] = include_bytes!("dump/envoy.binpb");

/// The files whose types a dump holds; the descriptor file is their closure.
pub const DUMPED_FILES: [&str; 7] = [
    "envoy/service/status/v3/csds.proto",
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
    "envoy/extensions/filters/http/router/v3/router.proto",
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
/// with its version, whether the client acknowledged it (`ACKED`, config `SYNCED`), has not
/// answered yet (`REQUESTED`, `STALE`) or rejected it (`NACKED`, `ERROR`, with the message).
pub fn client_config(client: &ClientStatus) -> ClientConfig {
    let mut configs = Vec::new();
    for (type_url, status) in &client.types {
        for (name, held) in status.held.iter() {
            let version = held
                .version
                .clone()
                .or_else(|| status.sent.clone())
                .unwrap_or_default();
            let (client_status, config_status, error_state) = standing(status);
            configs.push(GenericXdsConfig {
                type_url: (*type_url).to_owned(),
                name: name.clone(),
                version_info: version,
                xds_config: held.resource.as_deref().cloned(),
                client_status: client_status as i32,
                config_status: config_status as i32,
                error_state,
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

/// Where the client stands on what it was last sent of one type.
fn standing(
    status: &TypeStatus,
) -> (
    ClientResourceStatus,
    ConfigStatus,
    Option<UpdateFailureState>,
) {
    if let Some(nack) = status
        .nack
        .as_ref()
        .filter(|n| Some(&n.version) == status.sent.as_ref())
    {
        let failure = UpdateFailureState {
            details: nack.message.clone(),
            version_info: nack.version.clone(),
            ..Default::default()
        };
        return (
            ClientResourceStatus::Nacked,
            ConfigStatus::Error,
            Some(failure),
        );
    }
    if status.sent.is_some() && status.acked == status.sent {
        (ClientResourceStatus::Acked, ConfigStatus::Synced, None)
    } else {
        (ClientResourceStatus::Requested, ConfigStatus::Stale, None)
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
mod tests;
