//! Seeing into a running control plane: propagation status, replica digests, the reverse
//! lookup, `unregister`, and the dashboard in a real browser (standalone; the Kubernetes side of
//! these is in tests/kubernetes.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::browser::Browser;
use common::{Observer, SNP_TYPE, http_get, start};
use dubbo_cp::dds::clients::ClientView;
use dubbo_cp::digest::DigestView;
use dubbo_cp::server::RunningServer;

/// Runs a client sub-command of the real binary to completion.
async fn run_client(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(args)
        .output()
        .await
        .expect("cannot run dubbo-cp")
}

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `dubbo-cp unregister -n demo -a APP [IFACE...]` against `admin`.
async fn unregister(admin: &str, application: &str, interfaces: &[&str]) -> std::process::Output {
    let mut args = vec![
        "unregister",
        "--admin",
        admin,
        "-n",
        "demo",
        "-a",
        application,
    ];
    args.extend_from_slice(interfaces);
    run_client(&args).await
}

/// A table's rows (after its header), split into cells.
fn rows(output: &std::process::Output) -> Vec<Vec<String>> {
    text(output)
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

async fn register(server: SocketAddr, namespace: &str, application: &str, interfaces: &[&str]) {
    let reply = common::client(server)
        .await
        .register_service_app_mapping(common::request(namespace, application, interfaces))
        .await;
    assert!(reply.is_ok_and(|r| r.into_inner().success));
}

async fn clients(admin: SocketAddr) -> Vec<ClientView> {
    let (status, body) = http_get(admin, "/debug/clients").await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    serde_json::from_value(answer["clients"].clone()).unwrap()
}

/// Polls `/debug/clients` until `check` holds (the stream task updates its entry on events).
async fn wait_for_clients(
    admin: SocketAddr,
    check: impl Fn(&[ClientView]) -> bool,
) -> Vec<ClientView> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let views = clients(admin).await;
        if check(&views) {
            return views;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {views:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The mapping subscription of the only client, if it is there yet.
fn snp(clients: &[ClientView]) -> Option<&dubbo_cp::dds::clients::KindStatus> {
    clients.first()?.kinds.first()
}

async fn digests(admin: SocketAddr) -> DigestView {
    let (status, body) = http_get(admin, "/debug/digest?objects=true").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn digest_of<'a>(view: &'a DigestView, kind: &str) -> &'a str {
    &view.kinds.iter().find(|k| k.kind == kind).unwrap().digest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_acking_shows_as_not_synced_with_its_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let server = standalone(dir.path()).await;
    let admin = server.admin_addr;

    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    observer.ack(&first).await;
    let synced = wait_for_clients(admin, |v| {
        v.len() == 1 && v[0].kinds.len() == 1 && v[0].kinds[0].synced
    })
    .await;
    assert_eq!(synced[0].kinds[0].acked, Some(first.revision));
    assert!(
        synced[0]
            .peer
            .as_deref()
            .is_some_and(|p| p.starts_with("127.0.0.1:"))
    );

    // The next state is sent and never acknowledged; a third waits behind it.
    register(server.grpc_addr, "demo", "a", &["org.example.A"]).await;
    let second = observer.next().await;
    register(server.grpc_addr, "demo", "b", &["org.example.B"]).await;
    common::wait_published(&server, 2).await;
    let third = server
        .index
        .current(dubbo_cp::index::Kind::ServiceNameMapping)
        .revision;
    let stale = wait_for_clients(admin, |v| {
        snp(v).is_some_and(|k| k.current == third && k.sent == Some(second.revision))
    })
    .await;
    let status = &stale[0].kinds[0];
    assert_eq!(
        (
            status.kind.as_str(),
            status.sent,
            status.acked,
            status.synced
        ),
        (
            "ServiceNameMapping",
            Some(second.revision),
            Some(first.revision),
            false
        )
    );
    assert!(status.lag_seconds > 0.0, "{status:?}");
    assert_eq!(
        common::metric(
            admin,
            "dubbo_cp_dds_streams_not_synced{kind=\"ServiceNameMapping\"}"
        )
        .await,
        1.0
    );

    // The server filters and counts: the stale one, none of another kind, a limit that cuts.
    let filtered = |path: &'static str| async move {
        let (status, body) = http_get(admin, path).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let only_stale = filtered("/debug/clients?stale=true").await;
    assert_eq!(only_stale["clients"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        (only_stale["total"].as_u64(), only_stale["stale"].as_u64()),
        (Some(1), Some(1))
    );
    let other_kind = filtered("/debug/clients?kind=TagRoute").await;
    assert_eq!(other_kind["clients"].as_array().map(Vec::len), Some(0));
    let cut = filtered("/debug/clients?limit=0").await;
    assert_eq!(
        (cut["truncated"].as_bool(), cut["total"].as_u64()),
        (Some(true), Some(1))
    );

    let admin_flag = admin.to_string();
    let table = run_client(&["status", "--admin", &admin_flag, "--stale"]).await;
    assert!(table.status.success(), "{}", text(&table));
    let rows: Vec<String> = text(&table).lines().skip(1).map(str::to_owned).collect();
    assert_eq!(rows.len(), 1, "{}", text(&table));
    let cells: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cells[cells.len() - 1], "NO", "{rows:?}");
    assert!(
        cells.contains(&second.revision.to_string().as_str())
            && cells.contains(&first.revision.to_string().as_str()),
        "{rows:?}"
    );
    let other_kind = run_client(&["status", "--admin", &admin_flag, "--kind", "TagRoute"]).await;
    assert_eq!(
        text(&other_kind).lines().count(),
        1,
        "{}",
        text(&other_kind)
    );

    // Acknowledging catches up: the newest state comes, and its ACK makes the client synced.
    observer.ack(&second).await;
    let newest = observer.next().await;
    assert_eq!(newest.revision, third);
    observer.ack(&newest).await;
    wait_for_clients(admin, |v| {
        snp(v).is_some_and(|k| k.synced && k.acked == Some(third))
    })
    .await;
    assert_eq!(
        common::metric(
            admin,
            "dubbo_cp_dds_streams_not_synced{kind=\"ServiceNameMapping\"}"
        )
        .await,
        0.0
    );
    assert!(common::metric(admin, "dubbo_cp_dds_ack_delay_seconds_count").await >= 2.0);
    drop(observer);
    wait_for_clients(admin, <[ClientView]>::is_empty).await;
    assert!(server.stop().await.is_ok());
}

/// Starts a standalone server on `dir` with every registration flushed on its own.
async fn standalone(dir: &Path) -> RunningServer {
    start(common::undebounced_config(dir)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converged_replicas_have_equal_digests_and_a_direct_store_edit_shows_where_they_differ() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Two standalone servers are two fleets with a root each: without a CA they compare on
    // their state alone (tests/zookeeper_ca.rs compares roots).
    let no_ca = |dir: &Path| {
        let mut config = common::undebounced_config(dir);
        config.ca.enabled = false;
        config
    };
    let (a, b) = (
        start(no_ca(dir_a.path())).await,
        start(no_ca(dir_b.path())).await,
    );
    // The same registrations in a different order: the same state.
    for (server, order) in [(&a, [0, 1]), (&b, [1, 0])] {
        let registrations = [
            ("demo", "a", "org.example.A"),
            ("demo", "b", "org.example.B"),
        ];
        for i in order {
            let (ns, app, iface) = registrations[i];
            register(server.grpc_addr, ns, app, &[iface]).await;
        }
        common::wait_published(server, 2).await;
    }
    let (view_a, view_b) = (digests(a.admin_addr).await, digests(b.admin_addr).await);
    for kind in &view_a.kinds {
        assert_eq!(kind.digest, digest_of(&view_b, &kind.kind), "{}", kind.kind);
    }
    let addresses = [a.admin_addr.to_string(), b.admin_addr.to_string()];
    let agree = run_client(&["status", "--compare", &addresses[0], &addresses[1]]).await;
    assert!(agree.status.success(), "{}", text(&agree));
    assert!(
        text(&agree).contains("ServiceNameMapping     yes"),
        "{}",
        text(&agree)
    );
    let metrics = http_get(a.admin_addr, "/metrics").await.1;
    let label = format!("digest=\"{}\"", digest_of(&view_a, "ServiceNameMapping"));
    assert!(metrics.contains(&label), "{metrics}");

    // An operator edits replica b's database by hand while it is stopped.
    assert!(b.stop().await.is_ok());
    {
        let db = rusqlite::Connection::open(dir_b.path().join(dubbo_cp::store::DB_FILE)).unwrap();
        db.execute(
            "INSERT INTO mapping (namespace, interface, application) VALUES ('demo', 'org.example.A', 'intruder')",
            [],
        )
        .unwrap();
    }
    let b = standalone(dir_b.path()).await;
    common::wait_published_apps(&b, "org-example-a/demo", 2).await;
    let view_b = digests(b.admin_addr).await;
    assert_ne!(
        digest_of(&view_a, "ServiceNameMapping"),
        digest_of(&view_b, "ServiceNameMapping")
    );
    assert_eq!(
        digest_of(&view_a, "TagRoute"),
        digest_of(&view_b, "TagRoute")
    );
    let addresses = [a.admin_addr.to_string(), b.admin_addr.to_string()];
    let differ = run_client(&["status", "--compare", &addresses[0], &addresses[1]]).await;
    assert!(!differ.status.success(), "{}", text(&differ));
    let report = text(&differ);
    assert!(report.contains("ServiceNameMapping     NO"), "{report}");
    assert!(report.contains("differs: org-example-a/demo"), "{report}");
    assert!(!report.contains("differs: org-example-b/demo"), "{report}");
    assert!(report.contains("disagree on 1 kind"), "{report}");
    assert!(a.stop().await.is_ok());
    assert!(b.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_are_found_by_name_and_unregister_removes_one_durably() {
    let dir = tempfile::tempdir().unwrap();
    let server = standalone(dir.path()).await;
    register(
        server.grpc_addr,
        "demo",
        "app1",
        &["org.example.X", "org.example.Y"],
    )
    .await;
    register(server.grpc_addr, "demo", "app2", &["org.example.Y"]).await;
    register(server.grpc_addr, "other", "app1", &["org.example.Z"]).await;
    common::wait_published_apps(&server, "org-example-y/demo", 2).await;
    common::wait_published(&server, 3).await;
    let admin = server.admin_addr.to_string();

    let (_, body) = http_get(server.admin_addr, "/debug/applications?application=app1").await;
    let found: Vec<dubbo_cp::admin::ApplicationView> = serde_json::from_str(&body).unwrap();
    let found: Vec<(&str, Vec<&str>)> = found
        .iter()
        .map(|v| {
            (
                v.namespace.as_str(),
                v.interfaces.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![
            ("demo", vec!["org.example.X", "org.example.Y"]),
            ("other", vec!["org.example.Z"])
        ]
    );
    let lookup = run_client(&[
        "get", "mappings", "--admin", &admin, "-a", "app1", "-n", "demo",
    ])
    .await;
    assert!(lookup.status.success(), "{}", text(&lookup));
    let lookup_rows = rows(&lookup);
    assert_eq!(
        lookup_rows,
        vec![
            vec!["demo", "app1", "org.example.X"],
            vec!["demo", "app1", "org.example.Y"]
        ]
    );
    let apps = run_client(&["get", "applications", "--admin", &admin, "-n", "demo"]).await;
    let app_rows = rows(&apps);
    assert_eq!(
        app_rows,
        vec![
            vec!["demo", "app1", "2", "-"],
            vec!["demo", "app2", "1", "-"]
        ]
    );

    // Unregister from one interface: the stream shows it gone; X loses its last application.
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let before = observer.next().await;
    observer.ack(&before).await;
    let out = unregister(&admin, "app1", &["org.example.X"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("app1 removed from demo/org.example.X"),
        "{}",
        text(&out)
    );
    let after = observer.next().await;
    assert!(after.revision > before.revision);
    let state = common::mappings_of(&after);
    assert!(!state.contains_key("org-example-x/demo"), "{state:?}");
    assert_eq!(state["org-example-y/demo"].1.len(), 2);
    // Nothing to remove is a clear error, and a registration adds it back as usual.
    let none = unregister(&admin, "nobody", &[]).await;
    assert!(!none.status.success());
    assert!(text(&none).contains("\"nobody\""), "{}", text(&none));
    // Without interfaces: every interface of the application in that namespace.
    let all = unregister(&admin, "app1", &[]).await;
    assert!(text(&all).contains("demo/org.example.Y"), "{}", text(&all));
    assert_eq!(
        common::metric(server.admin_addr, "dubbo_cp_store_pairs_removed_total").await,
        2.0
    );
    let revision = server
        .index
        .current(dubbo_cp::index::Kind::ServiceNameMapping)
        .revision;
    assert!(server.stop().await.is_ok());

    // Durable: a restart serves the state without app1 in demo, at a higher revision.
    let server = standalone(dir.path()).await;
    let state = common::admin_mappings(server.admin_addr).await;
    let demo: Vec<_> = state.iter().filter(|((ns, _), _)| ns == "demo").collect();
    assert_eq!(demo.len(), 1, "{state:?}");
    assert_eq!(demo[0].1.iter().collect::<Vec<_>>(), vec!["app2"]);
    assert!(
        server
            .index
            .current(dubbo_cp::index::Kind::ServiceNameMapping)
            .revision
            > revision
    );
    register(server.grpc_addr, "demo", "app1", &["org.example.X"]).await;
    common::wait_published(&server, 3).await;
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_new_mapping_and_a_stale_client_without_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let server = standalone(dir.path()).await;
    let url = format!("http://{}/ui", server.admin_addr);
    let mut browser = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::open(&url);
        browser.wait_for("document.body.dataset.loaded === 'true'");
        // Survives only if the page is never reloaded.
        browser.evaluate("window.__sameDocument = true");
        assert_eq!(
            browser.evaluate("document.querySelectorAll('tr.mapping').length"),
            serde_json::json!(0)
        );
        browser
    })
    .await
    .unwrap();

    // A client that takes the next state and never acknowledges it.
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    observer.ack(&first).await;
    register(
        server.grpc_addr,
        "demo",
        "greeter-app",
        &["org.example.Greeter"],
    )
    .await;
    let _unacked = observer.next().await;
    register(
        server.grpc_addr,
        "demo",
        "other-app",
        &["org.example.Other"],
    )
    .await;

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let shot_path = shot.clone();
    tokio::task::spawn_blocking(move || {
        browser.wait_for(
            "[...document.querySelectorAll('tr.mapping[data-interface=\"org.example.Greeter\"]')]\
             .some(row => row.textContent.includes('greeter-app'))",
        );
        browser.wait_for(
            "!!document.querySelector('tr.client.stale[data-kind=\"ServiceNameMapping\"]')",
        );
        browser.wait_for("!!document.querySelector('tr.kind[data-kind=\"TagRoute\"]')");
        assert_eq!(
            browser.evaluate("window.__sameDocument"),
            serde_json::json!(true)
        );
        browser.screenshot(&shot_path);
    })
    .await
    .unwrap();
    // Where CI finds the artifact: written to the process's stderr directly, which the test
    // harness does not capture, so it shows in the output of a passing run too.
    {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "dashboard screenshot: {}",
            shot.display()
        );
    }
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000));
    drop(observer);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_root_leads_to_the_dashboard_which_shows_rule_errors() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    // A file the rules directory cannot apply: its error is reported on /debug/rules.
    std::fs::write(
        rules.join("broken.yaml"),
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: grey, namespace: demo}\n\
         spec: {key: shop, configVersion: v3.0, tags: [{name: '', addresses: [10.0.0.1]}]}\n",
    )
    .unwrap();
    let mut config = common::undebounced_config(dir.path());
    config.rules.dir = Some(rules);
    let server = start(config).await;
    // `/` on the admin port redirects to the dashboard.
    let (code, _) = http_get(server.admin_addr, "/").await;
    assert_eq!(code, 307);
    let root = format!("http://{}/", server.admin_addr);
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::open(&root);
        browser.wait_for("location.pathname === '/ui' && document.body.dataset.loaded === 'true'");
        browser.wait_for(
            "[...document.querySelectorAll('#rule-errors tr.rule-error')].some(row => \
             row.textContent.includes('broken.yaml') && row.textContent.includes('spec.tags[0].name'))",
        );
    })
    .await
    .unwrap();
    assert!(server.stop().await.is_ok());
}

