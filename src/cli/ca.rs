//! `dubbo-cp ca show | root | rotate | issue`: clients of the admin API's CA endpoints.

use std::path::Path;

use anyhow::Context;

use super::rules::{AdminArg, request};

#[derive(Debug, clap::Subcommand)]
pub enum CaCommand {
    /// Print the trusted roots: state, fingerprint, validity.
    Show {
        #[command(flatten)]
        admin: AdminArg,
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace the active root now; the old one stays trusted until its certificates expire.
    Rotate {
        #[command(flatten)]
        admin: AdminArg,
    },
    /// Issue a certificate for an identity from a CSR (PEM), printing it as PEM.
    Issue {
        #[command(flatten)]
        admin: AdminArg,
        /// The CSR file (`-` for standard input).
        #[arg(long)]
        csr: std::path::PathBuf,
        /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
        #[arg(long)]
        spiffe_id: String,
        /// Sign an identity whose trust domain is not the CA's own (refused otherwise).
        #[arg(long)]
        allow_other_trust_domain: bool,
    },
    /// Print the root bundle (PEM) a client should trust: every root, the active one first.
    Root {
        #[command(flatten)]
        admin: AdminArg,
    },
}

pub async fn run(command: CaCommand) -> anyhow::Result<()> {
    match command {
        CaCommand::Show { admin, json } => {
            let view = request(&admin, "GET", "/api/v1/ca", None).await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print_view(&view);
            }
            Ok(())
        }
        CaCommand::Rotate { admin } => {
            let view = request(&admin, "POST", "/api/v1/ca/rotate", None).await?;
            outln!(
                "rotated: issuing from the new root; the old one is trusted until its certificates expire"
            );
            print_view(&view);
            Ok(())
        }
        CaCommand::Root { admin } => {
            // Public (no admin identity needed): a workload's set-up runs it before it has one.
            let pem = super::rules::request_text(&admin, "/api/v1/ca/roots").await?;
            anyhow::ensure!(pem.contains("BEGIN CERTIFICATE"), "the CA answered no root");
            out!("{pem}");
            Ok(())
        }
        CaCommand::Issue {
            admin,
            csr,
            spiffe_id,
            allow_other_trust_domain,
        } => {
            let csr = read(&csr)?;
            let body = serde_json::json!({
                "csr": csr, "spiffeId": spiffe_id,
                "allowOtherTrustDomain": allow_other_trust_domain,
            })
            .to_string();
            let issued = request(&admin, "POST", "/api/v1/ca/issue", Some(body)).await?;
            out!("{}", issued["certPem"].as_str().unwrap_or_default());
            eprintln!(
                "valid until {}; trust: {} root(s)",
                issued["expireTime"].as_str().unwrap_or("?"),
                issued["trustCerts"].as_array().map_or(0, Vec::len)
            );
            Ok(())
        }
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read the CSR from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn print_view(view: &serde_json::Value) {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_owned();
    outln!(
        "managed: {}   certificate validity: {}   next rotation: {}",
        view["managed"].as_bool().unwrap_or(false),
        text(&view["certValidity"]),
        text(&view["rotationDue"]),
    );
    outln!(
        "{:<9} {:<21} {:<21} {:<21} FINGERPRINT (SHA-256)",
        "STATE",
        "NOT BEFORE",
        "NOT AFTER",
        "DROPPED AFTER"
    );
    for root in view["roots"].as_array().into_iter().flatten() {
        outln!(
            "{:<9} {:<21} {:<21} {:<21} {}",
            text(&root["state"]),
            text(&root["notBefore"]),
            text(&root["notAfter"]),
            text(&root["dropAfter"]),
            text(&root["fingerprint"]),
        );
    }
}
