//! Compiles the CA's service (`proto/ca.proto`, wire.md §6) with a pure-Rust protobuf compiler,
//! so a fresh machine needs no `protoc`; keeps its descriptors for gRPC reflection.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto/ca.proto");
    let descriptors = protox::compile(["ca.proto"], ["../../proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("ca_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