#[test]
fn the_start_up_log_says_where_the_dashboard_is() {
    let dir = tempfile::tempdir().unwrap();
    let process = common::spawn_binary(dir.path(), &[]);
    let expected = format!("dashboard at http://{}/ui", process.admin_addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let line = process
            .logs
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("no log line names the dashboard");
        if line.contains(&expected) {
            break;
        }
    }
}

/// The other half of the rule errors: an object the Kubernetes watch skipped (its spec does
/// not validate) is listed with its kind, namespace/name and error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_objects_the_watch_skipped() {
    let api = common::apiserver::ApiServer::start().await;
    // Valid YAML the API server would refuse by schema, written here anyway: it is skipped.
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "broken",
        serde_json::json!({"key": "", "tags": "not-a-list"}),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::kubernetes_config(dir.path(), api.url());
    // The page sends no token: the views answer without one.
    config.auth.token_review = Some(false);
    let server = start(config).await;
    common::wait_ready(server.admin_addr).await;
    let ui = format!("http://{}/ui", server.admin_addr);
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::open(&ui);
        browser.wait_for(
            "[...document.querySelectorAll('#rule-errors tr.rule-error')].some(row => \
             row.textContent.startsWith('TagRoute') && row.textContent.includes('demo/broken') \
             && row.textContent.includes('spec.'))",
        );
    })
    .await
    .unwrap();
    assert!(server.stop().await.is_ok());
}

