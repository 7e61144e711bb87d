//! The binary's command line: configuration precedence and the `register` client.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::{admin_mappings, start, test_config};

fn print_config(file: &std::path::Path, env: &[(&str, &str)], flags: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["serve", "--print-config", "--config"])
        .arg(file)
        .args(flags)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a client sub-command of the real binary to completion.
async fn run_client(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(args)
        .output()
        .await
        .unwrap()
}

#[test]
fn flags_beat_environment_beats_file_beats_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dubbo-cp.yaml");
    let yaml = "grpcAddr: 127.0.0.1:1001\nadminAddr: 127.0.0.1:1002\ndataDir: /from/file\n\
                debounce:\n  after: 100000000\n  max: 20s\n  enable: true\n";
    assert!(std::fs::write(&file, yaml).is_ok());

    let only_file = print_config(&file, &[], &[]);
    assert!(
        only_file.contains("grpcAddr: 127.0.0.1:1001"),
        "{only_file}"
    );
    assert!(
        only_file.contains("after: 100ms"),
        "nanoseconds not read: {only_file}"
    );
    assert!(
        only_file.contains("queueCapacity: 8192"),
        "default missing: {only_file}"
    );

    let env = [
        ("DUBBO_CP_GRPC_ADDR", "127.0.0.1:2001"),
        ("DUBBO_CP_DATA_DIR", "/from/env"),
        ("DUBBO_CP_DEBOUNCE_ENABLE", "false"),
    ];
    let with_env = print_config(&file, &env, &[]);
    assert!(with_env.contains("grpcAddr: 127.0.0.1:2001"), "{with_env}");
    assert!(with_env.contains("dataDir: /from/env"), "{with_env}");
    assert!(with_env.contains("enable: false"), "{with_env}");
    assert!(with_env.contains("adminAddr: 127.0.0.1:1002"), "{with_env}");

    let with_flags = print_config(
        &file,
        &env,
        &["--grpc-addr", "127.0.0.1:3001", "--debounce-max", "2500ms"],
    );
    assert!(
        with_flags.contains("grpcAddr: 127.0.0.1:3001"),
        "{with_flags}"
    );
    assert!(with_flags.contains("max: 2s 500ms"), "{with_flags}");
    assert!(with_flags.contains("dataDir: /from/env"), "{with_flags}");
}

#[test]
fn bad_config_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    assert!(std::fs::write(&file, "debounce:\n  aftr: 1s\n").is_ok());
    let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("aftr"), "{stderr}");
}

