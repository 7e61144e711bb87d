//! The CA tests' client: generated from `proto/ca.proto` alone with default settings, so the tests
//! talk to the server through types that share nothing with it (`OUT_DIR/independent`). Each
//! edge crate generates the code it serves from in its own build script.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/ca.proto");
    let independent = PathBuf::from(std::env::var("OUT_DIR")?).join("independent");
    std::fs::create_dir_all(&independent)?;
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir(&independent)
        .compile_fds(protox::compile(["ca.proto"], ["proto"])?)?;
    Ok(())
}
