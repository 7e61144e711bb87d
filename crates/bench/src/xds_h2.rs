//! The xDS bench's lean load generator: the same ADS streams as xds_streams.rs (Envoy's
//! protos, each response decoded whole and ACKed with the stream's whole subscription), spoken
//! over the `h2` crate directly, with every stream of a connection driven by one task.
//!
//! Why: the load generator shares the two cores with the server it measures. tonic's client
//! gives every stream two tasks (its loop and the request body's pipe) and a channel between
//! them, which at 100,000 streams cost about 60 % of the server's own CPU per push; clients on
//! machines of their own would not take it from the server. The wire is the same (HTTP/2,
//! gRPC's length-prefixed messages, `grpc-status` in the trailers), and so is every byte the
//! server reads. It does not reconnect: a failed stream is counted by code and stays down (the
//! restart's storm runs on tonic or grpc-js, whose reconnection is gRPC's).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use dubbo_cp::coalesce::Coalesced;
use dubbo_cp::xds::{CLUSTER, ENDPOINT};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use h2::client::SendRequest;
use prost::Message;

use super::xds_streams::Acks;

const SOTW: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Largest response a stream takes (tonic's default limit for a decoded message).
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Opens one HTTP/2 connection to `xds`, driven by a task of its own. Connections are opened
/// one after another, as the tonic generator's are: a thousand connects at once overflow the
/// server's accept queue, and this client does not retry.
pub async fn connect(xds: SocketAddr, acks: &Arc<Acks>) -> anyhow::Result<SendRequest<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(xds).await?;
    tcp.set_nodelay(true)?;
    // Writes go out once per poll of the connection, as gRPC's own clients batch theirs.
    // The windows hyper's client (tonic's) opens with, so flow control paces both alike.
    let (client, driver) = h2::client::Builder::new()
        // hyper's too: at most 100 streams opened before the server's own limit is known.
        .initial_max_send_streams(100)
        .enable_push(false)
        .initial_window_size(2 * 1024 * 1024)
        .initial_connection_window_size(5 * 1024 * 1024)
        .handshake(Coalesced::new(tcp))
        .await?;
    let failures = acks.clone();
    tokio::spawn(async move {
        if let Err(error) = driver.await {
            failures.failed_with("Unavailable transport", &format!("connection: {error}"));
        }
    });
    Ok(client)
}

/// Runs a stream per entry of `streams` (the cluster names it subscribes to) on `client`'s
/// connection until each fails or the connection ends.
pub async fn run_streams(
    mut client: SendRequest<Bytes>,
    xds: SocketAddr,
    streams: Vec<Vec<String>>,
    delta: bool,
    acks: Arc<Acks>,
) -> anyhow::Result<()> {
    let path = format!("http://{xds}{}", if delta { DELTA } else { SOTW });
    let mut waiting = streams.into_iter();
    let mut next = waiting.next();
    let mut running = FuturesUnordered::new();
    // Streams are opened here, one at a time (h2 wakes one waiter for room to open a stream,
    // so openers on clones of the client would lose wakeups), while those opened run: every
    // stream of the connection in this one task, so a frame for one wakes only this task.
    loop {
        tokio::select! {
            ready = std::future::poll_fn(|cx| client.poll_ready(cx)), if next.is_some() => {
                let Some(names) = next.take() else { continue };
                next = waiting.next();
                let request = http::Request::builder()
                    .method("POST")
                    .uri(&path)
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(())?;
                match ready.and_then(|()| client.send_request(request, false)) {
                    Ok((response, send)) => {
                        let acks = acks.clone();
                        running.push(async move {
                            let Failure { code, message } =
                                one_stream(response, send, &names, delta, &acks).await;
                            if !acks.finished.load(Ordering::SeqCst) {
                                acks.failed_with(&code, &message);
                            }
                        });
                    }
                    // The connection is gone: this stream and those not opened yet fail
                    // with it, and the opened ones end as they will.
                    Err(error) => {
                        for _ in std::iter::once(names).chain(waiting.by_ref()) {
                            acks.failed_with("Unavailable transport", &error.to_string());
                        }
                        next = None;
                    }
                }
            }
            Some(()) = running.next(), if !running.is_empty() => {}
            else => break,
        }
    }
    Ok(())
}

/// Why a stream ended: a gRPC status code's name (or the transport's failure) and its message.
struct Failure {
    code: String,
    message: String,
}

impl Failure {
    fn transport(error: impl std::fmt::Display) -> Self {
        Failure {
            code: "Unavailable transport".to_owned(),
            message: error.to_string(),
        }
    }
}

/// Runs one stream to its end, and says why it ended: as for tonic's streams, every end is
/// counted, a status of OK too (a gRPC client would reconnect after it).
async fn one_stream(
    response: h2::client::ResponseFuture,
    send: h2::SendStream<Bytes>,
    names: &[String],
    delta: bool,
    acks: &Acks,
) -> Failure {
    match streaming(response, send, names, delta, acks).await {
        Ok(ended) | Err(ended) => ended,
    }
}

