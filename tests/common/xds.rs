//! xDS helpers the xDS test files share: the CLI's bootstrap, the ServiceEntry of the
//! walk-through's `greeter`, and applying a manifest through the rule API.

use std::net::SocketAddr;

/// `dubbo-cp bootstrap` with `args`: the bootstrap the released clients here start from.
pub async fn cli_bootstrap(args: &[&str]) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .arg("bootstrap")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The ServiceEntry of application `greeter` in `shop`: one endpoint per (port, weight).
pub fn greeter_entry(endpoints: &[(u16, u32)]) -> String {
    greeter_entry_of(
        endpoints
            .iter()
            .map(|(port, weight)| {
                serde_json::json!({"address": "127.0.0.1", "ports": {"grpc": port}, "weight": weight})
            })
            .collect(),
    )
}

/// The ServiceEntry of application `greeter` in `shop` with these endpoints.
pub fn greeter_entry_of(endpoints: Vec<serde_json::Value>) -> String {
    serde_json::json!({
        "apiVersion": "dubbo.apache.org/v1alpha1",
        "kind": "ServiceEntry",
        "metadata": {"name": "greeter", "namespace": "shop"},
        "spec": {
            "hosts": ["greeter"],
            "ports": [{"number": 7070, "name": "grpc", "protocol": "GRPC"}],
            "endpoints": endpoints,
        },
    })
    .to_string()
}

pub async fn apply(admin: SocketAddr, manifest: &str) {
    let (status, body) = super::http_send(admin, "POST", "/api/v1/apply", manifest, None).await;
    assert_eq!(status, 200, "{body}");
}
