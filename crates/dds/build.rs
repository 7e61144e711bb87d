//! Compiles the discovery stream's protos (`proto/dds.proto`, `proto/rules.proto`) with a
//! pure-Rust protobuf compiler, so a fresh machine needs no `protoc`; keeps their descriptors for
//! gRPC reflection.
use std::path::PathBuf;

const PROTOS: &[&str] = &["dds.proto", "rules.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=../../proto/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["../../proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("dds_descriptor.bin"),
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
        // Responses carry a pre-encoded payload shared by every stream (see src/wire.rs).
        .extern_path(
            ".org.apache.dubbo.auth.v1alpha1.ObserveResponse",
            "crate::wire::ObserveResponse",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
