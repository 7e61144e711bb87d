//! Where the roots are kept: the embedded database (standalone), Secret `dubbo-ca-secret`
//! (Kubernetes), or an operator's files (read only). Every backend holds the same shape, the
//! reference's two keys plus the roots retiring after a rotation:
//! `cert.pem` (active root), `pri.pem` (its key), `retiring.pem` (older roots, still trusted).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rusqlite::{Connection, OptionalExtension, params};

use super::authority::{BACKDATE, Bundle, Root, RootError, Signer};

/// The Secret of the reference control plane, in the control plane's namespace.
pub const SECRET_NAME: &str = "dubbo-ca-secret";
pub const CERT_KEY: &str = "cert.pem";
pub const PRIVATE_KEY_KEY: &str = "pri.pem";
pub const RETIRING_KEY: &str = "retiring.pem";
pub const CROSS_KEY: &str = "cross.pem";
/// Marks a Secret this control plane generated (and may rotate); without it the root is the
/// operator's and is used as is.
pub const MANAGED_ANNOTATION: &str = "dubbo.apache.org/ca-managed-by";
/// Retiring roots are kept longer than the last certificate they issued could live, by a tenth
/// of a certificate's validity within these bounds: replicas that see a rotation late (watch
/// lag) may issue from the old root a little longer, and validity times are whole seconds.
const DROP_SLACK_MIN: Duration = Duration::from_secs(5);
const DROP_SLACK_MAX: Duration = Duration::from_secs(300);

