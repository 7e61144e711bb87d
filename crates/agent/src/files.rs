//! The three files in `--out`, as gRPC's `file_watcher` certificate provider reads them: each
//! replaced atomically (a temporary file in the same directory, fsync, rename, fsync of the
//! directory), the key created with mode 0600.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::pki::{self, Leaf};
use dubbo_cp_kit::workload::{CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE};

/// The files as they are on disk, when they are usable together.
#[derive(Debug, Clone)]
pub struct OnDisk {
    pub leaf: Leaf,
    /// DER of every root in `root-cert.pem`.
    pub roots: Vec<Vec<u8>>,
}

/// What a successful request hands to [`write`].
pub struct NewFiles<'a> {
    pub key_pem: &'a str,
    /// Leaf first, then what the CA sent after it.
    pub chain: &'a [Vec<u8>],
    pub roots: &'a [Vec<u8>],
}

pub fn path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

fn read(dir: &Path, name: &str) -> Result<String, String> {
    let file = path(dir, name);
    std::fs::read_to_string(&file).map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            format!("{} is missing", file.display())
        } else {
            format!("cannot read {}: {err}", file.display())
        }
    })
}

/// The certificate, key and roots in `dir`, if they are there, parse, and the key is the
/// certificate's. Expiry is the caller's to judge.
pub fn inspect(dir: &Path) -> Result<OnDisk, String> {
    let chain_text = read(dir, CERT_CHAIN_FILE)?;
    let key_text = read(dir, KEY_FILE)?;
    let roots_text = read(dir, ROOT_CERT_FILE)?;
    let in_file = |name: &str, reason: String| format!("{}: {reason}", path(dir, name).display());
    let chain = pki::certificates(&chain_text).map_err(|e| in_file(CERT_CHAIN_FILE, e))?;
    let leaf_der = chain
        .first()
        .ok_or_else(|| in_file(CERT_CHAIN_FILE, "holds no certificate".to_owned()))?;
    let leaf = Leaf::read(leaf_der).map_err(|e| in_file(CERT_CHAIN_FILE, e))?;
    leaf.matches_key(&key_text)
        .map_err(|e| in_file(KEY_FILE, e))?;
    let roots = pki::certificates(&roots_text).map_err(|e| in_file(ROOT_CERT_FILE, e))?;
    if roots.is_empty() {
        return Err(in_file(ROOT_CERT_FILE, "holds no certificate".to_owned()));
    }
    Ok(OnDisk { leaf, roots })
}

/// The roots in `root-cert.pem` now (none when it is missing or unreadable).
pub fn roots_on_disk(dir: &Path) -> Vec<Vec<u8>> {
    read(dir, ROOT_CERT_FILE)
        .ok()
        .and_then(|text| pki::certificates(&text).ok())
        .unwrap_or_default()
}

/// Writes the new key and chain, and the roots when they differ from those on disk.
///
/// Order: `root-cert.pem` first, so whatever the new chain was issued from is trusted by the
/// time the chain appears; then the key and the chain are both written to temporary files and
/// synced, and only then renamed back to back, key first and chain last. gRPC reads the pair
/// together, noting both files' modification times before and after reading and reading again
/// when either changed (grpc-core, grpc-java; grpc-go refuses a key that does not match and
/// keeps what it had), so a mismatched pair can only be seen by a read that falls entirely
/// between the two renames, microseconds apart, and the next read (60 s later in our bootstrap)
/// heals it. Chain last, because readers that watch one file for changes watch the
/// certificate: when it changes, the key that goes with it is already in place. A crash between
/// the renames leaves a pair that does not match; at the next start [`inspect`] says so and
/// the agent issues again at once.
pub fn write(dir: &Path, new: &NewFiles<'_>) -> Result<(), String> {
    if roots_on_disk(dir) != new.roots {
        replace(
            dir,
            ROOT_CERT_FILE,
            pki::to_pem(new.roots).as_bytes(),
            0o644,
        )?;
    }
    let key = Staged::new(dir, KEY_FILE, new.key_pem.as_bytes(), 0o600)?;
    let chain = Staged::new(
        dir,
        CERT_CHAIN_FILE,
        pki::to_pem(new.chain).as_bytes(),
        0o644,
    )?;
    key.commit()?;
    chain.commit()?;
    sync_dir(dir)
}

/// One file replaced atomically.
fn replace(dir: &Path, name: &str, content: &[u8], mode: u32) -> Result<(), String> {
    Staged::new(dir, name, content, mode)?.commit()?;
    sync_dir(dir)
}

/// A temporary file beside its target, written and synced; removed when dropped uncommitted.
struct Staged {
    temporary: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Staged {
    fn new(dir: &Path, name: &str, content: &[u8], mode: u32) -> Result<Staged, String> {
        let temporary = path(dir, &format!(".{name}.tmp"));
        let target = path(dir, name);
        // A leftover of a crash (one agent per directory, so never another's): removed, then
        // created afresh with O_EXCL, which neither follows a symlink nor reuses a file whose
        // mode might be wider than `mode`.
        match std::fs::remove_file(&temporary) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(format!("cannot remove {}: {err}", temporary.display())),
        }
        let staged = Staged {
            temporary,
            target,
            committed: false,
        };
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&staged.temporary)
            .and_then(|mut file| {
                file.write_all(content)?;
                file.sync_all()
            });
        written.map_err(|err| format!("cannot write {}: {err}", staged.temporary.display()))?;
        Ok(staged)
    }

    fn commit(mut self) -> Result<(), String> {
        std::fs::rename(&self.temporary, &self.target).map_err(|err| {
            format!(
                "cannot rename {} to {}: {err}",
                self.temporary.display(),
                self.target.display()
            )
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

/// Makes the renames durable.
fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|err| format!("cannot sync directory {}: {err}", dir.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn writes_atomically_with_a_private_key_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = rcgen::CertifiedIssuer::self_signed(
            {
                let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
                params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                params
            },
            rcgen::KeyPair::generate().unwrap(),
        )
        .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .signed_by(&key, &root)
            .unwrap();
        assert!(inspect(dir.path()).unwrap_err().contains("missing"));
        // A stale temporary key with a wide mode is replaced, not reused.
        std::fs::write(dir.path().join(".key.pem.tmp"), "old").unwrap();
        std::fs::set_permissions(
            dir.path().join(".key.pem.tmp"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        let key_pem = key.serialize_pem();
        let chain = [leaf.der().to_vec()];
        let roots = [root.der().to_vec()];
        write(
            dir.path(),
            &NewFiles {
                key_pem: &key_pem,
                chain: &chain,
                roots: &roots,
            },
        )
        .unwrap();
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let on_disk = inspect(dir.path()).unwrap();
        assert_eq!(on_disk.roots, roots);
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE]);
        // A key that is not the certificate's is found out.
        std::fs::write(
            dir.path().join(KEY_FILE),
            rcgen::KeyPair::generate().unwrap().serialize_pem(),
        )
        .unwrap();
        assert!(
            inspect(dir.path())
                .unwrap_err()
                .contains("not the certificate's")
        );
    }
}