/// With a long debounce window: `get mappings` right after a `success` says the registration is
/// not served yet instead of looking like a lost write, and `register --wait` returns once it
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_right_after_a_write_says_it_is_merging_and_register_wait_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::test_config(dir.path());
    // Long enough that the read below lands inside the window on a loaded machine.
    config.debounce.after = std::time::Duration::from_secs(10);
    config.debounce.max = std::time::Duration::from_secs(10);
    let server = dubbo_cp::server::start(config).await.unwrap();
    common::wait_ready(server.admin_addr).await;
    let grpc = server.grpc_addr.to_string();
    let admin = server.admin_addr.to_string();

    // `dubbo-cp register -n demo -a APP INTERFACE EXTRA...`
    let register = |application: &'static str, interface: &'static str, extra: &[&'static str]| {
        let mut args = vec![
            "register",
            "--server",
            &grpc,
            "-n",
            "demo",
            "-a",
            application,
            interface,
        ];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_client(&args).await
        }
    };
    let registered = register("merging-app", "org.example.Merging", &[]).await;
    assert!(registered.status.success(), "{}", text(&registered));
    let read = run_client(&["get", "mappings", "--server", &grpc, "--admin", &admin]).await;
    assert!(read.status.success(), "{}", text(&read));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&read.stdout),
        String::from_utf8_lossy(&read.stderr),
    );
    assert!(!stdout.contains("org.example.Merging"), "{stdout}");
    assert!(
        stderr.contains("1 registration(s) acknowledged are not served yet")
            && stderr.contains("demo/org.example.Merging: merging-app")
            && stderr.contains("--wait"),
        "{stderr}"
    );

    // --wait returns once the discovery stream serves it; the read after it is complete.
    let waited = register("merging-app", "org.example.Merging", &["--wait"]).await;
    assert!(waited.status.success(), "{}", text(&waited));
    assert!(
        String::from_utf8_lossy(&waited.stdout).contains("served after"),
        "{}",
        text(&waited)
    );
    let read = run_client(&["get", "mappings", "--server", &grpc, "--admin", &admin]).await;
    assert!(
        String::from_utf8_lossy(&read.stdout).contains("org.example.Merging"),
        "{}",
        text(&read)
    );
    assert!(
        !String::from_utf8_lossy(&read.stderr).contains("not served yet"),
        "{}",
        text(&read)
    );

    // A wait that cannot end in time says what is missing and why.
    let timed_out = register(
        "late-app",
        "org.example.Late",
        &["--wait", "--wait-timeout", "1s"],
    )
    .await;
    assert!(!timed_out.status.success());
    let message = text(&timed_out);
    assert!(
        message.contains("org.example.Late not served with late-app in demo within 1s")
            && message.contains("debounce"),
        "{message}"
    );
    assert!(server.stop().await.is_ok());
}
