//! The admission webhook in Kubernetes mode against the API-server fixture: the control plane
//! creates `MutatingWebhookConfiguration dubbo-cp` with our CA as `caBundle` and repairs it
//! after an edit; a real TLS client trusting only our CA root calls `/mutating-services` and
//! the patch injects exactly what the labels ask for (the agent's native sidecar included).

// Tests and their helpers: a failure is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::apiserver::ApiServer;
use common::start;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

/// A TLS client trusting only `root`.
fn connector(root: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(pem::parse(root).unwrap().into_contents().into())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// One HTTPS request trusting only `root`; the status and body.
async fn https(
    addr: SocketAddr,
    root: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String) {
    let connector = connector(root);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .expect("the webhook's certificate must verify against our CA root");
    // An empty content type sends none at all.
    let content_type = if content_type.is_empty() {
        String::new()
    } else {
        format!("Content-Type: {content_type}\r\n")
    };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         {content_type}Content-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    common::parse_http_response(&response)
}

fn pod_review(uid: &str, namespace: &str, pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "operation": "CREATE", "namespace": namespace, "object": pod}}))
    .unwrap()
}

fn root_of(api: &ApiServer) -> String {
    let secret = api
        .object("secrets", "dubbo-system", "dubbo-ca-secret")
        .unwrap();
    String::from_utf8(unb64(secret["data"]["cert.pem"].as_str().unwrap())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_is_kept_and_pods_that_ask_are_injected() {
    let api = ApiServer::start().await;
    api.create_namespace("plain");
    api.create_labelled_namespace("demo", json!({"dubbo-ca.inject": "true"}));
    for name in ["zk-b", "zk-a"] {
        api.put_object(
            "services",
            "demo",
            name,
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "labels": {"registry-zookeeper-inject": "true"}},
                   "spec": {"ports": [{"port": 2181}]}}),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::kubernetes_config(dir.path(), api.url());
    config.auth.token_review = Some(false);
    config.webhook.agent_image = "registry.example/dubbo-cp:1.2.3".to_owned();
    let server = start(config).await;
    let webhook = server
        .webhook_addr
        .expect("the webhook serves in Kubernetes mode");
    let wait = Duration::from_secs(20);

    // The configuration: created, with our roots as caBundle and our Service and port.
    api.wait_for("the webhook configuration", wait, |api| {
        api.object("mutatingwebhookconfigurations", "", "dubbo-cp")
            .is_some()
    })
    .await;
    let root = root_of(&api);
    let configuration = api
        .object("mutatingwebhookconfigurations", "", "dubbo-cp")
        .unwrap();
    let webhooks = configuration["webhooks"].as_array().unwrap();
    assert_eq!(webhooks[0]["name"], "dubbo-cp.k8s.io");
    let names: Vec<&str> = webhooks
        .iter()
        .map(|hook| hook["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names[8..],
        [
            "xds-pod.dubbo-cp.k8s.io",
            "xds-namespace.dubbo-cp.k8s.io",
            "agent-pod.dubbo-cp.k8s.io",
            "agent-namespace.dubbo-cp.k8s.io"
        ]
    );
    for hook in webhooks {
        assert_eq!(hook["clientConfig"]["caBundle"], b64(root.as_bytes()));
        assert_eq!(
            hook["clientConfig"]["service"],
            json!({"name": "dubbo-cp", "namespace": "dubbo-system",
                   "path": "/mutating-services", "port": webhook.port()})
        );
        assert_eq!(hook["failurePolicy"], "Ignore");
    }
    // Edited by someone: put back.
    let mut edited = configuration.clone();
    edited["webhooks"][0]["failurePolicy"] = json!("Fail");
    edited["webhooks"][1]["clientConfig"]["caBundle"] = json!(b64(b"not ours"));
    api.put_object("mutatingwebhookconfigurations", "", "dubbo-cp", edited);
    api.wait_for("the configuration repaired", wait, |api| {
        let now = api
            .object("mutatingwebhookconfigurations", "", "dubbo-cp")
            .unwrap();
        now["webhooks"][0]["failurePolicy"] == "Ignore"
            && now["webhooks"][1]["clientConfig"]["caBundle"] == b64(root.as_bytes())
    })
    .await;

    // Deleted: created again.
    assert!(api.delete_object("mutatingwebhookconfigurations", "", "dubbo-cp"));
    api.wait_for("the configuration recreated", wait, |api| {
        api.object("mutatingwebhookconfigurations", "", "dubbo-cp")
            .is_some()
    })
    .await;

    // A real TLS client trusting only our root.
    let (status, body) = https(webhook, &root, "GET", "/health", "text/plain", b"").await;
    assert_eq!(status, 200, "{body}");
    for content_type in ["text/plain", ""] {
        let (status, _) = https(
            webhook,
            &root,
            "POST",
            "/mutating-services",
            content_type,
            b"{}",
        )
        .await;
        assert_eq!(status, 415, "{content_type:?}");
    }
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "provider-0", "labels": {"registry-zookeeper-inject": "true"}},
                     "spec": {"containers": [{"name": "app", "image": "provider"}]}});
    // The namespace's label arrives through a watch; ask until it is seen.
    let deadline = tokio::time::Instant::now() + wait;
    let patched = loop {
        let (status, body) = https(
            webhook,
            &root,
            "POST",
            "/mutating-services",
            "application/json",
            &pod_review("uid-1", "demo", &pod),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "uid-1");
        assert_eq!(answer["response"]["allowed"], true);
        if let Some(patch) = answer["response"]["patch"].as_str() {
            assert_eq!(answer["response"]["patchType"], "JSONPatch");
            let patch: json_patch::Patch = serde_json::from_slice(&unb64(patch)).unwrap();
            let mut patched = pod.clone();
            json_patch::patch(&mut patched, &patch).unwrap();
            if patched["spec"]["volumes"].is_array() {
                break patched;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never injected: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let env = &patched["spec"]["containers"][0]["env"];
    let names: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "DUBBO_CA_ADDRESS",
            "DUBBO_CA_CERT_PATH",
            "DUBBO_OIDC_TOKEN",
            "DUBBO_OIDC_TOKEN_TYPE",
            "DUBBO_REGISTRY_ADDRESS"
        ]
    );
    let tls_port = server.tls_addr.unwrap().port();
    assert_eq!(
        env[0]["value"],
        format!("dubbo-cp.dubbo-system.svc:{tls_port}")
    );
    assert_eq!(
        env[4]["value"], "zookeeper://zk-a.demo.svc",
        "the first Service by name"
    );
    // A pod that asks for nothing, in a namespace that asks for nothing: no patch.
    let plain = json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c"}]}});
    let (_, body) = https(
        webhook,
        &root,
        "POST",
        "/mutating-services",
        "application/json",
        &pod_review("uid-2", "plain", &plain),
    )
    .await;
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert!(answer["response"].get("patch").is_none(), "{body}");
    agent_pods_get_the_native_sidecar(webhook, &root, tls_port).await;
    // A rotation reaches the caBundle: both roots, until the old one is dropped.
    let (status, body) =
        common::http_send(server.admin_addr, "POST", "/api/v1/ca/rotate", "", None).await;
    assert_eq!(status, 200, "{body}");
    api.wait_for("caBundle with both roots", wait, |api| {
        let now = api
            .object("mutatingwebhookconfigurations", "", "dubbo-cp")
            .unwrap();
        now["webhooks"].as_array().unwrap().iter().all(|hook| {
            let bundle =
                String::from_utf8(unb64(hook["clientConfig"]["caBundle"].as_str().unwrap()))
                    .unwrap();
            bundle.matches("BEGIN CERTIFICATE").count() == 2 && bundle.contains(root.trim())
        })
    })
    .await;
    let (_, metrics) = common::http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_webhook_injections_total{kind=\"ca\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_webhook_reviews_total{result=\"unsupported_media_type\"} 2")
    );
    assert!(
        metrics.contains("dubbo_cp_webhook_injections_total{kind=\"agent\"} 1"),
        "{metrics}"
    );
    assert!(server.stop().await.is_ok());
}

