//! The files a workload certificate is kept in (the agent's `--out`), as gRPC's `file_watcher`
//! certificate provider and the bootstraps name them.

pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";
pub const KEY_FILE: &str = "key.pem";
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
