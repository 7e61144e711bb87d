//! Standalone authentication: a static token file, reloaded when it changes.
//!
//! ```yaml
//! tokens:
//!   - token: s3cr3t-token       # what the SDK sends as `authorization: Bearer ...`
//!     namespace: dubbo-demo     # where its holder may register
//!     identity: demo-provider   # optional; defaults to <namespace>/token-<position>
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tonic::metadata::MetadataMap;

use super::{AuthError, Authenticator, Identity, bearer_token};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    token: String,
    namespace: String,
    #[serde(default)]
    identity: Option<String>,
    /// The holder's service account: its SPIFFE ID, so the CA issues it certificates.
    #[serde(default, rename = "serviceAccount")]
    service_account: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read token file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid token file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

type Tokens = HashMap<String, Identity>;

/// Tokens from a file; [`StaticTokens::watch`] reloads them when the file changes.
pub struct StaticTokens {
    path: PathBuf,
    tokens: RwLock<Arc<Tokens>>,
}

fn load(path: &Path) -> Result<(Tokens, Option<SystemTime>), TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let invalid = |message: String| TokenFileError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let file: TokenFile = serde_yaml::from_str(&text).map_err(|err| invalid(err.to_string()))?;
    let mut tokens = Tokens::new();
    for (position, entry) in file.tokens.into_iter().enumerate() {
        if entry.token.trim().is_empty() {
            return Err(invalid(format!("tokens[{position}].token is empty")));
        }
        if entry.namespace.is_empty() {
            return Err(invalid(format!("tokens[{position}].namespace is empty")));
        }
        let name = entry
            .identity
            .unwrap_or_else(|| format!("{}/token-{position}", entry.namespace));
        let identity = Identity {
            service_account: entry.service_account.filter(|sa| !sa.is_empty()),
            ..Identity::named(entry.namespace, name)
        };
        if tokens.insert(entry.token, identity).is_some() {
            return Err(invalid(format!("tokens[{position}].token appears twice")));
        }
    }
    Ok((tokens, modified))
}

impl StaticTokens {
    pub fn open(path: &Path) -> Result<(Arc<StaticTokens>, Option<SystemTime>), TokenFileError> {
        let (tokens, modified) = load(path)?;
        tracing::info!(path = %path.display(), tokens = tokens.len(), "token file loaded");
        let static_tokens = Arc::new(StaticTokens {
            path: path.to_path_buf(),
            tokens: RwLock::new(Arc::new(tokens)),
        });
        Ok((static_tokens, modified))
    }

    /// Polls the file every `interval` and swaps in its tokens when it changed. A file that
    /// does not load keeps the previous tokens (with an error in the log). Runs until dropped.
    pub async fn watch(self: Arc<Self>, interval: Duration, mut seen: Option<SystemTime>) {
        let mut ticks = tokio::time::interval(interval);
        loop {
            ticks.tick().await;
            let modified = std::fs::metadata(&self.path)
                .and_then(|m| m.modified())
                .ok();
            if modified == seen {
                continue;
            }
            seen = modified;
            match load(&self.path) {
                Ok((tokens, _)) => {
                    tracing::info!(path = %self.path.display(), tokens = tokens.len(), "token file reloaded");
                    *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
                }
                Err(err) => {
                    tracing::error!(error = %err, "token file not reloaded; keeping the previous tokens")
                }
            }
        }
    }
}

#[tonic::async_trait]
impl Authenticator for StaticTokens {
    async fn authenticate(&self, metadata: &MetadataMap) -> Result<Identity, AuthError> {
        let token = bearer_token(metadata)?;
        let tokens = self
            .tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        tokens.get(token).cloned().ok_or(AuthError::InvalidToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_files_with_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        for (text, needle) in [
            (
                "tokens:\n  - token: ''\n    namespace: a\n",
                "tokens[0].token",
            ),
            (
                "tokens:\n  - token: t\n    namespace: ''\n",
                "tokens[0].namespace",
            ),
            (
                "tokens:\n  - token: t\n    namespace: a\n  - token: t\n    namespace: b\n",
                "tokens[1].token",
            ),
            ("tokens:\n  - tokn: t\n", "tokn"),
        ] {
            assert!(std::fs::write(&path, text).is_ok());
            let err = StaticTokens::open(&path)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(needle), "{err}");
        }
    }
}
