use std::sync::Arc;

use envoy_types::util::pack_any;

use super::*;
use crate::clients::{Held, HeldResources, Nack, TypeStatus};
use crate::{LISTENER, ROUTE};

fn listener(name: &str) -> Arc<envoy_types::pb::google::protobuf::Any> {
    Arc::new(pack_any(crate::generate::listener(name)))
}

fn held(entries: &[(&str, u64)]) -> HeldResources {
    entries
        .iter()
        .map(|(name, nonce)| (name.to_string(), Held::sent(listener(name), None, *nonce)))
        .collect()
}

fn client(status: TypeStatus) -> ClientStatus {
    ClientStatus {
        node_id: "web-1".into(),
        namespace: "shop".into(),
        types: [(LISTENER, status), (ROUTE, TypeStatus::default())].into(),
        ..Default::default()
    }
}

fn rendered(status: TypeStatus) -> serde_json::Value {
    to_json(&client_config(&client(status))).expect("renders")
}

fn entry<'a>(json: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    json["generic_xds_configs"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {json:#}"))
}

#[test]
fn a_dump_holds_each_resource_sent_expanded_with_its_standing() {
    let json = rendered(TypeStatus {
        names: 1,
        sent: Some("7".into()),
        acked: Some("7".into()),
        held: held(&[("greeter:7070", 3)]),
        acked_nonce: 3,
        ..Default::default()
    });
    assert_eq!(json["node"]["id"], "web-1");
    assert_eq!(json["node"]["metadata"]["NAMESPACE"], "shop");
    assert_eq!(
        json["generic_xds_configs"].as_array().map(Vec::len),
        Some(1)
    );
    let listener = entry(&json, "greeter:7070");
    assert_eq!(listener["type_url"], LISTENER);
    assert_eq!(listener["version_info"], "7");
    assert_eq!(listener["client_status"], "ACKED");
    assert_eq!(listener["config_status"], "SYNCED");
    // The resource and the manager inside it are expanded, not base64.
    let config = &listener["xds_config"];
    assert_eq!(config["@type"], LISTENER);
    let manager = &config["api_listener"]["api_listener"];
    assert_eq!(
        manager["@type"],
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    );
    assert_eq!(manager["rds"]["route_config_name"], "greeter:7070");
}

#[test]
fn an_unanswered_response_is_stale_even_at_an_acknowledged_version() {
    // Version 7 was acknowledged in response 3; response 4 (same version, a new name) is not
    // answered yet.
    let json = rendered(TypeStatus {
        names: 2,
        sent: Some("7".into()),
        acked: Some("7".into()),
        held: held(&[("a:1", 4), ("b:1", 4)]),
        acked_nonce: 3,
        ..Default::default()
    });
    // UNKNOWN is the enum's default, which protobuf JSON leaves out.
    assert!(entry(&json, "a:1")["client_status"].is_null(), "{json:#}");
    assert_eq!(entry(&json, "a:1")["config_status"], "STALE");
}

#[test]
fn a_rejected_response_shows_the_message_the_rejected_and_the_kept_configuration() {
    let nack = Nack {
        version: "8".into(),
        message: "route has no domains".into(),
        nonce: 4,
    };
    let json = rendered(TypeStatus {
        names: 1,
        sent: Some("8".into()),
        acked: Some("7".into()),
        nack: Some(nack),
        held: held(&[("greeter:7070", 4)]),
        acked_nonce: 3,
        accepted: held(&[("greeter:7070", 3)]),
        ..Default::default()
    });
    let listener = entry(&json, "greeter:7070");
    assert_eq!(listener["client_status"], "NACKED");
    assert_eq!(listener["config_status"], "ERROR");
    assert_eq!(listener["error_state"]["details"], "route has no domains");
    assert_eq!(listener["error_state"]["version_info"], "8");
    assert_eq!(
        listener["error_state"]["failed_configuration"]["@type"],
        LISTENER
    );
    // What the client keeps: the acknowledged version.
    assert_eq!(listener["version_info"], "7");
    assert_eq!(listener["xds_config"]["@type"], LISTENER);
}

#[test]
fn delta_resources_stand_each_on_the_response_that_carried_them() {
    // a came in response 2 (acknowledged), b in response 5 (rejected): only b is NACKED.
    let nack = Nack {
        version: "9".into(),
        message: "bad b".into(),
        nonce: 5,
    };
    let entries: HeldResources = held(&[("a:1", 2), ("b:1", 5)])
        .into_iter()
        .map(|(name, mut held)| {
            held.version = Some("digest".into());
            (name, held)
        })
        .collect();
    let json = rendered(TypeStatus {
        names: 3,
        sent: Some("9".into()),
        acked: Some("6".into()),
        nack: Some(nack),
        held: entries,
        acked_nonce: 2,
        absent: ["zz:1".to_string()].into_iter().collect(),
        ..Default::default()
    });
    assert_eq!(entry(&json, "a:1")["client_status"], "ACKED");
    assert_eq!(entry(&json, "a:1")["version_info"], "digest");
    assert_eq!(entry(&json, "b:1")["client_status"], "NACKED");
    assert_eq!(entry(&json, "zz:1")["client_status"], "DOES_NOT_EXIST");
    assert_eq!(entry(&json, "zz:1")["config_status"], "NOT_SENT");
}