#[test]
fn refuses_a_non_loopback_address_without_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args([
            "serve",
            "--grpc-addr",
            "0.0.0.0:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--tls-addr",
            "127.0.0.1:0",
            "--webhook-addr",
            "127.0.0.1:0",
            "--xds-addr",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--insecure-allow-unauthenticated"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_subcommand_talks_to_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let addr = format!("http://{}", server.grpc_addr);
    let output = run_client(&[
        "register",
        "--server",
        &addr,
        "-n",
        "default",
        "-a",
        "demo-provider",
        "org.apache.dubbo.demo.DemoService",
    ])
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("success: true"));

    let bad = run_client(&[
        "register",
        "--server",
        &addr,
        "-n",
        "Bad",
        "-a",
        "demo-provider",
        "I",
    ])
    .await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("InvalidArgument"));

    let stored = admin_mappings(server.admin_addr).await;
    assert_eq!(stored.len(), 1);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_mappings_prints_the_state_from_the_discovery_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(common::undebounced_config(dir.path())).await;
    let mut client = common::client(server.grpc_addr).await;
    for (ns, app) in [("default", "demo-provider"), ("other", "other-provider")] {
        let reply = client
            .register_service_app_mapping(common::request(
                ns,
                app,
                &["org.apache.dubbo.demo.DemoService"],
            ))
            .await;
        assert!(reply.is_ok());
    }
    common::wait_published(&server, 2).await;
    let addr = format!("http://{}", server.grpc_addr);
    let output = run_client(&[
        "get", "mappings", "--server", &addr, "-n", "default", "-o", "json",
    ])
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let state: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let objects = state["objects"].as_array().cloned().unwrap_or_default();
    assert_eq!(objects.len(), 1, "{state}");
    assert_eq!(
        objects[0]["key"],
        "org-apache-dubbo-demo-demoservice/default"
    );
    assert_eq!(objects[0]["applicationNames"][0], "demo-provider");
    assert!(state["revision"].as_i64().unwrap_or(0) > 0);

    let text = run_client(&["get", "mappings", "--server", &addr]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("org-apache-dubbo-demo-demoservice/other\torg.apache.dubbo.demo.DemoService\tother-provider"), "{text}");
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_get_and_delete_rules_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::start(common::test_config(dir.path())).await;
    let admin = server.admin_addr.to_string();
    let manifest = dir.path().join("grey.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: grey, namespace: demo}\nspec:\n  key: demo-provider\n  configVersion: v3.0\n  tags: [{name: grey, addresses: [10.0.0.1]}]\n",
    )
    .unwrap();
    let path = manifest.to_str().unwrap();
    let applied = run_client(&["apply", "--admin", &admin, "-f", path]).await;
    assert!(applied.status.success(), "{applied:?}");
    assert_eq!(
        String::from_utf8_lossy(&applied.stdout),
        "TagRoute demo/grey created\n"
    );
    let again = run_client(&["apply", "--admin", &admin, "-f", path]).await;
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "TagRoute demo/grey unchanged\n"
    );
    let got = run_client(&[
        "get",
        "tagroutes",
        "--admin",
        &admin,
        "-n",
        "demo",
        "-o",
        "yaml",
    ])
    .await;
    assert!(got.status.success(), "{got:?}");
    let list: serde_yaml::Value = serde_yaml::from_slice(&got.stdout).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "grey");
    assert_eq!(list["items"][0]["metadata"]["namespace"], "demo");
    assert_eq!(
        list["items"][0]["spec"]["tags"][0]["addresses"][0],
        "10.0.0.1"
    );

    // A broken manifest: a clear message naming the field, a failing exit status.
    std::fs::write(&manifest, "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: grey, namespace: demo}\nspec: {key: \"\", configVersion: v3.0, tags: []}\n").unwrap();
    let refused = run_client(&["apply", "--admin", &admin, "-f", path]).await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("spec.key"), "{stderr}");

    let deleted = run_client(&[
        "delete",
        "tagroutes",
        "grey",
        "-n",
        "demo",
        "--admin",
        &admin,
    ])
    .await;
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout),
        "TagRoute demo/grey deleted\n"
    );
    let after = run_client(&["get", "tagroutes", "--admin", &admin, "-o", "json"]).await;
    let list: serde_json::Value = serde_json::from_slice(&after.stdout).unwrap();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    server.stop().await.unwrap();
}

/// Runs a client sub-command with these environment variables.
async fn run_client_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap()
}

fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

