//! A state-of-the-world response whose resources are the snapshot's encodings, shared: written
//! into the frame from where they lie. A `DiscoveryResponse` owns its resources, so building one
//! copied every resource it carried once per stream before the frame copied it again.

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::google::protobuf::Any;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, message, skip_field, string};

/// The fields of a `DiscoveryResponse` this server sets, encoded exactly as that message with
/// them (prost writes fields in tag order, and so does this).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Response {
    pub version_info: String,
    pub resources: Vec<Arc<Any>>,
    pub type_url: String,
    pub nonce: String,
}

// `DiscoveryResponse`'s tags.
const VERSION_INFO: u32 = 1;
const RESOURCES: u32 = 2;
const TYPE_URL: u32 = 4;
const NONCE: u32 = 5;

impl prost::Message for Response {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.version_info.is_empty() {
            string::encode(VERSION_INFO, &self.version_info, buf);
        }
        for resource in &self.resources {
            message::encode(RESOURCES, resource.as_ref(), buf);
        }
        if !self.type_url.is_empty() {
            string::encode(TYPE_URL, &self.type_url, buf);
        }
        if !self.nonce.is_empty() {
            string::encode(NONCE, &self.nonce, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            VERSION_INFO => string::merge(wire_type, &mut self.version_info, buf, ctx),
            RESOURCES => {
                let mut resource = Any::default();
                message::merge(wire_type, &mut resource, buf, ctx)?;
                self.resources.push(Arc::new(resource));
                Ok(())
            }
            TYPE_URL => string::merge(wire_type, &mut self.type_url, buf, ctx),
            NONCE => string::merge(wire_type, &mut self.nonce, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let text = |tag, value: &String| match value.is_empty() {
            true => 0,
            false => string::encoded_len(tag, value),
        };
        text(VERSION_INFO, &self.version_info)
            + self
                .resources
                .iter()
                .map(|resource| message::encoded_len(RESOURCES, resource.as_ref()))
                .sum::<usize>()
            + text(TYPE_URL, &self.type_url)
            + text(NONCE, &self.nonce)
    }

    fn clear(&mut self) {
        *self = Response::default();
    }
}

impl From<Response> for DiscoveryResponse {
    fn from(response: Response) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: response.version_info,
            resources: response
                .resources
                .into_iter()
                .map(Arc::unwrap_or_clone)
                .collect(),
            type_url: response.type_url,
            nonce: response.nonce,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use prost::Message as _;

    use super::*;

    fn any(type_url: &str, value: &[u8]) -> Arc<Any> {
        Arc::new(Any {
            type_url: type_url.into(),
            value: value.to_vec(),
        })
    }

    #[test]
    fn it_encodes_as_the_discovery_response_with_its_fields_and_decodes_back() {
        let responses = [
            Response::default(),
            Response {
                version_info: "1764000000000".into(),
                resources: vec![any(crate::ENDPOINT, b"\x0a\x03abc"), any("t", b"")],
                type_url: crate::ENDPOINT.into(),
                nonce: "7".into(),
            },
            Response {
                nonce: "8".into(),
                ..Default::default()
            },
        ];
        for response in responses {
            let envoy = DiscoveryResponse::from(response.clone());
            assert_eq!(response.encode_to_vec(), envoy.encode_to_vec());
            assert_eq!(response.encoded_len(), envoy.encoded_len());
            let bytes = envoy.encode_to_vec();
            assert_eq!(Response::decode(bytes.as_slice()).unwrap(), response);
        }
        // Fields it does not set are skipped when decoding.
        let canary = DiscoveryResponse {
            canary: true,
            nonce: "9".into(),
            ..Default::default()
        };
        let decoded = Response::decode(canary.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.nonce, "9");
    }
}
