//! Registration throughput with every party in its own process: the real `dubbo-cp` binary,
//! the bare-tonic ceiling (`dubbo-cp-bench ceiling`, a child process), and this process as the
//! load generator. In-process figures share one runtime between server and generator, which
//! hides what the server's own process costs; this is the comparison that counts.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

use super::drive_grpc;
use super::fanout::spawn_server_in;
use super::load::{RunResult, ms};

#[derive(clap::Args, Clone)]
pub struct SeparateArgs {
    /// Requests in flight at once.
    #[arg(long, default_value_t = 128)]
    pub in_flight: usize,
    /// HTTP/2 connections the requests share.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Requests per measurement.
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
}

/// The ceiling server in a child process.
pub(crate) struct Ceiling {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Drop for Ceiling {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn spawn_ceiling() -> anyhow::Result<Ceiling> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["ceiling", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the ceiling process")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix("listening ") else {
        bail!("unexpected first line from the ceiling process: {line:?}");
    };
    let addr = addr.parse()?;
    Ok(Ceiling { child, addr })
}

/// `dubbo-cp-bench ceiling`: serves the bare server until killed.
pub async fn serve_ceiling(addr: SocketAddr) -> anyhow::Result<()> {
    let addr = super::ceiling::start_on(addr).await?;
    println!("listening {addr}");
    std::future::pending::<()>().await;
    Ok(())
}

fn row(label: &str, result: &RunResult) {
    println!(
        "| {label} | {:.0} | {:.3} | {:.3} | {} |",
        result.per_second,
        ms(result.p50),
        ms(result.p99),
        result.errors
    );
}

pub async fn run(args: SeparateArgs) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "# separate processes: {} requests, {} in flight over {} connections, {cpus} cpus",
        args.requests, args.in_flight, args.connections
    );
    println!("| target | req/s | p50 ms | p99 ms | errors |");
    println!("|---|---|---|---|---|");
    let drive = |target: String, run: usize| async move {
        drive_grpc(
            &target,
            args.requests,
            args.in_flight,
            args.connections,
            run,
            1,
        )
        .await
    };
    let ceiling = spawn_ceiling()?;
    let bare = drive(format!("http://{}", ceiling.addr), 0).await?;
    drop(ceiling);
    row("bare tonic (ceiling)", &bare);

    let server = spawn_server_in(tempfile::tempdir()?, &[])?;
    let target = format!("http://{}", server.grpc_addr);
    let new_pairs = drive(target.clone(), 0).await?;
    row("dubbo-cp, new pairs (durable)", &new_pairs);
    // The same requests again: every pair is stored, so each is answered from memory.
    let present = drive(target, 0).await?;
    row("dubbo-cp, present pairs", &present);
    drop(server);

    println!();
    println!(
        "new pairs / ceiling: {:.2}; present pairs / ceiling: {:.2}",
        new_pairs.per_second / bare.per_second,
        present.per_second / bare.per_second
    );
    Ok(())
}
