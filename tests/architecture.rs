//! The rules of ARCHITECTURE.md as a test: which crate may depend on which (read from
//! `cargo metadata`), and no new import circle between the modules of a crate.
// A test's helpers: a missing field in cargo's own output is a failed test, said by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What no protocol edge, source or sink may see: the wire formats and the Kubernetes client.
const PROTOCOLS: &[&str] = &[
    "prost",
    "tonic",
    "envoy-types",
    "dubbo-cp-dds",
    "dubbo-cp-ingest",
    "dubbo-cp-xds",
];

/// Per crate: crates it must not depend on (by name prefix), normal and build dependencies.
const FORBIDDEN: &[(&str, &[&str])] = &[
    // The domain: no I/O, no protobuf, no runtime, no Kubernetes (the custom resources are
    // derived over its specs in dubbo-cp-crds).
    (
        "dubbo-cp-domain",
        &[
            "dubbo-cp",
            "kube",
            "k8s-openapi",
            "prost",
            "tonic",
            "tokio",
            "rusqlite",
            "hyper",
            "axum",
            "prometheus",
            "notify",
            "moka",
        ],
    ),
    (
        "dubbo-cp-index",
        &[
            "dubbo-cp-index-",
            "dubbo-cp-bench",
            "prost",
            "tonic",
            "kube",
            "k8s-openapi",
            "rusqlite",
            "hyper",
            "axum",
        ],
    ),
    (
        "dubbo-cp-kit",
        &[
            "dubbo-cp",
            "kube",
            "k8s-openapi",
            "prost",
            "tonic",
            "rusqlite",
        ],
    ),
    // The protocol edges: no Kubernetes client, no database; the discovery stream reads the
    // index and never the store.
    (
        "dubbo-cp-dds",
        &[
            "kube",
            "k8s-openapi",
            "rusqlite",
            "dubbo-cp-store",
            "dubbo-cp-k8s",
        ],
    ),
    (
        "dubbo-cp-ingest",
        &[
            "kube",
            "k8s-openapi",
            "rusqlite",
            "dubbo-cp-k8s",
            "dubbo-cp-index",
        ],
    ),
    // The custom resources: types only (kube's derive, checked below), no runtime, no protocol.
    (
        "dubbo-cp-crds",
        &[
            "tokio",
            "prost",
            "tonic",
            "rusqlite",
            "hyper",
            "dubbo-cp-index",
        ],
    ),
    (
        "dubbo-cp-xds",
        &[
            "kube",
            "k8s-openapi",
            "rusqlite",
            "dubbo-cp-store",
            "dubbo-cp-k8s",
            "dubbo-cp-dds",
            "dubbo-cp-ingest",
        ],
    ),
    // Sources, sinks and the debouncer between them: no protocol.
    ("dubbo-cp-store", PROTOCOLS),
    ("dubbo-cp-k8s", PROTOCOLS),
    (
        "dubbo-cp-zookeeper",
        &[
            "prost",
            "tonic",
            "envoy-types",
            "dubbo-cp-dds",
            "dubbo-cp-ingest",
            "dubbo-cp-xds",
            "kube",
            "k8s-openapi",
            "dubbo-cp-k8s",
        ],
    ),
    ("dubbo-cp-debounce", PROTOCOLS),
    ("dubbo-cp-canary", PROTOCOLS),
    // The workload side: the CA's protocol (its own client) and the kit, nothing of the
    // server's, no Kubernetes client, no database.
    (
        "dubbo-cp-agent",
        &[
            "kube",
            "k8s-openapi",
            "rusqlite",
            "dubbo-cp-ca",
            "dubbo-cp-xds",
            "dubbo-cp-admin",
            "dubbo-cp-store",
        ],
    ),
];

