//! Compiles `proto/` with a pure-Rust protobuf compiler so a fresh machine needs no `protoc`,
//! and keeps the file descriptor set for gRPC reflection.
use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "snp.proto",
    "snp_networking.proto",
    "dds.proto",
    "rules.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Reflection needs the encoded set; `compile_fds` does not write it, so write it here.
    std::fs::write(
        out_dir.join("dubbo_cp_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        // Maps (DynamicConfig parameters) encode in key order: the same rule always encodes to
        // the same bytes, so an unchanged object is recognised and never re-sent.
        .btree_map(".")
        // `dubbo-cp watch -o json` prints what clients receive under the wire's JSON names.
        .type_attribute(
            ".dubbo.apache.org.v1alpha1",
            "#[derive(serde::Serialize)] #[serde(rename_all = \"camelCase\")]",
        )
        // Responses carry a pre-encoded payload shared by every stream (see src/dds/wire.rs).
        .extern_path(
            ".org.apache.dubbo.auth.v1alpha1.ObserveResponse",
            "crate::dds::wire::ObserveResponse",
        )
        .compile_fds(descriptors)?;
    // The CA tests' client: generated from ca.proto alone with default settings, so the tests
    // talk to the server through types that share nothing with it (OUT_DIR/independent).
    let independent = out_dir.join("independent");
    std::fs::create_dir_all(&independent)?;
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir(&independent)
        .compile_fds(protox::compile(["ca.proto"], ["proto"])?)?;
    Ok(())
}
