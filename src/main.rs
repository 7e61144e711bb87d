use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = dubbo_cp::cli::Cli::parse();
    match dubbo_cp::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("dubbo-cp: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
