//! Compiles the registration service (`proto/snp.proto`, and `proto/snp_networking.proto`, the
//! same service under the other lineage's package) with a pure-Rust protobuf compiler, so a fresh
//! machine needs no `protoc`; keeps their descriptors for gRPC reflection.
use std::path::PathBuf;

const PROTOS: &[&str] = &["snp.proto", "snp_networking.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=../../proto/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["../../proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("ingest_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