/// Our crates each may depend on; any other edge between our crates is refused.
const OURS: &[(&str, &[&str])] = &[
    ("dubbo-cp-domain", &[]),
    ("dubbo-cp-kit", &[]),
    ("dubbo-cp-index", &["dubbo-cp-domain"]),
    ("dubbo-cp-debounce", &["dubbo-cp-domain", "dubbo-cp-kit"]),
    ("dubbo-cp-auth", &["dubbo-cp-domain", "dubbo-cp-kit"]),
    ("dubbo-cp-crds", &["dubbo-cp-domain"]),
    (
        "dubbo-cp-xds",
        &["dubbo-cp-domain", "dubbo-cp-index", "dubbo-cp-kit"],
    ),
    (
        "dubbo-cp-canary",
        &["dubbo-cp-domain", "dubbo-cp-crds", "dubbo-cp-kit"],
    ),
    (
        "dubbo-cp-store",
        &[
            "dubbo-cp-domain",
            "dubbo-cp-index",
            "dubbo-cp-kit",
            "dubbo-cp-debounce",
        ],
    ),
    (
        "dubbo-cp-k8s",
        &[
            "dubbo-cp-domain",
            "dubbo-cp-crds",
            "dubbo-cp-index",
            "dubbo-cp-kit",
            "dubbo-cp-debounce",
            "dubbo-cp-store",
            "dubbo-cp-auth",
            "dubbo-cp-canary",
        ],
    ),
    (
        "dubbo-cp-zookeeper",
        &[
            "dubbo-cp-domain",
            "dubbo-cp-index",
            "dubbo-cp-kit",
            "dubbo-cp-debounce",
            "dubbo-cp-store",
        ],
    ),
    ("dubbo-cp-ca", &["dubbo-cp-kit", "dubbo-cp-auth"]),
    ("dubbo-cp-agent", &["dubbo-cp-kit"]),
    (
        "dubbo-cp-webhook",
        &[
            "dubbo-cp-kit",
            "dubbo-cp-ca",
            "dubbo-cp-domain",
            "dubbo-cp-xds",
        ],
    ),
    (
        "dubbo-cp-ingest",
        &[
            "dubbo-cp-domain",
            "dubbo-cp-kit",
            "dubbo-cp-auth",
            "dubbo-cp-store",
        ],
    ),
    (
        "dubbo-cp-dds",
        &[
            "dubbo-cp-domain",
            "dubbo-cp-index",
            "dubbo-cp-kit",
            "dubbo-cp-auth",
        ],
    ),
    (
        "dubbo-cp-admin",
        &[
            "dubbo-cp-domain",
            "dubbo-cp-index",
            "dubbo-cp-kit",
            "dubbo-cp-auth",
            "dubbo-cp-ca",
            "dubbo-cp-canary",
            "dubbo-cp-dds",
            "dubbo-cp-xds",
            "dubbo-cp-k8s",
            "dubbo-cp-store",
            "dubbo-cp-zookeeper",
        ],
    ),
    (
        "dubbo-cp",
        &[
            "dubbo-cp-domain",
            "dubbo-cp-crds",
            "dubbo-cp-index",
            "dubbo-cp-kit",
            "dubbo-cp-debounce",
            "dubbo-cp-auth",
            "dubbo-cp-canary",
            "dubbo-cp-store",
            "dubbo-cp-k8s",
            "dubbo-cp-ca",
            "dubbo-cp-webhook",
            "dubbo-cp-ingest",
            "dubbo-cp-dds",
            "dubbo-cp-xds",
            "dubbo-cp-admin",
            "dubbo-cp-zookeeper",
            "dubbo-cp-agent",
        ],
    ),
    ("dubbo-cp-bench", &["dubbo-cp"]),
];

/// Circles between modules that are known and still to cut (ARCHITECTURE.md, "Still to cut"),
/// each as its sorted members. A new circle fails; a cut one must be removed from here. None
/// remain: the list stays so a circle someone must keep for a while is written down here.
const KNOWN_CIRCLES: &[&[&str]] = &[];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Debug)]
struct Package {
    name: String,
    /// Normal and build dependencies.
    dependencies: BTreeSet<String>,
    src: PathBuf,
}

/// `cargo metadata` of the workspace (no dependencies' own packages).
fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn packages() -> Vec<Package> {
    let metadata = metadata();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap().to_owned(),
            dependencies: p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect(),
            src: Path::new(p["manifest_path"].as_str().unwrap())
                .parent()
                .unwrap()
                .join("src"),
        })
        .collect()
}

