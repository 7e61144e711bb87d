//! `src/dump/envoy.binpb` (the descriptors the config dump renders JSON with) is the closure of
//! `dubbo_cp_xds::dump::DUMPED_FILES` in the descriptor set `envoy-types` ships, without source
//! info. `DUBBO_CP_BLESS=1 cargo test -p dubbo-cp-xds --test descriptors` rewrites it, after an
//! `envoy-types` upgrade or a new type in a dump.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use prost::Message;
use prost_reflect::prost_types::{FileDescriptorProto, FileDescriptorSet};

/// `envoy-types`' own descriptor set, from its source in Cargo's registry, at the version
/// Cargo.lock names (`cargo metadata` with dependencies would want every platform's crates).
fn shipped() -> FileDescriptorSet {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"envoy-types\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("envoy-types in Cargo.lock");
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let sources = home.join("registry/src");
    let path = std::fs::read_dir(&sources)
        .unwrap_or_else(|e| panic!("{}: {e}", sources.display()))
        .filter_map(Result::ok)
        .map(|registry| {
            registry
                .path()
                .join(format!("envoy-types-{version}/src/generated/types.bin"))
        })
        .find(|path| path.exists())
        .unwrap_or_else(|| panic!("envoy-types {version} not under {}", sources.display()));
    let bytes = std::fs::read(&path).unwrap();
    FileDescriptorSet::decode(bytes.as_slice()).unwrap()
}

fn trimmed(set: FileDescriptorSet) -> FileDescriptorSet {
    let by_name: BTreeMap<String, FileDescriptorProto> = set
        .file
        .into_iter()
        .map(|file| (file.name().to_owned(), file))
        .collect();
    // Dependencies first, as a descriptor set lists them.
    fn visit(
        name: &str,
        by_name: &BTreeMap<String, FileDescriptorProto>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<FileDescriptorProto>,
    ) {
        if !seen.insert(name.to_owned()) {
            return;
        }
        let file = by_name
            .get(name)
            .unwrap_or_else(|| panic!("{name} not shipped"));
        for dependency in &file.dependency {
            visit(dependency, by_name, seen, out);
        }
        let mut file = file.clone();
        file.source_code_info = None;
        out.push(file);
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for name in dubbo_cp_xds::dump::DUMPED_FILES {
        visit(name, &by_name, &mut seen, &mut out);
    }
    FileDescriptorSet { file: out }
}

#[test]
fn the_dumps_descriptors_are_envoy_types_own() {
    let generated = trimmed(shipped()).encode_to_vec();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/dump/envoy.binpb");
    if std::env::var_os("DUBBO_CP_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    assert!(
        dubbo_cp_xds::dump::DESCRIPTORS == generated.as_slice(),
        "{} is stale: regenerate it with \
         `DUBBO_CP_BLESS=1 cargo test -p dubbo-cp-xds --test descriptors`, then build again",
        path.display()
    );
}