const TOKENS: &str = "tokens:
  - token: demo-token
    namespace: demo
    identity: demo/provider
  - token: ops-token
    namespace: ops
    identity: ops/admin
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_commands_send_a_token_and_speak_tls() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut config = common::undebounced_config(&dir.path().join("data"));
    config.auth.token_file = Some(tokens);
    config.auth.admins = vec!["ops/admin".into()];
    let server = start(config).await;
    let admin = server.admin_addr.to_string();
    // The root a TLS client trusts, from `ca root`.
    let root = run_client(&["ca", "root", "--admin", &admin, "--token", "ops-token"]).await;
    assert!(root.status.success(), "{}", stderr_of(&root));
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &root.stdout).unwrap();
    assert!(String::from_utf8_lossy(&root.stdout).starts_with("-----BEGIN CERTIFICATE-----"));
    let ca_file = ca_file.to_str().unwrap();

    // host:port without a scheme; without a token the refusal says how to send one.
    let plain = server.grpc_addr.to_string();
    let register = |server: String, token: Option<&'static str>| {
        let mut args = vec!["register".to_owned(), "--server".into(), server];
        if let Some(token) = token {
            args.extend(["--token".into(), token.into()]);
        }
        args.extend(["-n", "demo", "-a", "shop", "org.example.Cart"].map(str::to_owned));
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_client(&args).await
        }
    };
    let anonymous = register(plain.clone(), None).await;
    assert!(!anonymous.status.success());
    let message = stderr_of(&anonymous);
    assert!(
        message.contains("Unauthenticated") && message.contains("--token"),
        "{message}"
    );
    let with_token = register(plain.clone(), Some("demo-token")).await;
    assert!(with_token.status.success(), "{}", stderr_of(&with_token));

    // TLS, trusting the CA's root; the token from the environment.
    let tls = format!("https://{}", server.tls_addr.expect("no TLS port"));
    let tls_args = [
        "--server",
        &tls,
        "--ca-file",
        ca_file,
        "--tls-server-name",
        "localhost",
    ];
    let mut args = vec!["get", "mappings", "-o", "yaml"];
    args.extend(tls_args);
    let got = run_client_env(&args, &[("DUBBO_CP_TOKEN", "demo-token")]).await;
    assert!(got.status.success(), "{}", stderr_of(&got));
    let state: serde_yaml::Value =
        serde_yaml::from_str(String::from_utf8_lossy(&got.stdout).trim_start_matches("---\n"))
            .unwrap();
    assert_eq!(state["objects"][0]["interfaceName"], "org.example.Cart");
    // https without roots to trust: said, not a handshake error.
    let untrusted =
        run_client(&["get", "mappings", "--server", &tls, "--token", "demo-token"]).await;
    assert!(!untrusted.status.success());
    assert!(
        stderr_of(&untrusted).contains("--ca-file"),
        "{}",
        stderr_of(&untrusted)
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_issue_refuses_another_trust_domain_unless_asked_and_ca_root_prints_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let admin = server.admin_addr.to_string();
    let csr_file = write_csr(dir.path());
    let csr_file = csr_file.to_str().unwrap();
    let issue = |id: &'static str, allow: bool| {
        let mut args = vec![
            "ca",
            "issue",
            "--admin",
            &admin,
            "--csr",
            csr_file,
            "--spiffe-id",
            id,
        ];
        if allow {
            args.push("--allow-other-trust-domain");
        }
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_client(&args).await
        }
    };
    let ours = issue("spiffe://cluster.local/ns/demo/sa/shop", false).await;
    assert!(ours.status.success(), "{}", stderr_of(&ours));
    let foreign = issue("spiffe://other.example/ns/demo/sa/shop", false).await;
    assert!(!foreign.status.success());
    let message = stderr_of(&foreign);
    assert!(
        message.contains("\"other.example\" is not this CA's (\"cluster.local\")")
            && message.contains("--allow-other-trust-domain"),
        "{message}"
    );
    let asked = issue("spiffe://other.example/ns/demo/sa/shop", true).await;
    assert!(asked.status.success(), "{}", stderr_of(&asked));
    let root = run_client(&["ca", "root", "--admin", &admin]).await;
    let bundle = String::from_utf8_lossy(&root.stdout).into_owned();
    assert_eq!(
        bundle.matches("-----BEGIN CERTIFICATE-----").count(),
        1,
        "{bundle}"
    );
    assert!(String::from_utf8_lossy(&ours.stdout).starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_what_was_asked_where_and_what_to_try() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let (grpc, admin) = (server.grpc_addr.to_string(), server.admin_addr.to_string());
    // The admin commands pointed at the gRPC port.
    let wrong = run_client(&["get", "tagroutes", "--admin", &grpc]).await;
    assert!(!wrong.status.success());
    let message = stderr_of(&wrong);
    assert!(
        message.contains(&format!("GET http://{grpc}/api/v1/rules/tagroutes"))
            && message.contains("admin port"),
        "{message}"
    );
    // The gRPC commands pointed at the admin port.
    let wrong = run_client(&["register", "--server", &admin, "-n", "demo", "-a", "a", "I"]).await;
    assert!(!wrong.status.success());
    let message = stderr_of(&wrong);
    assert!(
        message.contains(&admin) && message.contains("gRPC port"),
        "{message}"
    );
    // Nobody there: the cause once, on one line.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let refused = run_client(&[
        "register", "--server", &closed, "-n", "demo", "-a", "a", "I",
    ])
    .await;
    let message = stderr_of(&refused);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert_eq!(
        message.matches("Connection refused").count(),
        1,
        "{message}"
    );
    // A 404 without a body (a server that does not serve the path).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let empty = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buffer = [0u8; 4096];
            let read = socket.read(&mut buffer).await.unwrap_or(0);
            // Like axum without a route for it: an empty 405 for a POST, an empty 404 else.
            let answer: &[u8] = if buffer[..read].starts_with(b"POST") {
                b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            };
            let _ = socket.write_all(answer).await;
        }
    });
    let missing = run_client(&["ca", "show", "--admin", &empty]).await;
    let message = stderr_of(&missing);
    assert!(
        message.contains(&format!(
            "GET http://{empty}/api/v1/ca: HTTP 404: no message"
        )) && message.contains("does not serve that path"),
        "{message}"
    );
    let refused = run_client(&["ca", "rotate", "--admin", &empty]).await;
    let message = stderr_of(&refused);
    assert!(
        message.contains(&format!(
            "POST http://{empty}/api/v1/ca/rotate: HTTP 405: no message"
        )) && message.contains("does not take that method"),
        "{message}"
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_prints_kubectls_columns_and_deleting_what_is_not_there_fails() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let admin = server.admin_addr.to_string();
    let manifest = dir.path().join("grey.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: grey, namespace: demo}\nspec:\n  key: demo-provider\n  configVersion: v3.0\n  tags: [{name: grey, addresses: [10.0.0.1]}, {name: blue, addresses: [10.0.0.2]}]\n",
    )
    .unwrap();
    let applied = run_client(&["apply", "--admin", &admin, "-f", manifest.to_str().unwrap()]).await;
    assert!(applied.status.success(), "{}", stderr_of(&applied));
    let got = run_client(&["get", "tagroutes", "--admin", &admin]).await;
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        "NAMESPACE   NAME   KEY             ENABLED   TAGS\n\
         demo        grey   demo-provider   true      grey,blue\n"
    );
    let missing = run_client(&[
        "delete",
        "tagroutes",
        "nope",
        "-n",
        "demo",
        "--admin",
        &admin,
    ])
    .await;
    assert!(!missing.status.success());
    assert!(
        stderr_of(&missing).contains("TagRoute demo/nope not found"),
        "{}",
        stderr_of(&missing)
    );
    let ignored = run_client(&[
        "delete",
        "tagroutes",
        "nope",
        "-n",
        "demo",
        "--admin",
        &admin,
        "--ignore-not-found",
    ])
    .await;
    assert!(ignored.status.success(), "{}", stderr_of(&ignored));
    assert!(server.stop().await.is_ok());
}

