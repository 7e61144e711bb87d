//! The HTTP/2 response body of one `Observe` stream, written without copying the shared state.
//!
//! Each response goes out as two chunks: a small one with the gRPC message prefix and the fields
//! that differ per stream (nonce, type, revision), then the kind's pre-encoded `data` bytes,
//! which every stream shares by reference count. Nothing of a sent state stays with the stream.
//! The body ends with gRPC trailers: OK when the stream task ends cleanly, else its status.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::wire::ObserveResponse;

/// Length of the gRPC message prefix: a compression flag and a big-endian u32 length.
const MESSAGE_PREFIX: usize = 5;

pub struct ObserveBody {
    responses: mpsc::Receiver<ObserveResponse>,
    /// The stream task's final status, if it failed; it overtakes anything still queued.
    end: Option<oneshot::Receiver<Status>>,
    /// The `data` chunk of the response whose head was just yielded.
    data: Option<Bytes>,
    done: bool,
}

impl ObserveBody {
    pub fn new(responses: mpsc::Receiver<ObserveResponse>, end: oneshot::Receiver<Status>) -> Self {
        Self {
            responses,
            end: Some(end),
            data: None,
            done: false,
        }
    }

    fn finish(&mut self, status: &Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.done = true;
        self.responses.close();
        let mut trailers = HeaderMap::new();
        if let Err(err) = status.add_header(&mut trailers) {
            tracing::warn!(error = %err, "cannot encode the stream's final status");
            let _ = Status::internal("stream failed").add_header(&mut trailers);
        }
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }
}

/// The prefix and head of `response`: everything but its shared `data`.
fn head_chunk(response: &ObserveResponse) -> Result<Bytes, Status> {
    let len = u32::try_from(response.encoded_len())
        .map_err(|_| Status::resource_exhausted("state too large for one gRPC message"))?;
    let mut head = Vec::with_capacity(MESSAGE_PREFIX + 64);
    head.put_u8(0);
    head.put_u32(len);
    response.encode_head(&mut head);
    Ok(Bytes::from(head))
}

impl Body for ObserveBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(end) = self.end.as_mut() {
            match Pin::new(end).poll(cx) {
                Poll::Ready(Ok(status)) => return self.finish(&status),
                // The task ended without an error: send what it queued, then OK.
                Poll::Ready(Err(_)) => self.end = None,
                Poll::Pending => {}
            }
        }
        match ready!(self.responses.poll_recv(cx)) {
            Some(response) => {
                let head = match head_chunk(&response) {
                    Ok(head) => head,
                    Err(status) => return self.finish(&status),
                };
                let data = response.data_bytes();
                if !data.is_empty() {
                    self.data = Some(data.clone());
                }
                Poll::Ready(Some(Ok(Frame::data(head))))
            }
            // Still waiting for the task's verdict.
            None if self.end.is_some() => Poll::Pending,
            None => self.finish(&Status::ok("")),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::EncodedData;
    use http_body_util::BodyExt;
    use prost_types::Any;

    fn response(nonce: &str) -> ObserveResponse {
        let anys = vec![Any {
            type_url: "t".into(),
            value: vec![1, 2, 3],
        }];
        ObserveResponse {
            nonce: nonce.into(),
            r#type: "k".into(),
            revision: 7,
            data: EncodedData::encode(&anys),
        }
    }

    #[tokio::test]
    async fn frames_are_grpc_messages_then_ok_trailers() {
        let (tx, rx) = mpsc::channel(4);
        let (end_tx, end_rx) = oneshot::channel();
        let body = ObserveBody::new(rx, end_rx);
        assert!(tx.send(response("1")).await.is_ok());
        assert!(tx.send(response("2")).await.is_ok());
        drop(tx);
        drop(end_tx);
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        let mut bytes = collected.to_bytes();
        for nonce in ["1", "2"] {
            assert_eq!(bytes[0], 0, "compression flag");
            let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
            let message = ObserveResponse::decode(&bytes[5..5 + len]).unwrap();
            assert_eq!(message, response(nonce));
            bytes = bytes.slice(5 + len..);
        }
        assert!(bytes.is_empty());
    }

    #[tokio::test]
    async fn a_failed_task_ends_with_its_status() {
        let (tx, rx) = mpsc::channel(4);
        let (end_tx, end_rx) = oneshot::channel();
        let body = ObserveBody::new(rx, end_rx);
        assert!(tx.send(response("1")).await.is_ok());
        assert!(end_tx.send(Status::deadline_exceeded("too slow")).is_ok());
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"4"[..])
        );
        assert_eq!(
            trailers.get("grpc-message").map(|v| v.as_bytes()),
            Some(&b"too%20slow"[..])
        );
    }
}
