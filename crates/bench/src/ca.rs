//! `dubbo-cp-bench ca`: certificates issued per second by the real binary in its own process,
//! as a cold start of many pods sees it: every pod (a distinct identity with its own dubbo-jwt
//! token, prepared beforehand through the admin API) sends one `CreateIdentity` with a fresh
//! P-256 CSR, a bounded number in flight.

use std::sync::Arc;

use anyhow::Context;
use dubbo_cp::pb::ca::IdentityRequest;
use dubbo_cp::pb::ca::authority_service_client::AuthorityServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

use crate::fanout::spawn_server_in;
use crate::load::{ms, run_load};

#[derive(clap::Args, Clone)]
pub struct CaArgs {
    /// Pods asking for a certificate, each once.
    #[arg(long, default_value_t = 5000)]
    pub pods: usize,
    /// Requests in flight at once.
    #[arg(long, value_delimiter = ',', default_value = "64")]
    pub in_flight: Vec<usize>,
    /// Connections the requests share.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
}

fn csr() -> anyhow::Result<String> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    Ok(rcgen::CertificateParams::new(Vec::<String>::new())?
        .serialize_request(&key)?
        .pem()?)
}

/// An admin-issued dubbo-jwt token for `spiffe_id` (the server runs without authentication,
/// so loopback callers are admins).
async fn token_for(admin: std::net::SocketAddr, spiffe_id: &str) -> anyhow::Result<String> {
    let body = serde_json::json!({"csr": csr()?, "spiffeId": spiffe_id}).to_string();
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    stream
        .write_all(
            format!(
                "POST /api/v1/ca/issue HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let json = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let value: serde_json::Value =
        serde_json::from_str(json).with_context(|| format!("bad issue answer: {response}"))?;
    value["token"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no token in {value}"))
}

pub async fn run(args: CaArgs) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "# dubbo-cp-bench ca: {} pods, one CreateIdentity each (P-256 CSR, dubbo-jwt), real binary, {cpus} cpus",
        args.pods
    );
    println!(
        "{:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "in_flight", "certs/s", "total_s", "p50_ms", "p99_ms", "max_ms", "errors"
    );
    for &in_flight in &args.in_flight {
        // A fresh process per run; pacing off (each pod asks once anyway).
        let server = spawn_server_in(
            tempfile::tempdir()?,
            &[
                "--ca-issues-per-second",
                "1000000",
                "--ca-issue-burst",
                "1000000",
            ],
        )?;
        let mut tokens = Vec::with_capacity(args.pods);
        for pod in 0..args.pods {
            tokens.push(
                token_for(
                    server.admin_addr,
                    &format!("spiffe://cluster.local/ns/bench/sa/pod-{pod}"),
                )
                .await?,
            );
        }
        let csrs: Vec<String> = (0..args.pods)
            .map(|_| csr())
            .collect::<anyhow::Result<_>>()?;
        let mut clients = Vec::with_capacity(args.connections);
        for _ in 0..args.connections.max(1) {
            let channel = Channel::from_shared(format!("http://{}", server.grpc_addr))?
                .connect()
                .await?;
            clients.push(AuthorityServiceClient::new(channel));
        }
        let (tokens, csrs, clients) = (Arc::new(tokens), Arc::new(csrs), Arc::new(clients));
        let started = std::time::Instant::now();
        let result = run_load(args.pods, in_flight, |pod| {
            let mut client = clients[pod % clients.len()].clone();
            let (tokens, csrs) = (tokens.clone(), csrs.clone());
            async move {
                let mut request = tonic::Request::new(IdentityRequest {
                    csr: csrs[pod].clone(),
                    ..IdentityRequest::default()
                });
                let Ok(bearer) = format!("Bearer {}", tokens[pod]).parse() else {
                    return false;
                };
                request.metadata_mut().insert("authorization", bearer);
                request.metadata_mut().insert(
                    "authorization-type",
                    tonic::metadata::MetadataValue::from_static("dubbo-jwt"),
                );
                matches!(client.create_identity(request).await, Ok(r) if r.get_ref().success)
            }
        })
        .await?;
        println!(
            "{:>10} {:>12.0} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>8}",
            in_flight,
            result.per_second,
            started.elapsed().as_secs_f64(),
            ms(result.p50),
            ms(result.p99),
            ms(result.max),
            result.errors
        );
        drop(server);
    }
    Ok(())
}