/// The stored roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRoots {
    pub cert_pem: String,
    pub key_pem: String,
    /// PEM certificates, oldest last.
    pub retiring_pem: String,
    /// The active root signed by the root it replaced (PEM; empty when nothing is retiring).
    pub cross_pem: String,
    pub managed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CaStoreError {
    #[error(transparent)]
    Root(#[from] RootError),
    #[error("CA store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("Secret {SECRET_NAME}: {0}")]
    Kube(#[from] kube::Error),
    #[error("Secret {SECRET_NAME} has no {0}")]
    MissingKey(&'static str),
    #[error("cannot read {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another writer changed the roots first")]
    Conflict,
    #[error("Secret {SECRET_NAME}: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Unmanaged(String),
}

impl StoredRoots {
    pub fn generate(root_validity: Duration, now: SystemTime) -> Result<StoredRoots, RootError> {
        let signer = Signer::generate(root_validity, now)?;
        Ok(StoredRoots {
            cert_pem: signer.root().pem.clone(),
            key_pem: signer.key_pem().to_owned(),
            retiring_pem: String::new(),
            cross_pem: String::new(),
            managed: true,
        })
    }

    /// The bundle these roots make at `now`: retiring roots past their drop time are left out.
    pub fn bundle(&self, cert_validity: Duration, now: SystemTime) -> Result<Bundle, RootError> {
        let signer = Signer::from_pem(&self.cert_pem, &self.key_pem)?;
        let drop_at = drop_time(signer.root(), cert_validity);
        let mut retiring = Vec::new();
        if now < drop_at {
            for block in pem::parse_many(&self.retiring_pem).map_err(|e| RootError::Invalid {
                what: "retiring roots",
                reason: e.to_string(),
            })? {
                let root = Root::from_der(block.contents())?;
                if !root.expired(now) && root.fingerprint != signer.root().fingerprint {
                    retiring.push(std::sync::Arc::new(root));
                }
            }
        }
        let cross = match pem::parse(&self.cross_pem) {
            Ok(block) if !retiring.is_empty() => {
                Some(std::sync::Arc::new(Root::from_der(block.contents())?))
            }
            _ => None,
        };
        Ok(Bundle {
            signer: std::sync::Arc::new(signer),
            retiring,
            cross,
            managed: self.managed,
        })
    }

    /// A new active root; the current one and those still trusted become retiring.
    pub fn rotated(
        &self,
        current: &Bundle,
        root_validity: Duration,
        now: SystemTime,
    ) -> Result<StoredRoots, RootError> {
        let (signer, cross) = Signer::generate_after(Some(&current.signer), root_validity, now)?;
        Ok(StoredRoots {
            cert_pem: signer.root().pem.clone(),
            key_pem: signer.key_pem().to_owned(),
            retiring_pem: current.trusted().map(|r| r.pem.as_str()).collect(),
            cross_pem: cross
                .map(|der| super::authority::to_pem("CERTIFICATE", der))
                .unwrap_or_default(),
            managed: true,
        })
    }

    /// The same roots without the retiring ones `bundle` no longer trusts.
    pub fn pruned(&self, bundle: &Bundle) -> StoredRoots {
        StoredRoots {
            retiring_pem: bundle.retiring.iter().map(|r| r.pem.as_str()).collect(),
            cross_pem: if bundle.retiring.is_empty() {
                String::new()
            } else {
                self.cross_pem.clone()
            },
            ..self.clone()
        }
    }
}

/// When the roots retiring behind `active` may be dropped: once every certificate issued before
/// `active` took over has expired (issuing switched when `active` was made).
pub fn drop_time(active: &Root, cert_validity: Duration) -> SystemTime {
    let slack = (cert_validity / 10).clamp(DROP_SLACK_MIN, DROP_SLACK_MAX);
    active.not_before + BACKDATE + cert_validity + slack
}

/// When a managed root should be replaced: at two thirds of its life.
pub fn rotation_time(active: &Root) -> SystemTime {
    let life = active
        .not_after
        .duration_since(active.not_before)
        .unwrap_or_default();
    active.not_before + life * 2 / 3
}

/// The standalone backend: one row in the embedded database (its own connection, like the rule
/// store), written in a transaction.
pub struct SqliteRoots {
    conn: Mutex<Connection>,
}

impl SqliteRoots {
    /// `db_file`: the embedded database's file (the store's `DB_FILE` in the data directory).
    pub fn open(db_file: &Path) -> Result<SqliteRoots, CaStoreError> {
        let conn = Connection::open(db_file)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS ca_root (
                 id       INTEGER PRIMARY KEY CHECK (id = 1),
                 cert_pem TEXT NOT NULL,
                 key_pem  TEXT NOT NULL,
                 retiring TEXT NOT NULL,
                 cross    TEXT NOT NULL,
                 managed  INTEGER NOT NULL,
                 version  INTEGER NOT NULL
             );",
        )?;
        Ok(SqliteRoots {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stored roots and their version, if any.
    pub fn load(&self) -> Result<Option<(StoredRoots, i64)>, CaStoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT cert_pem, key_pem, retiring, cross, managed, version FROM ca_root WHERE id = 1",
                [],
                |row| {
                    Ok((
                        StoredRoots {
                            cert_pem: row.get(0)?,
                            key_pem: row.get(1)?,
                            retiring_pem: row.get(2)?,
                            cross_pem: row.get(3)?,
                            managed: row.get(4)?,
                        },
                        row.get(5)?,
                    ))
                },
            )
            .optional()?)
    }

    /// Replaces whatever is stored (the Kubernetes mode's cache of the Secret).
    pub fn overwrite(&self, roots: &StoredRoots) -> Result<(), CaStoreError> {
        let expected = self.load()?.map(|(_, version)| version);
        self.write(roots, expected).map(|_| ())
    }

    /// Writes `roots` if the stored version is still `expected` (`None`: nothing stored).
    pub fn write(&self, roots: &StoredRoots, expected: Option<i64>) -> Result<i64, CaStoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let current: Option<i64> = tx
            .query_row("SELECT version FROM ca_root WHERE id = 1", [], |r| r.get(0))
            .optional()?;
        if current != expected {
            return Err(CaStoreError::Conflict);
        }
        let version = current.unwrap_or(0) + 1;
        tx.execute(
            "INSERT INTO ca_root (id, cert_pem, key_pem, retiring, cross, managed, version)
             VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (id) DO UPDATE SET cert_pem = ?1, key_pem = ?2, retiring = ?3,
                 cross = ?4, managed = ?5, version = ?6",
            params![
                roots.cert_pem,
                roots.key_pem,
                roots.retiring_pem,
                roots.cross_pem,
                roots.managed,
                version
            ],
        )?;
        tx.commit()?;
        Ok(version)
    }
}

/// The Kubernetes backend: Secret `dubbo-ca-secret` in the control plane's namespace.
#[derive(Clone)]
pub struct SecretRoots {
    pub api: Api<Secret>,
}

impl SecretRoots {
    pub fn new(client: kube::Client, namespace: &str) -> SecretRoots {
        SecretRoots {
            api: Api::namespaced(client, namespace),
        }
    }

    /// The roots of `secret` and its resourceVersion.
    pub fn read(secret: &Secret) -> Result<(StoredRoots, String), CaStoreError> {
        let data = secret.data.clone().unwrap_or_default();
        let text = |key: &'static str| -> Result<String, CaStoreError> {
            data.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .ok_or(CaStoreError::MissingKey(key))
        };
        let managed = secret
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MANAGED_ANNOTATION));
        Ok((
            StoredRoots {
                cert_pem: text(CERT_KEY)?,
                key_pem: text(PRIVATE_KEY_KEY)?,
                retiring_pem: text(RETIRING_KEY).unwrap_or_default(),
                cross_pem: text(CROSS_KEY).unwrap_or_default(),
                managed,
            },
            secret.metadata.resource_version.clone().unwrap_or_default(),
        ))
    }

    fn secret(roots: &StoredRoots, resource_version: Option<String>) -> Secret {
        let mut data = BTreeMap::new();
        data.insert(
            CERT_KEY.to_owned(),
            ByteString(roots.cert_pem.clone().into_bytes()),
        );
        data.insert(
            PRIVATE_KEY_KEY.to_owned(),
            ByteString(roots.key_pem.clone().into_bytes()),
        );
        data.insert(
            RETIRING_KEY.to_owned(),
            ByteString(roots.retiring_pem.clone().into_bytes()),
        );
        data.insert(
            CROSS_KEY.to_owned(),
            ByteString(roots.cross_pem.clone().into_bytes()),
        );
        Secret {
            metadata: ObjectMeta {
                name: Some(SECRET_NAME.to_owned()),
                resource_version,
                annotations: roots.managed.then(|| {
                    BTreeMap::from([(MANAGED_ANNOTATION.to_owned(), "dubbo-cp".to_owned())])
                }),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".to_owned()),
            data: Some(data),
            ..Secret::default()
        }
    }

    /// The Secret's roots, creating it with `generate()` when absent. Two replicas starting
    /// together both try; the loser's create gets 409 and it reads the winner's.
    pub async fn load_or_create(
        &self,
        generate: impl FnOnce() -> Result<StoredRoots, RootError>,
    ) -> Result<(StoredRoots, String), CaStoreError> {
        if let Some(secret) = self.api.get_opt(SECRET_NAME).await? {
            return SecretRoots::read(&secret);
        }
        let roots = generate()?;
        match self
            .api
            .create(&PostParams::default(), &SecretRoots::secret(&roots, None))
            .await
        {
            Ok(created) => {
                tracing::info!(secret = SECRET_NAME, "created the CA root");
                SecretRoots::read(&created)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(
                    secret = SECRET_NAME,
                    "another replica created the CA root first"
                );
                SecretRoots::read(&self.api.get(SECRET_NAME).await?)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Replaces the roots if the Secret is still at `resource_version`; creates it when it was
    /// deleted (`None`).
    pub async fn write(
        &self,
        roots: &StoredRoots,
        resource_version: Option<String>,
    ) -> Result<(StoredRoots, String), CaStoreError> {
        let result = match resource_version {
            Some(rv) => {
                self.api
                    .replace(
                        SECRET_NAME,
                        &PostParams::default(),
                        &SecretRoots::secret(roots, Some(rv)),
                    )
                    .await
            }
            None => {
                self.api
                    .create(&PostParams::default(), &SecretRoots::secret(roots, None))
                    .await
            }
        };
        match result {
            Ok(secret) => SecretRoots::read(&secret),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(CaStoreError::Conflict),
            Err(err) => Err(err.into()),
        }
    }
}

/// An operator's root from files (`--ca-cert`, `--ca-key`), used as is.
pub fn from_files(cert: &Path, key: &Path) -> Result<StoredRoots, CaStoreError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| CaStoreError::File {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok(StoredRoots {
        cert_pem: read(cert)?,
        key_pem: read(key)?,
        retiring_pem: String::new(),
        cross_pem: String::new(),
        managed: false,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn retiring_roots_are_trusted_until_the_last_certificate_they_issued_expires() {
        let t0 = SystemTime::now();
        let first = StoredRoots::generate(365 * DAY, t0).unwrap();
        let before = first.bundle(HOUR, t0).unwrap();
        let t1 = t0 + 10 * DAY;
        let second = first.rotated(&before, 365 * DAY, t1).unwrap();
        let during = second
            .bundle(HOUR, t1 + 30 * 60 * Duration::from_secs(1))
            .unwrap();
        assert_eq!(
            during.trusted().count(),
            2,
            "old and new during the overlap"
        );
        assert_ne!(
            during.signer.root().fingerprint,
            before.signer.root().fingerprint,
            "issuing switched at once"
        );
        assert_eq!(
            during.retiring[0].fingerprint,
            before.signer.root().fingerprint
        );
        let lagging = second
            .bundle(HOUR, t1 + HOUR + 2 * 60 * Duration::from_secs(1))
            .unwrap();
        assert_eq!(
            lagging.trusted().count(),
            2,
            "kept a tenth of a validity longer (replica lag)"
        );
        let after = second
            .bundle(HOUR, t1 + HOUR + 7 * 60 * Duration::from_secs(1))
            .unwrap();
        assert_eq!(
            after.trusted().count(),
            1,
            "old dropped after a certificate's life"
        );
        assert!(second.pruned(&after).retiring_pem.is_empty());
        assert_eq!(
            second.pruned(&during).retiring_pem,
            first.cert_pem,
            "pruning keeps what is still trusted"
        );
    }

    #[test]
    fn rotation_is_due_at_two_thirds_of_the_life() {
        let t0 = SystemTime::now();
        let roots = StoredRoots::generate(300 * DAY, t0).unwrap();
        let bundle = roots.bundle(HOUR, t0).unwrap();
        let due = rotation_time(bundle.signer.root());
        let expected = t0 + 200 * DAY;
        let off = due
            .duration_since(expected)
            .unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_secs(120), "{off:?}");
    }

    #[test]
    fn sqlite_writes_are_compare_and_swap() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteRoots::open(&dir.path().join("dubbo-cp.db")).unwrap();
        assert!(store.load().unwrap().is_none());
        let roots = StoredRoots::generate(DAY, SystemTime::now()).unwrap();
        let v1 = store.write(&roots, None).unwrap();
        assert!(matches!(
            store.write(&roots, None),
            Err(CaStoreError::Conflict)
        ));
        let (loaded, version) = store.load().unwrap().unwrap();
        assert_eq!((loaded, version), (roots.clone(), v1));
        assert!(store.write(&roots, Some(v1)).is_ok());
    }
}
