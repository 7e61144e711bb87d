//! `ObserveResponse` with its `data` field kept as encoded bytes.
//!
//! The state of a kind is encoded once per revision; every stream that sends it shares those
//! bytes (a reference count, not a copy), whatever the number of streams. On the wire this is
//! exactly the message of wire.md §2: fields 1-3, then the `repeated google.protobuf.Any data = 4`
//! records as they were encoded.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};
use prost_types::Any;

/// Field number of `data` in `ObserveResponse`.
const DATA_FIELD: u32 = 4;

/// Encoded `data` records of an `ObserveResponse`: each is key (field 4, length-delimited),
/// length, and an encoded `Any`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EncodedData(Bytes);

impl EncodedData {
    pub fn encode<'a>(objects: impl IntoIterator<Item = &'a Any>) -> Self {
        let mut buf = Vec::new();
        for any in objects {
            encoding::message::encode(DATA_FIELD, any, &mut buf);
        }
        EncodedData(Bytes::from(buf))
    }

    /// One object's `data` record (key, length, encoded `Any`), to be assembled later.
    pub fn record(any: &Any) -> Bytes {
        let mut buf = Vec::with_capacity(any.encoded_len() + 8);
        encoding::message::encode(DATA_FIELD, any, &mut buf);
        Bytes::from(buf)
    }

    /// A state from records made by [`EncodedData::record`]: one copy, no encoding.
    pub fn assemble<'a>(records: impl IntoIterator<Item = &'a Bytes> + Clone) -> Self {
        let len = records.clone().into_iter().map(Bytes::len).sum();
        let mut buf = Vec::with_capacity(len);
        for record in records {
            buf.extend_from_slice(record);
        }
        EncodedData(Bytes::from(buf))
    }

    /// Encoded size of the records, i.e. the bytes every response of this state carries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `Any` messages, in order.
    pub fn decode(&self) -> Result<Vec<Any>, DecodeError> {
        /// Just the `data` field of `ObserveResponse`.
        #[derive(Clone, PartialEq, Message)]
        struct DataOnly {
            #[prost(message, repeated, tag = "4")]
            data: Vec<Any>,
        }
        DataOnly::decode(self.0.clone()).map(|only| only.data)
    }
}

impl std::fmt::Debug for EncodedData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncodedData({} bytes)", self.0.len())
    }
}

/// `org.apache.dubbo.auth.v1alpha1.ObserveResponse`.
#[derive(Clone, Default, PartialEq, Debug)]
pub struct ObserveResponse {
    pub nonce: String,
    pub r#type: String,
    pub revision: i64,
    pub data: EncodedData,
}

impl ObserveResponse {
    /// Fields 1-3, the part that differs per stream; `data` follows it on the wire as it is.
    pub fn encode_head(&self, buf: &mut impl BufMut) {
        if !self.nonce.is_empty() {
            encoding::string::encode(1, &self.nonce, buf);
        }
        if !self.r#type.is_empty() {
            encoding::string::encode(2, &self.r#type, buf);
        }
        if self.revision != 0 {
            encoding::int64::encode(3, &self.revision, buf);
        }
    }

    /// The shared, pre-encoded `data` records.
    pub fn data_bytes(&self) -> &Bytes {
        &self.data.0
    }
}

impl Message for ObserveResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.encode_head(buf);
        buf.put_slice(&self.data.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => encoding::string::merge(wire_type, &mut self.nonce, buf, ctx),
            2 => encoding::string::merge(wire_type, &mut self.r#type, buf, ctx),
            3 => encoding::int64::merge(wire_type, &mut self.revision, buf, ctx),
            DATA_FIELD => {
                let mut value = Bytes::new();
                encoding::bytes::merge(wire_type, &mut value, buf, ctx)?;
                let mut records: Vec<u8> = std::mem::take(&mut self.data.0).into();
                encoding::bytes::encode(DATA_FIELD, &value, &mut records);
                self.data = EncodedData(Bytes::from(records));
                Ok(())
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut len = self.data.0.len();
        if !self.nonce.is_empty() {
            len += encoding::string::encoded_len(1, &self.nonce);
        }
        if !self.r#type.is_empty() {
            len += encoding::string::encoded_len(2, &self.r#type);
        }
        if self.revision != 0 {
            len += encoding::int64::encoded_len(3, &self.revision);
        }
        len
    }

    fn clear(&mut self) {
        *self = ObserveResponse::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message as prost generates it from the proto, to check wire compatibility.
    #[derive(Clone, PartialEq, Message)]
    struct Generated {
        #[prost(string, tag = "1")]
        nonce: String,
        #[prost(string, tag = "2")]
        r#type: String,
        #[prost(int64, tag = "3")]
        revision: i64,
        #[prost(message, repeated, tag = "4")]
        data: Vec<Any>,
    }

    fn sample_anys() -> Vec<Any> {
        (0..3)
            .map(|i| Any {
                type_url:
                    "type.googleapis.com/dubbo.apache.org.v1alpha1.ServiceNameMappingToClient"
                        .into(),
                value: vec![i; 10 + i as usize],
            })
            .collect()
    }

    #[test]
    fn same_bytes_as_the_generated_message() {
        let anys = sample_anys();
        let ours = ObserveResponse {
            nonce: "7".into(),
            r#type: "dubbo.apache.org/v1alpha1/ServiceNameMapping".into(),
            revision: 42,
            data: EncodedData::encode(&anys),
        };
        let generated = Generated {
            nonce: "7".into(),
            r#type: "dubbo.apache.org/v1alpha1/ServiceNameMapping".into(),
            revision: 42,
            data: anys.clone(),
        };
        assert_eq!(ours.encode_to_vec(), generated.encode_to_vec());
        assert_eq!(ours.encoded_len(), generated.encoded_len());

        let decoded = ObserveResponse::decode(generated.encode_to_vec().as_slice());
        let decoded = decoded.unwrap();
        assert_eq!(decoded, ours);
        assert_eq!(decoded.data.decode().ok(), Some(anys));
    }

    #[test]
    fn empty_state_encodes_no_data() {
        let empty = ObserveResponse {
            nonce: "1".into(),
            r#type: "t".into(),
            revision: 1,
            data: EncodedData::default(),
        };
        let generated = Generated {
            nonce: "1".into(),
            r#type: "t".into(),
            revision: 1,
            data: vec![],
        };
        assert_eq!(empty.encode_to_vec(), generated.encode_to_vec());
        assert_eq!(empty.data.decode().ok(), Some(vec![]));
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let full = Generated {
            nonce: "1".into(),
            r#type: "t".into(),
            revision: 1,
            data: sample_anys(),
        }
        .encode_to_vec();
        for cut in 0..full.len() {
            let _ = ObserveResponse::decode(&full[..cut]);
        }
        assert!(ObserveResponse::decode(&full[..full.len() - 1]).is_err());
    }
}
