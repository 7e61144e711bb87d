//! The `zookeeper` section of the configuration.

use std::path::PathBuf;
use std::time::Duration;

use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// ZooKeeper mode: the ensemble that holds mappings, rules and providers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ZooKeeperConfig {
    /// ZooKeeper mode: the ensemble `host:port[,host:port...][/chroot]`, as Dubbo's
    /// `zookeeper://` addresses name it; unset, the mode is standalone or Kubernetes.
    #[arg(
        id = "zookeeper.address",
        long = "zookeeper",
        env = "DUBBO_CP_ZOOKEEPER"
    )]
    pub address: Option<String>,
    /// Session timeout asked of the ensemble (it grants one within its own bounds).
    #[arg(id = "zookeeper.sessionTimeout", long = "zookeeper-session-timeout",
          env = "DUBBO_CP_ZOOKEEPER_SESSION_TIMEOUT", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(10))]
    pub session_timeout: Duration,
    /// Mapping nodes written at the same time.
    #[arg(
        id = "zookeeper.maxParallelWrites",
        long = "zookeeper-max-parallel-writes",
        env = "DUBBO_CP_ZOOKEEPER_MAX_PARALLEL_WRITES"
    )]
    #[default(16)]
    pub max_parallel_writes: usize,
    /// How often a mapping whose node cannot be written as it is (its value unreadable, its
    /// path refused) is tried again.
    #[arg(id = "zookeeper.parkedRetryInterval", long = "zookeeper-parked-retry-interval",
          env = "DUBBO_CP_ZOOKEEPER_PARKED_RETRY_INTERVAL", value_parser = DurationArg)]
    #[serde(rename = "parkedRetryInterval", with = "duration")]
    #[default(Duration::from_secs(30))]
    pub parked_retry: Duration,
    /// A file holding dubbo-cp's ZooKeeper identity, `digest:USER:PASSWORD` (or `USER:PASSWORD`),
    /// the same file on every replica. With it the CA's roots and signing key are shared through
    /// the ensemble under an ACL only this identity passes; without it each replica keeps its
    /// own root. Read from a file so the password is never on a command line.
    #[arg(
        id = "zookeeper.auth",
        long = "zookeeper-auth",
        env = "DUBBO_CP_ZOOKEEPER_AUTH"
    )]
    pub auth: Option<PathBuf>,
    /// The ACL of the mapping and rule nodes dubbo-cp creates: `open` (anyone may read and
    /// write, as Dubbo SDKs must) or `read` (anyone may read; only dubbo-cp's `zookeeper.auth`
    /// identity may change them; SDKs can then no longer append to those mapping nodes). The
    /// directories above them stay open either way.
    #[arg(id = "zookeeper.acl", long = "zookeeper-acl", env = "DUBBO_CP_ZOOKEEPER_ACL",
          value_parser = ["open", "read"])]
    #[default("open".to_owned())]
    pub acl: String,
}

/// dubbo-cp's identity in the ensemble, read from `zookeeper.auth`'s file.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub scheme: String,
    /// `USER:PASSWORD` for `digest`.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}:...)", self.scheme)
    }
}

/// Why `zookeeper.auth` or `zookeeper.acl` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("zookeeper.auth {path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "zookeeper.auth {path}: {reason} (the file holds one line, digest:USER:PASSWORD or USER:PASSWORD)"
    )]
    Invalid { path: PathBuf, reason: &'static str },
    #[error("zookeeper.acl {0:?}: `read` needs zookeeper.auth (the identity allowed to write)")]
    AclWithoutAuth(String),
    #[error("zookeeper.acl {0:?}: must be `open` or `read`")]
    Acl(String),
}

/// The most a credentials file may hold.
const MAX_AUTH_BYTES: u64 = 4096;

impl ZooKeeperConfig {
    /// The identity `zookeeper.auth` names, if any.
    pub fn credentials(&self) -> Result<Option<Credentials>, AuthError> {
        let Some(path) = &self.auth else {
            return Ok(None);
        };
        let invalid = |reason| AuthError::Invalid {
            path: path.clone(),
            reason,
        };
        let read = |source| AuthError::Read {
            path: path.clone(),
            source,
        };
        // Read through a limit, not after a size check: a FIFO or a device has no size.
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(std::fs::File::open(path).map_err(read)?, MAX_AUTH_BYTES + 1),
            &mut text,
        )
        .map_err(read)?;
        if text.len() as u64 > MAX_AUTH_BYTES {
            return Err(invalid("is over 4 KiB"));
        }
        let line = text.trim();
        if line.contains('\n') {
            return Err(invalid("has more than one line"));
        }
        let (scheme, secret) = match line.split_once(':') {
            Some(("digest", rest)) => ("digest", rest),
            Some(("", _)) => return Err(invalid("names no user")),
            _ => ("digest", line),
        };
        match secret.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => {}
            _ => return Err(invalid("has no USER:PASSWORD")),
        }
        Ok(Some(Credentials {
            scheme: scheme.to_owned(),
            secret: secret.as_bytes().to_vec(),
        }))
    }

    /// Whether nodes dubbo-cp creates are read-only to others (`zookeeper.acl: read`).
    pub fn read_only_acl(&self) -> Result<bool, AuthError> {
        match self.acl.as_str() {
            "open" => Ok(false),
            "read" if self.auth.is_none() => Err(AuthError::AclWithoutAuth(self.acl.clone())),
            "read" => Ok(true),
            other => Err(AuthError::Acl(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(text: &str) -> (tempfile::NamedTempFile, ZooKeeperConfig) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let config = ZooKeeperConfig {
            auth: Some(file.path().to_owned()),
            ..ZooKeeperConfig::default()
        };
        (file, config)
    }

    #[test]
    fn credentials_are_read_from_the_file() {
        for text in ["digest:dubbo-cp:s3cret\n", "dubbo-cp:s3cret"] {
            let (_file, config) = with_file(text);
            let credentials = config.credentials().unwrap().unwrap();
            assert_eq!(credentials.scheme, "digest");
            assert_eq!(credentials.secret, b"dubbo-cp:s3cret");
            assert!(!format!("{credentials:?}").contains("s3cret"));
        }
        for bad in ["", "digest:", "user", "digest:user:", "a:b\nc:d"] {
            let (_file, config) = with_file(bad);
            let err = config.credentials().unwrap_err().to_string();
            assert!(err.contains("zookeeper.auth"), "{bad:?}: {err}");
        }
        assert!(ZooKeeperConfig::default().credentials().unwrap().is_none());
    }

    #[test]
    fn a_read_only_acl_needs_an_identity() {
        let config = ZooKeeperConfig {
            acl: "read".into(),
            ..ZooKeeperConfig::default()
        };
        assert!(config.read_only_acl().is_err());
        let (_file, mut config) = with_file("u:p");
        config.acl = "read".into();
        assert!(config.read_only_acl().unwrap());
        assert!(!ZooKeeperConfig::default().read_only_acl().unwrap());
    }
}
