use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::util::pack_any;

use super::*;
use crate::clients::{Held, Nack};
use crate::{LISTENER, ROUTE};

fn client(acked: Option<&str>, nack: Option<Nack>) -> ClientStatus {
    let listener = pack_any(crate::generate::listener("greeter:7070"));
    let held: BTreeMap<String, Held> = [(
        "greeter:7070".to_owned(),
        Held::sent(Arc::new(listener), None),
    )]
    .into();
    let status = TypeStatus {
        names: 1,
        sent: Some("7".into()),
        acked: acked.map(str::to_owned),
        nack,
        held: Arc::new(held),
        ..Default::default()
    };
    ClientStatus {
        node_id: "web-1".into(),
        namespace: "shop".into(),
        types: [(LISTENER, status), (ROUTE, TypeStatus::default())].into(),
        ..Default::default()
    }
}

#[test]
fn a_dump_holds_each_resource_sent_expanded_with_its_standing() {
    let json = to_json(&client_config(&client(Some("7"), None))).expect("renders");
    assert_eq!(json["node"]["id"], "web-1");
    assert_eq!(json["node"]["metadata"]["NAMESPACE"], "shop");
    let configs = json["generic_xds_configs"].as_array().expect("configs");
    assert_eq!(configs.len(), 1, "{json:#}");
    let listener = &configs[0];
    assert_eq!(listener["type_url"], LISTENER);
    assert_eq!(listener["name"], "greeter:7070");
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
fn a_rejected_version_is_nacked_with_the_clients_message_and_unanswered_is_stale() {
    let nack = Nack {
        version: "7".into(),
        message: "route has no domains".into(),
    };
    let json = to_json(&client_config(&client(Some("6"), Some(nack)))).expect("renders");
    let listener = &json["generic_xds_configs"][0];
    assert_eq!(listener["client_status"], "NACKED");
    assert_eq!(listener["config_status"], "ERROR");
    assert_eq!(listener["error_state"]["details"], "route has no domains");
    assert_eq!(listener["error_state"]["version_info"], "7");

    let json = to_json(&client_config(&client(Some("6"), None))).expect("renders");
    assert_eq!(json["generic_xds_configs"][0]["client_status"], "REQUESTED");
    assert_eq!(json["generic_xds_configs"][0]["config_status"], "STALE");
}
