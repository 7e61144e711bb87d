//! One small HTTP/1.1 client for the canary's outside calls (Prometheus, webhooks): a deadline
//! on every call, a bounded answer, and errors that say which URL failed and how.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Answers larger than this are refused (a Prometheus vector of a few series, a hook's reply).
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum HttpError {
    #[error("invalid URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: {reason}")]
    Transport { url: String, reason: String },
}

/// A status and the body (lossy UTF-8).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for HttpClient {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        HttpClient {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(4)
                .build(connector),
        }
    }
}

impl HttpClient {
    pub async fn get(&self, url: &str, timeout: Duration) -> Result<Answer, HttpError> {
        self.call(http::Method::GET, url, None, timeout).await
    }

    pub async fn post_json(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let body = Bytes::from(body.to_string());
        self.call(http::Method::POST, url, Some(body), timeout)
            .await
    }

    async fn call(
        &self,
        method: http::Method,
        url: &str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| HttpError::Url {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(HttpError::Url {
                    url: url.to_owned(),
                    reason: "https is not supported yet; use an in-cluster http address".to_owned(),
                });
            }
            _ => {
                return Err(HttpError::Url {
                    url: url.to_owned(),
                    reason: "must start with http://".to_owned(),
                });
            }
        }
        let mut request = http::Request::builder().method(method).uri(uri);
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| HttpError::Url {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        let transport = |reason: String| HttpError::Transport {
            url: url.to_owned(),
            reason,
        };
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| transport(format!("{e:#}")))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok(Answer {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| HttpError::Timeout {
                url: url.to_owned(),
                timeout,
            })?
    }
}
