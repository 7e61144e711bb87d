//! Domain state turned into discovery-stream objects: the `<Kind>ToClient` messages of wire.md §2,
//! keyed by client key and packed as `Any`.

use prost::Message;
use prost_types::Any;

use crate::index::Kind;
use crate::pb::rules::ServiceNameMappingToClient;

pub use crate::encode::mapping_any;
pub use dubbo_cp_domain::resource::mapping_object;

#[derive(Debug, thiserror::Error)]
pub enum DecodeObjectError {
    #[error("unexpected type URL {0}")]
    TypeUrl(String),
    #[error(transparent)]
    Decode(#[from] prost::DecodeError),
}

/// Decodes a mapping object received on the stream (for clients of our own: `watch`, tests).
pub fn decode_mapping(any: &Any) -> Result<ServiceNameMappingToClient, DecodeObjectError> {
    if any.type_url != crate::pb::type_url(Kind::ServiceNameMapping) {
        return Err(DecodeObjectError::TypeUrl(any.type_url.clone()));
    }
    Ok(ServiceNameMappingToClient::decode(any.value.as_slice())?)
}

/// The `key` of any `<Kind>ToClient` object: every one of them has `string key = 1`.
pub fn object_key(any: &Any) -> Result<String, DecodeObjectError> {
    #[derive(Clone, PartialEq, Message)]
    struct KeyOnly {
        #[prost(string, tag = "1")]
        key: String,
    }
    Ok(KeyOnly::decode(any.value.as_slice())?.key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dubbo_cp_domain::mapping::MappingKey;
    use std::collections::BTreeSet;

    #[test]
    fn mapping_object_matches_the_contract() {
        let apps: BTreeSet<String> = ["b-app".to_string(), "a-app".to_string()].into();
        let (key, value) = mapping_object(
            "org-apache-dubbo-demo-demoservice",
            &MappingKey::new("dubbo-demo", "org.apache.dubbo.demo.DemoService"),
            &apps,
        );
        assert_eq!(key, "org-apache-dubbo-demo-demoservice/dubbo-demo");
        let decoded = decode_mapping(&crate::encode::to_any(&key, &value)).unwrap();
        assert_eq!(decoded.key, key);
        let spec = decoded.spec.unwrap_or_default();
        assert_eq!(spec.interface_name, "org.apache.dubbo.demo.DemoService");
        assert_eq!(spec.application_names, vec!["a-app", "b-app"]);
    }
}
