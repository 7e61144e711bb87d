//! What operators see of xDS, on the real server with released gRPC clients (grpcio): the
//! dashboard's xDS clients table (with a client that NACKs), its services view and its paging,
//! the traffic split drawn and printed by `dubbo-cp xds split` against what a client measures
//! over 2,000 calls, and names that resolve to nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use std::net::SocketAddr;

use common::xds::{apply, cli_bootstrap, greeter_entry};
use common::{http_get, start, test_config};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use released::{Released, answers, backend, count, settle};

/// A stream that rejects the clusters it is sent (a NACK), as a client with a bad build would:
/// released clients accept what this server sends, so the test plays one.
async fn nacking_stream(xds: SocketAddr) -> tokio::sync::mpsc::Sender<DiscoveryRequest> {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: "nacker".into(),
            ..Default::default()
        }),
        type_url: dubbo_cp::xds::CLUSTER.into(),
        resource_names: vec!["outbound|7070||greeter.shop.svc.cluster.local".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}"))
        .await
        .unwrap();
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    tx.send(DiscoveryRequest {
        type_url: response.type_url,
        resource_names: vec!["outbound|7070||greeter.shop.svc.cluster.local".into()],
        response_nonce: response.nonce,
        error_detail: Some(envoy_types::pb::google::rpc::Status {
            code: 3,
            message: "cluster refused by this client".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    // The stream stays open while the sender lives; its responses are not read again.
    tokio::spawn(async move { while let Ok(Some(_)) = responses.message().await {} });
    tx
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_lists_xds_clients_their_subscriptions_and_a_nack() {
    let kind = Released::Grpcio;
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let xds = server.xds_addr.unwrap();
    apply(
        server.admin_addr,
        &greeter_entry(&[(port_a, 80), (port_b, 20)]),
    )
    .await;
    // Two released clients of their own node each, calling the ServiceEntry's host.
    let mut clients = Vec::new();
    for node in ["dash-one", "dash-two"] {
        let server = xds.to_string();
        let bootstrap =
            cli_bootstrap(&["--xds-server", &server, "-n", "shop", "--node-id", node]).await;
        let mut client = released::client_with(kind, "xds:///greeter:7070", bootstrap);
        settle(&mut client, "a", 1, "").await;
        clients.push(client);
    }
    let _nacker = nacking_stream(xds).await;
    // Enough services for the services view to page (100 a page), after greeter's namespace.
    let fleet: Vec<String> = (0..150)
        .map(|i| {
            format!(
                "apiVersion: dubbo.apache.org/v1alpha1\nkind: ServiceEntry\n\
                 metadata: {{name: svc-{i}, namespace: zoo}}\n\
                 spec: {{hosts: [svc-{i}], ports: [{{number: 7070, name: grpc}}], \
                 endpoints: [{{address: 10.9.{}.{}}}]}}\n",
                i / 200,
                i % 200 + 1
            )
        })
        .collect();
    apply(server.admin_addr, &fleet.join("---\n")).await;
    // What a released client measures, to hold the drawn split against.
    let counts = count(&mut clients[0], 2000).await;
    let measured = |who: &str| answers(&counts, who) as f64 / 20.0;
    let (share_a, share_b) = (measured("a"), measured("b"));
    let (address_a, address_b) = (format!("127.0.0.1:{port_a}"), format!("127.0.0.1:{port_b}"));

    let url = format!("http://{}/ui", server.admin_addr);
    let shot = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-xds.png");
    let shot_path = shot.clone();
    let split_shot =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-split.png");
    let split_path = split_shot.clone();
    let (expect_a, expect_b) = (address_a.clone(), address_b.clone());
    tokio::task::spawn_blocking(move || {
        let (address_a, address_b) = (expect_a, expect_b);
        let mut browser = common::browser::Browser::open(&url);
        browser.wait_for("document.body.dataset.loaded === 'true'");
        // Every kind the index serves, ServiceEntry with its 151 objects.
        browser.wait_for(
            "(document.querySelector('tr.kind[data-kind=\"ServiceEntry\"]')?.cells[1].textContent) === '151'",
        );
        // Both released clients, each with its four types in step, and their protocol.
        for node in ["dash-one", "dash-two"] {
            browser.wait_for(&format!(
                "[...document.querySelectorAll('tr.xds-client[data-node=\"{node}\"]')]\
                 .filter(r => !r.classList.contains('stale')).length === 4"
            ));
        }
        let protocol = browser.evaluate(
            "document.querySelector('tr.xds-client[data-node=\"dash-one\"]').cells[3].textContent",
        );
        assert_eq!(protocol, serde_json::json!("sotw"));
        // Versions read as the time they were published, the number itself in the title.
        let sent = browser.evaluate(
            "(c => [c.textContent, c.title])(document.querySelector('tr.xds-client[data-node=\"dash-one\"]').cells[7])",
        );
        let (text, title) = (sent[0].as_str().unwrap(), sent[1].as_str().unwrap());
        assert!(
            text.len() == 23 && text.starts_with("20") && text.as_bytes()[10] == b' ',
            "{sent}"
        );
        assert!(title.parse::<u64>().is_ok(), "{sent}");
        // The rejecting stream, with its message, and alone under the filter.
        browser.wait_for(
            "[...document.querySelectorAll('tr.xds-client.stale[data-node=\"nacker\"]')]\
             .some(r => r.textContent.includes('cluster refused by this client'))",
        );
        browser.evaluate("document.querySelector('#xds-stale-only').click()");
        browser.wait_for(
            "[...document.querySelectorAll('tr.xds-client')].length === 1 && \
             !!document.querySelector('tr.xds-client[data-node=\"nacker\"]')",
        );
        browser.evaluate("document.querySelector('#xds-stale-only').click()");
        browser.wait_for("document.querySelectorAll('tr.xds-client').length === 9");
        browser.evaluate("document.querySelector('#xds-clients').scrollIntoView()");
        browser.screenshot(&shot_path);

        // The ServiceEntry among the rules, as applied.
        browser.wait_for(
            "!!document.querySelector('#rules details[data-kind=\"ServiceEntry\"] .rule[data-name=\"greeter\"]')",
        );
        // The services view: greeter from its ServiceEntry, each endpoint with its weight.
        for (address, weight) in [(&address_a, "80"), (&address_b, "20")] {
            let port = address.rsplit(':').next().unwrap();
            browser.wait_for(&format!(
                "[...document.querySelectorAll('tr.service-endpoint[data-service=\"greeter\"]')]\
                 .some(r => r.cells[4].textContent.includes('{port}') && r.cells[5].textContent === '{weight}' \
                 && r.cells[3].textContent === 'ServiceEntry greeter/shop' && r.cells[8].textContent === 'serving')"
            ));
        }
        // The split drawn for what dash-one dials, against what it measured over 2,000 calls.
        let show = |browser: &mut common::browser::Browser, service: &str| {
            browser.evaluate(&format!(
                "document.querySelector('#split-service').value = '{service}';\
                 document.querySelector('#split-namespace').value = 'shop';\
                 document.querySelector('#split-form').requestSubmit()"
            ));
        };
        show(&mut browser, "greeter:7070");
        browser.wait_for("document.querySelectorAll('#split .split-row').length === 2");
        for (address, measured) in [(&address_a, share_a), (&address_b, share_b)] {
            let drawn = browser.evaluate(&format!(
                "Number(document.querySelector('#split .split-row[data-address=\"{address}\"]').dataset.share)"
            ));
            let drawn = drawn.as_f64().unwrap();
            assert!(
                (drawn - measured).abs() <= 5.0,
                "{address}: drawn {drawn} %, measured {measured} % of 2,000 calls"
            );
        }
        // A name nobody serves says so in the section.
        show(&mut browser, "nobody:7070");
        browser.wait_for(
            "document.querySelector('#split-route').textContent.includes('resolves to no service')",
        );
        show(&mut browser, "greeter:7070");
        browser.wait_for("document.querySelectorAll('#split .split-row').length === 2");
        browser.evaluate("document.querySelector('#services').scrollIntoView()");
        browser.screenshot(&split_path);

        // The services view pages: greeter and 99 of the fleet, then the other 51.
        browser.wait_for("document.querySelector('#services-count').textContent === '151 · 1-100 shown'");
        browser.evaluate("document.querySelector('#services-next').click()");
        browser.wait_for(
            "document.querySelector('#services-count').textContent === '151 · 101-151 shown' && \
             document.querySelectorAll('tr.service-endpoint').length === 51 && \
             !document.querySelector('tr.service-endpoint[data-service=\"greeter\"]')",
        );
        assert_eq!(
            browser.evaluate("document.querySelector('#services-next').disabled"),
            serde_json::json!(true)
        );
        browser.evaluate("document.querySelector('#services-prev').click()");
        browser.wait_for("!!document.querySelector('tr.service-endpoint[data-service=\"greeter\"]')");
        // The filter is the server's: one service of the 151.
        browser.evaluate(
            "const q = document.querySelector('#service-search'); q.value = 'svc-149';\
             q.dispatchEvent(new Event('input'))",
        );
        browser.wait_for(
            "document.querySelector('#services-count').textContent === '1' && \
             document.querySelectorAll('tr.service-endpoint').length === 1",
        );
    })
    .await
    .unwrap();
    {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "xDS dashboard screenshots: {} {}",
            shot.display(),
            split_shot.display()
        );
    }
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000));
    assert!(std::fs::metadata(&split_shot).is_ok_and(|m| m.len() > 10_000));

    // The services, a page at a time.
    let (status, body) = http_get(server.admin_addr, "/debug/services?limit=1&q=greet").await;
    // (151 services in all: greeter and the fleet.)
    assert_eq!(status, 200, "{body}");
    let services: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(services["matched"], 1, "{services}");
    assert_eq!(
        services["services"][0]["hosts"][1],
        "greeter.shop.svc.cluster.local"
    );
    assert_eq!(
        services["services"][0]["endpoints"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let (status, _) = http_get(server.admin_addr, "/debug/services?limit=5000").await;
    assert_eq!(status, 400, "a page is bounded");

    // The CLI prints the same split.
    let split_cli = |service: &'static str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .args(["xds", "split", service, "-n", "shop", "--admin"])
            .arg(server.admin_addr.to_string())
            .output()
    };
    let output = split_cli("greeter:7070").await.unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    for (address, measured) in [(&address_a, share_a), (&address_b, share_b)] {
        let line = printed
            .lines()
            .find(|l| l.starts_with(address.as_str()))
            .unwrap_or_else(|| panic!("{address} in\n{printed}"));
        let share: f64 = line
            .split_whitespace()
            .find_map(|w| w.strip_suffix('%'))
            .and_then(|w| w.parse().ok())
            .unwrap();
        assert!(
            (share - measured).abs() <= 5.0,
            "{line}: measured {measured} %"
        );
    }
    let output = split_cli("nobody:7070").await.unwrap();
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && error.contains("resolves to no service"),
        "{error}"
    );

    // The same through the API: a page of one, the counts over all, the stale one alone.
    let (_, body) = http_get(server.admin_addr, "/debug/xds?limit=1&offset=1").await;
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["clients"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(
        (page["total"].as_u64(), page["stale"].as_u64()),
        (Some(3), Some(1)),
        "{page}"
    );
    assert_eq!(page["truncated"], true, "{page}");
    let (_, body) = http_get(server.admin_addr, "/debug/xds?stale=true").await;
    let stale: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(stale["clients"][0]["node_id"], "nacker", "{stale}");
    assert!(
        stale["clients"][0]["stale"][0]
            .as_str()
            .unwrap()
            .contains("cluster refused by this client"),
        "{stale}"
    );
    for client in &mut clients {
        drop(client.child.start_kill());
    }
    server.stop().await.unwrap();
}

/// A name that resolves to nothing (here a typo of `greeter`) does not look like a hang to
/// operators: the server logs it (once per response that first says so: `newly_absent`'s unit
/// test), `dubbo-cp status` and `/debug/xds` list it as not found, and the dashboard shows it.
/// The real binary, for its log.
#[tokio::test(flavor = "multi_thread")]
async fn a_name_that_resolves_to_nothing_is_logged_and_shown_as_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let xds_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let xds = format!("127.0.0.1:{xds_port}");
    let process = common::spawn_binary(dir.path(), &["--xds-addr", &xds]);
    let admin = process.admin_addr;
    apply(admin, &greeter_entry(&[(7071, 1)])).await;
    let bootstrap = cli_bootstrap(&[
        "--xds-server",
        &xds,
        "-n",
        "shop",
        "--node-id",
        "typo-client",
    ])
    .await;
    let mut client = released::client_with(Released::Grpcio, "xds:///greter:7070", bootstrap);
    // One call makes the client subscribe; it fails, as it should.
    use tokio::io::AsyncWriteExt;
    client.stdin.write_all(b"count 1\n").await.unwrap();

    let logs = &process.logs;
    let said = |line: &str| line.contains("resolve to nothing") && line.contains("greter:7070");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let line = logs
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("no log line says the name resolves to nothing");
        if said(&line) {
            assert!(line.contains("typo-client"), "{line}");
            break;
        }
    }

    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["status", "--admin", &admin.to_string()])
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(
        printed.lines().any(|l| l.contains("NOT FOUND"))
            && printed
                .lines()
                .any(|l| l.starts_with("typo-client") && l.ends_with("greter:7070")),
        "{printed}"
    );
    let (_, body) = http_get(admin, "/debug/xds").await;
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listener = listed["clients"][0]["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type"] == "listener")
        .cloned()
        .unwrap();
    assert_eq!(
        listener["not_found"],
        serde_json::json!(["greter:7070"]),
        "{listed}"
    );

    let url = format!("http://{admin}/ui");
    tokio::task::spawn_blocking(move || {
        let mut browser = common::browser::Browser::open(&url);
        browser.wait_for(
            "[...document.querySelectorAll('tr.xds-client[data-node=\"typo-client\"] td.not-found')]\
             .some(td => td.textContent === 'greter:7070')",
        );
    })
    .await
    .unwrap();
    drop(client.child.start_kill());
}
