use clap::Parser;

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