/// A pod labelled `dubbo-agent.inject` in a namespace that asks for nothing gets exactly the CA
/// injection, a bootstrap naming the agent's certificates and the agent as a native sidecar
/// running `webhook.agentImage`; its unlabelled twin gets nothing.
async fn agent_pods_get_the_native_sidecar(webhook: SocketAddr, root: &str, tls_port: u16) {
    let review = async |uid: &str, pod: &Value| -> Value {
        let (status, body) = https(
            webhook,
            root,
            "POST",
            "/mutating-services",
            "application/json",
            &pod_review(uid, "plain", pod),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let pod = |labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "greeter-0", "labels": labels},
               "spec": {"containers": [{"name": "app", "image": "greeter"}]}})
    };
    let plain = review("uid-3", &pod(json!({"app": "greeter"}))).await;
    assert!(plain["response"].get("patch").is_none(), "{plain}");
    let labelled = pod(json!({"app": "greeter", "dubbo-agent.inject": "true"}));
    let answer = review("uid-4", &labelled).await;
    let patch: json_patch::Patch =
        serde_json::from_slice(&unb64(answer["response"]["patch"].as_str().unwrap())).unwrap();
    let mut patched = labelled.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    let ca_address = format!("dubbo-cp.dubbo-system.svc:{tls_port}");
    let ca_env = json!([
        {"name": "DUBBO_CA_ADDRESS", "value": ca_address},
        {"name": "DUBBO_CA_CERT_PATH", "value": "/var/run/secrets/dubbo-ca-cert/ca.crt"},
        {"name": "DUBBO_OIDC_TOKEN", "value": "/var/run/secrets/dubbo-ca-token/token"},
        {"name": "DUBBO_OIDC_TOKEN_TYPE", "value": "dubbo-ca-token"},
    ]);
    let ca_mounts = [
        json!({"name": "dubbo-ca-token", "mountPath": "/var/run/secrets/dubbo-ca-token", "readOnly": true}),
        json!({"name": "dubbo-ca-cert", "mountPath": "/var/run/secrets/dubbo-ca-cert", "readOnly": true}),
    ];
    let health = json!({"path": "/healthz", "port": 15020});
    assert_eq!(
        patched["spec"]["initContainers"],
        json!([{
            "name": "dubbo-cp-agent",
            "image": "registry.example/dubbo-cp:1.2.3",
            "args": ["agent", "--out", "/var/run/dubbo-cp/certs", "--metrics-address", "0.0.0.0:15020",
                     "--xds-proxy", "127.0.0.1:15010", "--xds-address", ca_address],
            "restartPolicy": "Always",
            "ports": [{"name": "agent-metrics", "containerPort": 15020}],
            "startupProbe": {"httpGet": health, "periodSeconds": 1, "failureThreshold": 300},
            "readinessProbe": {"httpGet": health, "periodSeconds": 10},
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
            },
            "env": ca_env,
            "volumeMounts": [
                {"name": "dubbo-cp-certs", "mountPath": "/var/run/dubbo-cp/certs"},
                ca_mounts[0], ca_mounts[1],
            ],
        }])
    );
    assert_eq!(
        patched["spec"]["volumes"],
        json!([
            {"name": "dubbo-ca-token", "projected": {"sources": [{"serviceAccountToken":
                {"audience": "dubbo-ca", "expirationSeconds": 1800, "path": "token"}}]}},
            {"name": "dubbo-ca-cert", "projected": {"sources": [{"configMap":
                {"name": "dubbo-ca-cert", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
            {"name": "dubbo-cp-certs", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ])
    );
    let app = &patched["spec"]["containers"][0];
    assert_eq!(
        app["env"].as_array().unwrap()[..4],
        ca_env.as_array().unwrap()[..]
    );
    let bootstrap = app["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "GRPC_XDS_BOOTSTRAP_CONFIG")
        .and_then(|e| e["value"].as_str())
        .expect("a bootstrap");
    let bootstrap: Value = serde_json::from_str(bootstrap).unwrap();
    assert_eq!(
        bootstrap["certificate_providers"],
        json!({"default": {"plugin_name": "file_watcher", "config": {
            "certificate_file": "/var/run/dubbo-cp/certs/cert-chain.pem",
            "private_key_file": "/var/run/dubbo-cp/certs/key.pem",
            "ca_certificate_file": "/var/run/dubbo-cp/certs/root-cert.pem",
            "refresh_interval": "60s",
        }}})
    );
    // The agent's xDS proxy, which forwards to the TLS port with the pod's certificate.
    assert_eq!(
        bootstrap["xds_servers"][0],
        json!({"server_uri": "127.0.0.1:15010", "channel_creds": [{"type": "insecure"}],
               "server_features": ["xds_v3"]})
    );
    assert_eq!(
        app["volumeMounts"],
        json!([
            ca_mounts[0], ca_mounts[1],
            {"name": "dubbo-cp-certs", "mountPath": "/var/run/dubbo-cp/certs", "readOnly": true},
        ])
    );
    // The injected pod reviewed again (another of our webhooks matching it): left whole.
    let again = review("uid-5", &patched).await;
    assert!(again["response"].get("patch").is_none(), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_a_cluster_the_configuration_names_webhook_url_and_the_certificate_its_host() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::kubernetes_config(dir.path(), api.url());
    config.auth.token_review = Some(false);
    config.webhook.url = Some("https://10.1.2.3:30080".to_owned());
    let server = start(config).await;
    let webhook = server.webhook_addr.unwrap();
    api.wait_for(
        "the webhook configuration",
        Duration::from_secs(20),
        |api| {
            api.object("mutatingwebhookconfigurations", "", "dubbo-cp")
                .is_some()
        },
    )
    .await;
    let configuration = api
        .object("mutatingwebhookconfigurations", "", "dubbo-cp")
        .unwrap();
    for hook in configuration["webhooks"].as_array().unwrap() {
        assert_eq!(
            hook["clientConfig"]["url"],
            "https://10.1.2.3:30080/mutating-services"
        );
        assert!(hook["clientConfig"].get("service").is_none());
    }
    // The API server verifies the certificate against the URL's host: an IP SAN here.
    let root = root_of(&api);
    let tcp = tokio::net::TcpStream::connect(webhook).await.unwrap();
    let name =
        rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::from([10, 1, 2, 3]).into());
    connector(&root)
        .connect(name, tcp)
        .await
        .expect("the certificate names webhook.url's host");
    assert!(server.stop().await.is_ok());
}
