use clap::Parser;

// mimalloc (its v2 line) instead of glibc malloc for Rust's allocations: the registration path
// allocates and frees small objects across threads (h2 frames, strings, BTreeMap nodes), and
// glibc's malloc, free and consolidation were ~13 % of the server's samples. SQLite keeps
// calling libc's malloc. Only this binary: the benchmark's bare-tonic ceiling keeps the system
// allocator. BENCHMARKS.md has the before/after. `--cfg system_allocator` keeps glibc's, which
// heap profilers see.
#[cfg(not(system_allocator))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = dubbo_cp::cli::Cli::parse();
    match dubbo_cp::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // Each cause once: transport errors often repeat their source's text.
            eprintln!("dubbo-cp: {}", dubbo_cp::cli::error_chain(err.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