/// The stream's life: `Ok` with the status it ended with, `Err` on a failure on the way.
async fn streaming(
    response: h2::client::ResponseFuture,
    mut send: h2::SendStream<Bytes>,
    names: &[String],
    delta: bool,
    acks: &Acks,
) -> Result<Failure, Failure> {
    let first = |type_url: &str| {
        if delta {
            framed(&DeltaDiscoveryRequest {
                type_url: type_url.into(),
                resource_names_subscribe: names.to_vec(),
                node: Some(node()),
                ..Default::default()
            })
        } else {
            framed(&DiscoveryRequest {
                type_url: type_url.into(),
                resource_names: names.to_vec(),
                node: Some(node()),
                ..Default::default()
            })
        }
    };
    for type_url in [CLUSTER, ENDPOINT] {
        send.send_data(first(type_url), false)
            .map_err(Failure::transport)?;
    }
    let response = response.await.map_err(Failure::transport)?;
    if response.status() != http::StatusCode::OK {
        return Err(Failure {
            code: "Unknown".to_owned(),
            message: format!("HTTP status {}", response.status()),
        });
    }
    // A response of headers only carries its status in them.
    if response.headers().contains_key("grpc-status") {
        return Ok(ended(response.headers()));
    }
    let mut body = response.into_body();
    let mut buffer = BytesMut::new();
    let mut subscribed = false;
    // The version of the last load assignment counted: each counts once.
    let mut counted = String::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(Failure::transport)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buffer.put(chunk);
        while let Some(message) = next_message(&mut buffer)? {
            let (type_url, version, ack) = if delta {
                let response = DeltaDiscoveryResponse::decode(message).map_err(undecodable)?;
                let ack = framed(&DeltaDiscoveryRequest {
                    type_url: response.type_url.clone(),
                    response_nonce: response.nonce,
                    ..Default::default()
                });
                (response.type_url, response.system_version_info, ack)
            } else {
                let response = DiscoveryResponse::decode(message).map_err(undecodable)?;
                // The node only in the first requests, as gRPC's xDS clients send it.
                let ack = framed(&DiscoveryRequest {
                    type_url: response.type_url.clone(),
                    resource_names: names.to_vec(),
                    version_info: response.version_info.clone(),
                    response_nonce: response.nonce,
                    ..Default::default()
                });
                (response.type_url, response.version_info, ack)
            };
            send.send_data(ack, false).map_err(Failure::transport)?;
            if type_url == ENDPOINT && version != counted {
                counted = version;
                acks.acked(&mut subscribed);
            }
        }
    }
    let trailers = body.trailers().await.map_err(Failure::transport)?;
    Ok(ended(&trailers.unwrap_or_default()))
}

fn node() -> Node {
    Node {
        id: "bench".into(),
        ..Default::default()
    }
}

/// `message` as gRPC frames it: uncompressed, its length, its bytes.
fn framed(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut buffer = BytesMut::with_capacity(5 + len);
    buffer.put_u8(0);
    buffer.put_u32(len as u32);
    // Cannot fail: the buffer has room for the whole message.
    let _ = message.encode(&mut buffer);
    buffer.freeze()
}

/// The next whole message at the front of `buffer`, taken off it.
fn next_message(buffer: &mut BytesMut) -> Result<Option<Bytes>, Failure> {
    if buffer.len() < 5 {
        return Ok(None);
    }
    let compressed = buffer[0];
    let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
    if compressed != 0 || len > MAX_MESSAGE {
        return Err(Failure {
            code: "Internal".to_owned(),
            message: format!("a message compressed ({compressed}) or of {len} bytes"),
        });
    }
    if buffer.len() < 5 + len {
        return Ok(None);
    }
    buffer.advance(5);
    Ok(Some(buffer.split_to(len).freeze()))
}

fn undecodable(error: prost::DecodeError) -> Failure {
    Failure {
        code: "Internal".to_owned(),
        message: format!("a response that does not decode: {error}"),
    }
}

/// The status a stream ended with, from its trailers, read as tonic reads them (its message
/// percent-decoded) and named as tonic names its codes, so both generators report alike (no
/// status: Unknown, as gRPC's clients take it).
fn ended(trailers: &http::HeaderMap) -> Failure {
    let Some(status) = tonic::Status::from_header_map(trailers) else {
        return Failure {
            code: "Unknown".to_owned(),
            message: "the stream ended without a grpc-status".to_owned(),
        };
    };
    let message = match status.message() {
        "" if status.code() == tonic::Code::Ok => "the server ended the stream",
        message => message,
    };
    Failure {
        code: format!("{:?}", status.code()),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_taken_whole_once_its_bytes_are_there() {
        let request = DiscoveryRequest {
            type_url: ENDPOINT.into(),
            resource_names: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        let frame = framed(&request);
        let mut buffer = BytesMut::from(&frame[..frame.len() - 1]);
        assert!(matches!(next_message(&mut buffer), Ok(None)));
        buffer.put_slice(&frame[frame.len() - 1..]);
        buffer.put_slice(&frame);
        for _ in 0..2 {
            let message = match next_message(&mut buffer) {
                Ok(Some(message)) => message,
                _ => panic!("a whole message is there"),
            };
            assert_eq!(
                DiscoveryRequest::decode(message).ok(),
                Some(request.clone())
            );
        }
        assert!(buffer.is_empty());
    }

    #[test]
    fn a_compressed_or_oversized_message_fails_the_stream() {
        let mut buffer = BytesMut::from(&[1u8, 0, 0, 0, 1, 0][..]);
        assert!(next_message(&mut buffer).is_err());
        let mut buffer = BytesMut::new();
        buffer.put_u8(0);
        buffer.put_u32(MAX_MESSAGE as u32 + 1);
        assert!(next_message(&mut buffer).is_err());
    }

    #[test]
    fn every_end_is_named_as_tonic_names_it() {
        let named = |headers: &http::HeaderMap| {
            let Failure { code, message } = ended(headers);
            (code, message)
        };
        let mut headers = http::HeaderMap::new();
        assert_eq!(named(&headers).0, "Unknown");
        headers.insert("grpc-status", http::HeaderValue::from_static("0"));
        assert_eq!(
            named(&headers),
            ("Ok".to_owned(), "the server ended the stream".to_owned())
        );
        headers.insert("grpc-status", http::HeaderValue::from_static("14"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static("going%20away"),
        );
        assert_eq!(
            named(&headers),
            ("Unavailable".to_owned(), "going away".to_owned())
        );
    }
}