/// The stderr of a client run that must fail.
async fn failure(args: &[&str]) -> String {
    let output = run_client(args).await;
    assert!(!output.status.success(), "{args:?} succeeded");
    stderr_of(&output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mix_ups_are_named_with_their_fix() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(&dir.path().join("data"))).await;
    let admin = server.admin_addr.to_string();
    let root = run_client(&["ca", "root", "--admin", &admin]).await;
    assert!(root.status.success(), "{}", stderr_of(&root));
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &root.stdout).unwrap();
    let ca_file = ca_file.to_str().unwrap();
    let tls_port = server.tls_addr.expect("no TLS port").port();
    let plain_port = server.grpc_addr.port();

    // Plain text to the TLS port: the server hangs up; the hint says https://.
    let tls_plainly = format!("127.0.0.1:{tls_port}");
    for command in [
        vec!["get", "mappings"],
        vec!["register", "-n", "demo", "-a", "a", "I"],
    ] {
        let mut args = command.clone();
        args.extend(["--server", &tls_plainly]);
        let message = failure(&args).await;
        assert!(
            message.contains(&tls_plainly)
                && message.contains("use https://host:port with --ca-file"),
            "{command:?}: {message}"
        );
    }
    // TLS to the plain port.
    let plain_over_tls = format!("https://localhost:{plain_port}");
    let message = failure(&[
        "get",
        "mappings",
        "--server",
        &plain_over_tls,
        "--ca-file",
        ca_file,
    ])
    .await;
    assert!(
        message.contains(&plain_over_tls) && message.contains("does not speak TLS"),
        "{message}"
    );
    // The certificate names localhost, not 127.0.0.1.
    let by_ip = format!("https://127.0.0.1:{tls_port}");
    let message = failure(&["get", "mappings", "--server", &by_ip, "--ca-file", ca_file]).await;
    assert!(message.contains("--tls-server-name"), "{message}");
    // Roots that did not sign the server's certificate, and a file without any.
    let key = rcgen::KeyPair::generate().unwrap();
    let stranger = rcgen::CertificateParams::new(vec!["stranger.example".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let other = dir.path().join("other.pem");
    std::fs::write(&other, stranger.pem()).unwrap();
    let by_name = format!("https://localhost:{tls_port}");
    let message = failure(&[
        "get",
        "mappings",
        "--server",
        &by_name,
        "--ca-file",
        other.to_str().unwrap(),
    ])
    .await;
    assert!(
        message.contains("not signed by a root in --ca-file") && message.contains("ca root"),
        "{message}"
    );
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "tokens: []\n").unwrap();
    let message = failure(&[
        "get",
        "mappings",
        "--server",
        &by_name,
        "--ca-file",
        empty.to_str().unwrap(),
    ])
    .await;
    assert!(message.contains("holds no PEM certificate"), "{message}");
    // And right: the name the certificate holds, the root from `ca root`.
    let ok = run_client(&[
        "get",
        "mappings",
        "--server",
        &by_name,
        "--ca-file",
        ca_file,
    ])
    .await;
    assert!(ok.status.success(), "{}", stderr_of(&ok));
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_get_prints_the_outputs_its_help_offers() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(common::undebounced_config(dir.path())).await;
    let admin = server.admin_addr.to_string();
    let mut client = common::client(server.grpc_addr).await;
    let reply = client
        .register_service_app_mapping(common::request(
            "demo",
            "demo-provider",
            &["org.apache.dubbo.demo.DemoService"],
        ))
        .await;
    assert!(reply.is_ok());
    common::wait_published(&server, 1).await;
    let applications = run_client(&["get", "applications", "--admin", &admin, "-o", "yaml"]).await;
    assert!(
        applications.status.success(),
        "{}",
        stderr_of(&applications)
    );
    let list: serde_yaml::Value = serde_yaml::from_slice(&applications.stdout).unwrap();
    assert_eq!(list[0]["application"], "demo-provider", "{list:?}");
    let served = run_client(&[
        "get",
        "mappings",
        "-a",
        "demo-provider",
        "-n",
        "demo",
        "--admin",
        &admin,
        "-o",
        "yaml",
    ])
    .await;
    assert!(served.status.success(), "{}", stderr_of(&served));
    let list: serde_yaml::Value = serde_yaml::from_slice(&served.stdout).unwrap();
    assert_eq!(
        list[0]["interfaces"][0], "org.apache.dubbo.demo.DemoService",
        "{list:?}"
    );
    // Nothing to list: kubectl's note on standard error, no header.
    let none = run_client(&["get", "tagroutes", "-n", "demo", "--admin", &admin]).await;
    assert!(none.status.success(), "{}", stderr_of(&none));
    assert_eq!(String::from_utf8_lossy(&none.stdout), "");
    assert_eq!(stderr_of(&none), "No resources found in demo namespace.\n");
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_issue_with_an_empty_trust_domain_setting_issues_in_cluster_local() {
    // `tls.trustDomain: ""` accepts client certificates of any domain; the CA's own stays
    // cluster.local, where the control plane names its callers.
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.tls.trust_domain = String::new();
    let server = start(config).await;
    let admin = server.admin_addr.to_string();
    let csr_file = write_csr(dir.path());
    let csr_file = csr_file.to_str().unwrap();
    let issue = |id: &str| {
        let args: Vec<String> = [
            "ca",
            "issue",
            "--admin",
            &admin,
            "--csr",
            csr_file,
            "--spiffe-id",
            id,
        ]
        .map(str::to_owned)
        .to_vec();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_client(&args).await
        }
    };
    let ours = issue("spiffe://cluster.local/ns/demo/sa/shop").await;
    assert!(ours.status.success(), "{}", stderr_of(&ours));
    let foreign = issue("spiffe://other.example/ns/demo/sa/shop").await;
    assert!(!foreign.status.success());
    let message = stderr_of(&foreign);
    assert!(
        message.contains("\"other.example\" is not this CA's (\"cluster.local\")"),
        "{message}"
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_no_rule_can_be_is_refused_before_any_request() {
    // Nothing listens: the refusals below must come before a request is made.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let message = failure(&["get", "tagroute-s", "--admin", &closed]).await;
    assert!(
        message.contains("get \"tagroute-s\": not a kind dubbo-cp serves")
            && message.contains("mappings, applications, or a rule kind: tagroutes,"),
        "{message}"
    );
    let message = failure(&[
        "delete",
        "tagroutes",
        "x y",
        "-n",
        "demo",
        "--admin",
        &closed,
    ])
    .await;
    assert!(
        message.contains("name \"x y\" is not a valid name"),
        "{message}"
    );
    let message = failure(&["get", "tagroutes", "-n", "a/b", "--admin", &closed]).await;
    assert!(
        message.contains("namespace \"a/b\" is not a valid name"),
        "{message}"
    );
}

/// A CSR (asking for a name the CA ignores) written to `dir/csr.pem`.
fn write_csr(dir: &std::path::Path) -> std::path::PathBuf {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::new(vec!["x.example".to_owned()])
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let path = dir.join("csr.pem");
    std::fs::write(&path, csr).unwrap();
    path
}
