//! Compiles the client of the CA's service (`proto/ca.proto`) with a pure-Rust protobuf
//! compiler: the agent speaks the CA's protocol and needs none of the server's crates.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto/ca.proto");
    let descriptors = protox::compile(["ca.proto"], ["../../proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