#[test]
fn crates_depend_only_on_what_architecture_md_allows() {
    let packages = packages();
    let names: BTreeSet<&str> = packages.iter().map(|p| p.name.as_str()).collect();
    let listed: BTreeSet<&str> = OURS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names, listed,
        "every crate has a row in ARCHITECTURE.md and here"
    );
    let mut problems = Vec::new();
    for package in &packages {
        let allowed = OURS.iter().find(|(n, _)| *n == package.name).unwrap().1;
        for dependency in &package.dependencies {
            if names.contains(dependency.as_str()) && !allowed.contains(&dependency.as_str()) {
                problems.push(format!(
                    "{} -> {dependency}: not an allowed edge",
                    package.name
                ));
            }
        }
        if let Some((_, forbidden)) = FORBIDDEN.iter().find(|(n, _)| *n == package.name) {
            for dependency in &package.dependencies {
                if let Some(prefix) = forbidden.iter().find(|f| dependency.starts_with(**f)) {
                    problems.push(format!(
                        "{} -> {dependency}: {} must not depend on {prefix}*",
                        package.name, package.name
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Module path of a source file (`canary/mod.rs` -> `canary`, `lib.rs` -> ``).
/// The custom resources' crate holds types: kube without its client, runtime or default features.
#[test]
fn the_crds_crate_takes_kubes_derive_only() {
    let metadata = metadata();
    let crds = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "dubbo-cp-crds")
        .expect("the crds crate");
    let kube = crds["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "kube")
        .expect("kube, for the derive");
    assert_eq!(kube["uses_default_features"], false, "{kube}");
    assert_eq!(kube["features"], serde_json::json!(["derive"]), "{kube}");
}

fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            // Binaries are crates of their own.
            if path.file_name().is_some_and(|n| n != "bin") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The paths a file names: `crate::a::b` and `super::a` (resolved), grouped `crate::{a, b}`.
fn named_paths(module: &str, text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|p| {
                p.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|p| !p.is_empty() && p.chars().next().is_some_and(|c| c.is_lowercase()))
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                paths.push(ident(item.trim()));
            }
        } else {
            paths.push(ident(rest));
        }
    }
    let base: Vec<String> = module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("super::") {
            continue;
        }
        let mut rest = &code[i..];
        let mut up = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            up += 1;
            rest = r;
        }
        if up > base.len() {
            continue;
        }
        let mut path = base[..base.len() - up].to_vec();
        path.extend(ident(rest));
        paths.push(path);
    }
    paths
}

/// Circles between the modules of the crate whose sources are in `src`, ignoring a module's
/// edges to its own ancestors (a parent re-exporting its child's items is not a circle).
fn circles(src: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = module_of(src, file);
        let text = std::fs::read_to_string(file).unwrap();
        for path in named_paths(&from, &text) {
            // The longest prefix that is a module.
            let to = (1..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find(|m| modules.contains(m));
            let Some(to) = to else { continue };
            let related = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}::"));
            if related(&from, &to) || related(&to, &from) {
                continue;
            }
            edges.entry(from.clone()).or_default().insert(to);
        }
    }
    // Strongly connected components (Tarjan, iterative enough for a few hundred modules).
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        out: Vec<Vec<String>>,
    }
    fn visit(s: &mut State<'_>, v: &str) {
        let i = s.index.len();
        s.index.insert(v.to_owned(), i);
        s.low.insert(v.to_owned(), i);
        s.stack.push(v.to_owned());
        s.on_stack.insert(v.to_owned());
        let next: Vec<String> = s.edges.get(v).into_iter().flatten().cloned().collect();
        for w in next {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let low = s.low[v].min(s.low[&w]);
                s.low.insert(v.to_owned(), low);
            } else if s.on_stack.contains(&w) {
                let low = s.low[v].min(s.index[&w]);
                s.low.insert(v.to_owned(), low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                let done = w == v;
                component.push(w);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for module in &modules {
        if !state.index.contains_key(module) {
            visit(&mut state, module);
        }
    }
    state.out.sort();
    state.out
}

#[test]
fn no_new_import_circles_between_modules() {
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    let mut found = Vec::new();
    for package in packages() {
        for circle in circles(&package.src) {
            found.push((package.name.clone(), circle));
        }
    }
    let new: Vec<&(String, Vec<String>)> =
        found.iter().filter(|(_, c)| !known.contains(c)).collect();
    assert!(new.is_empty(), "new import circles: {new:#?}");
    let cut: Vec<&Vec<String>> = known
        .iter()
        .filter(|k| !found.iter().any(|(_, c)| c == *k))
        .collect();
    assert!(
        cut.is_empty(),
        "circles cut (remove them from KNOWN_CIRCLES and ARCHITECTURE.md): {cut:?}"
    );
}

#[test]
fn the_circle_finder_finds_circles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    std::fs::write(src.join("a/mod.rs"), "pub use x::X; mod x;").unwrap();
    std::fs::write(src.join("a/x.rs"), "use super::Y; use crate::b::B;").unwrap();
    std::fs::write(src.join("b.rs"), "use crate::{c::C, d};").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "// crate::a::x is only a comment\nuse crate::a::x::X;",
    )
    .unwrap();
    assert_eq!(circles(src), vec![vec!["a::x", "b", "c"]]);
    std::fs::write(src.join("c.rs"), "// crate::a::x\n").unwrap();
    assert!(circles(src).is_empty());
}

/// Lines a source file may hold before its unit tests (`#[cfg(test)]`), so every module stays
/// small enough to hold in one's head; big suites live in `tests/` or a `tests.rs` beside.
const MAX_LINES: usize = 800;

#[test]
fn no_source_file_is_over_800_lines_before_its_tests() {
    let mut long = Vec::new();
    for package in packages() {
        let mut files = Vec::new();
        rust_files(&package.src, &mut files);
        for file in files {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let code = text
                .lines()
                .take_while(|l| l.trim() != "#[cfg(test)]")
                .count();
            if code > MAX_LINES {
                long.push(format!("{}: {code} lines", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:#?}");
}
