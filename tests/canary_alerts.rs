//! A Canary's alerts (docs/canary.md "Alerts") against the API-server fixture: one receiver per
//! provider type, each checked for the body Flagger's notifier of that type posts and for the
//! events its severity hears, through a good release and a failed one. Slack's address and token
//! come from a Secret (docs/canary.md's example), MS Teams goes through an HTTP proxy, the generic
//! webhook is an https receiver trusted through `canary.caFile`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use common::apiserver::ApiServer;
use common::{start, wait_ready};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "test";
const WAIT: Duration = Duration::from_secs(30);

const INITIALIZED: &str = "New Deployment detected, initialization completed.";
const NEW_REVISION: &str = "New revision detected, progressing canary analysis.";
const PROMOTED: &str = "Canary analysis completed successfully, promotion finished.";
const WAITING: &str = "Canary is waiting for approval.";
const ROLLED_BACK: &str = "Rolling back podinfo: canary failed 1 checks (threshold 1)";

/// One POST a receiver got: its path, `Authorization` header and JSON body.
#[derive(Clone, Debug)]
struct Post {
    path: String,
    authorization: Option<String>,
    body: Value,
}

/// Records every POST; answers 200, or the status the test set for a path.
#[derive(Clone, Default)]
struct Receiver {
    posts: Arc<Mutex<Vec<Post>>>,
    answers: Arc<Mutex<BTreeMap<String, u16>>>,
    changed: Arc<tokio::sync::Notify>,
}

impl Receiver {
    fn app(&self) -> axum::Router {
        async fn receive(
            State(receiver): State<Receiver>,
            uri: Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> StatusCode {
            let path = uri.path().to_owned();
            let authorization = headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned());
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            receiver.posts.lock().unwrap().push(Post {
                path: path.clone(),
                authorization,
                body,
            });
            receiver.changed.notify_waiters();
            let code = receiver.answers.lock().unwrap().get(&path).copied();
            StatusCode::from_u16(code.unwrap_or(200)).unwrap()
        }
        axum::Router::new()
            .fallback(axum::routing::post(receive))
            .with_state(self.clone())
    }

    fn answer(&self, path: &str, code: u16) {
        self.answers.lock().unwrap().insert(path.to_owned(), code);
    }

    fn posts_to(&self, path: &str) -> Vec<Post> {
        let posts = self.posts.lock().unwrap();
        posts.iter().filter(|p| p.path == path).cloned().collect()
    }

    /// Waits until the posts to `path` satisfy `done`.
    async fn wait(&self, path: &str, done: impl Fn(&[Post]) -> bool) -> Vec<Post> {
        tokio::time::timeout(WAIT, async {
            loop {
                let changed = self.changed.notified();
                let posts = self.posts_to(path);
                if done(&posts) {
                    return posts;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{path}: {:#?}", self.posts_to(path)))
    }
}

/// The message text of an alert body, whatever its provider type.
fn text_of(body: &Value) -> String {
    [
        &body["attachments"][0]["text"],
        &body["sections"][0]["activityTitle"],
        &body["metadata"]["eventMessage"],
    ]
    .into_iter()
    .find_map(|v| v.as_str().map(str::to_owned))
    .or_else(|| {
        let text = body["cards"][0]["sections"][0]["widgets"][0]["textParagraph"]["text"].as_str();
        text.map(|t| {
            t.trim_start_matches("<font color=#848484><strong>")
                .trim_end_matches("</strong></font>")
                .to_owned()
        })
    })
    .unwrap_or_else(|| panic!("no message in {body}"))
}

fn texts(posts: &[Post]) -> Vec<String> {
    let mut texts: Vec<String> = posts.iter().map(|p| text_of(&p.body)).collect();
    texts.sort();
    texts
}

fn sorted(texts: &[&str]) -> Vec<String> {
    let mut texts: Vec<String> = texts.iter().map(|t| (*t).to_owned()).collect();
    texts.sort();
    texts
}

/// The post to `path` whose message is `text`.
fn post_of(receiver: &Receiver, path: &str, text: &str) -> Post {
    receiver
        .posts_to(path)
        .into_iter()
        .find(|p| text_of(&p.body) == text)
        .unwrap_or_else(|| panic!("no {text:?} at {path}"))
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A TLS listener for axum: connections whose handshake fails are skipped.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// `app` over https with a certificate for 127.0.0.1 from a fresh CA: (address, CA PEM).
async fn serve_https(app: axum::Router) -> (SocketAddr, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = server.signed_by(&key, &issuer).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = TlsListener {
        tcp,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, ca_cert.pem())
}

/// What a CONNECT proxy was asked: (request line, Proxy-Authorization).
type Tunnels = Arc<Mutex<Vec<(String, String)>>>;

/// A CONNECT-only HTTP proxy on loopback that records each tunnel it opens.
async fn connect_proxy(tunnels: Tunnels) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let tunnels = tunnels.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let line = head.lines().next().unwrap_or_default().to_owned();
                let auth = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(": ")?;
                        name.eq_ignore_ascii_case("proxy-authorization")
                            .then(|| value.to_owned())
                    })
                    .unwrap_or_default();
                tunnels.lock().unwrap().push((line.clone(), auth));
                let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
                let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    addr
}

/// Plays the Deployment controller and the kubelet every 20 ms.
fn kubelet(api: &ApiServer, running: Arc<AtomicBool>) {
    let api = api.clone();
    tokio::spawn(async move {
        while running.load(Ordering::Relaxed) {
            api.roll_out_changed(NS, |name| {
                if name.ends_with("-primary") {
                    "10.1.0."
                } else {
                    "10.0.0."
                }
                .to_owned()
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// The API-server fixture with namespace [`NS`], Deployment `podinfo` of `replicas` and a
/// kubelet rolling it out while the flag holds.
async fn cluster(replicas: i64) -> (ApiServer, Arc<AtomicBool>) {
    let api = ApiServer::start().await;
    api.create_namespace(NS);
    api.put_deployment(NS, "podinfo", replicas, "podinfo:1");
    let running = Arc::new(AtomicBool::new(true));
    kubelet(&api, running.clone());
    (api, running)
}

/// The control plane driving the fixture's Canaries, trusting `ca_file`'s CAs when given.
async fn plane(
    api: &ApiServer,
    dir: &std::path::Path,
    ca_file: Option<std::path::PathBuf>,
) -> dubbo_cp::server::RunningServer {
    let mut config = common::kubernetes_config(dir, api.url());
    config.auth.token_review = Some(false);
    config.canary.enabled = true;
    config.canary.ca_file = ca_file;
    config.canary.lease_duration = Duration::from_secs(2);
    let server = start(config).await;
    wait_ready(server.admin_addr).await;
    server
}

/// Waits until Canary `podinfo` is in `phase`.
async fn wait_phase(api: &ApiServer, phase: &'static str) -> Option<Value> {
    api.wait_for_object("canaries", NS, "podinfo", WAIT, move |c| {
        c.is_some_and(|c| c["status"]["phase"] == phase)
    })
    .await
}

/// docs/canary.md's Alerts example: its objects, and the `alerts` list for the Canary.
fn documented_example() -> (Vec<Value>, Value) {
    let text = include_str!("../docs/canary.md");
    let section = text.split("## Alerts\n").nth(1).unwrap();
    let block = section.split("```yaml\n").nth(1).unwrap();
    let block = block.split("```").next().unwrap();
    let mut objects = Vec::new();
    let mut alerts = Value::Null;
    for document in serde_yaml::Deserializer::from_str(block) {
        let value = <Value as serde::Deserialize>::deserialize(document).unwrap();
        if value.get("kind").is_some() {
            objects.push(value);
        } else {
            alerts = value["alerts"].clone();
        }
    }
    (objects, alerts)
}

/// `dubbo_cp_canary_alerts_total` of one type and outcome in a scrape (0 when absent).
fn alerts_counted(metrics: &str, r#type: &str, outcome: &str) -> u64 {
    let prefix = format!("dubbo_cp_canary_alerts_total{{type=\"{type}\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.parse().unwrap())
}

/// Scrapes `/metrics` until `done` holds (a counter moves once the sender has read the answer
/// the receiver already recorded).
async fn scraped_until(admin: SocketAddr, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, metrics) = common::http_get(admin, "/metrics").await;
        if done(&metrics) {
            return metrics;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not counted as expected: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn provider(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "AlertProvider",
           "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

#[tokio::test(flavor = "multi_thread")]
async fn each_provider_type_gets_flaggers_payload_for_the_events_its_severity_hears() {
    use base64::Engine;
    let base64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    let receiver = Receiver::default();
    let plain = serve(receiver.app()).await;
    let (secure, ca) = serve_https(receiver.app()).await;
    let tunnels: Tunnels = Arc::default();
    let proxy = connect_proxy(tunnels.clone()).await;

    let (api, running) = cluster(2).await;

    // Slack as documented; its Secret's address (pointed here) wins over the spec's.
    let (objects, documented_alerts) = documented_example();
    for mut object in objects {
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        match object["kind"].as_str().unwrap() {
            "Secret" => {
                let token = object["stringData"]["token"].as_str().unwrap().to_owned();
                object["data"] = json!({"address": base64(&format!("http://{plain}/slack")),
                                        "token": base64(&token)});
                object.as_object_mut().unwrap().remove("stringData");
                api.put_object("secrets", NS, &name, object);
            }
            _ => api.put_object("alertproviders", NS, &name, object),
        }
    }
    let at = |path: &str| format!("http://{plain}/{path}");
    api.put_object(
        "alertproviders",
        NS,
        "teams",
        provider(
            "teams",
            json!({"type": "msteams", "address": at("msteams"),
                   "proxy": format!("http://ops:pa%40ss@{proxy}")}),
        ),
    );
    api.put_object(
        "alertproviders",
        NS,
        "qa-discord",
        provider(
            "qa-discord",
            json!({"type": "discord", "address": at("discord")}),
        ),
    );
    api.put_object(
        "alertproviders",
        NS,
        "pager-rocket",
        provider(
            "pager-rocket",
            json!({"type": "rocket", "address": at("rocket"), "channel": "pager", "username": "cp"}),
        ),
    );
    api.put_object(
        "alertproviders",
        NS,
        "dev-gchat",
        provider(
            "dev-gchat",
            json!({"type": "gchat", "address": at("gchat")}),
        ),
    );
    api.put_object(
        "alertproviders",
        NS,
        "audit",
        provider(
            "audit",
            json!({"type": "webhook", "address": format!("https://127.0.0.1:{}/webhook", secure.port())}),
        ),
    );
    let mut alerts = documented_alerts.as_array().unwrap().clone();
    alerts.extend([
        json!({"name": "dev Teams", "providerRef": {"name": "teams"}}),
        json!({"name": "qa Discord", "severity": "warn", "providerRef": {"name": "qa-discord", "namespace": NS}}),
        json!({"name": "pager", "severity": "error", "providerRef": {"name": "pager-rocket"}}),
        json!({"name": "dev chat", "severity": "info", "providerRef": {"name": "dev-gchat"}}),
        json!({"name": "audit", "providerRef": {"name": "audit"}}),
    ]);
    api.put_object(
        "canaries",
        NS,
        "podinfo",
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
               "metadata": {"name": "podinfo", "namespace": NS},
               "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                        "analysis": {"interval": "200ms", "threshold": 1, "maxWeight": 20, "stepWeight": 20,
                                     "webhooks": [
                                         {"name": "gate", "type": "confirm-rollout", "url": at("gate")},
                                         {"name": "check", "type": "rollout", "url": at("check")}],
                                     "alerts": alerts}}}),
    );

    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let server = plane(&api, dir.path(), Some(ca_file)).await;
    let phase = |wanted: &'static str| wait_phase(&api, wanted);
    let count = |n: usize| move |posts: &[Post]| posts.len() >= n;

    // A good release: initialisation, the analysis starting, the promotion; info hears them.
    phase("Initialized").await;
    api.set_image(NS, "podinfo", "podinfo:2");
    phase("Succeeded").await;
    for path in ["/slack", "/msteams", "/gchat", "/webhook"] {
        let posts = receiver.wait(path, count(3)).await;
        assert_eq!(
            texts(&posts),
            sorted(&[INITIALIZED, NEW_REVISION, PROMOTED]),
            "{path}"
        );
    }

    // A release held by its gate (warn), then failing its check (error).
    let gated = receiver.posts_to("/gate").len();
    receiver.answer("/gate", 500);
    receiver.answer("/check", 500);
    api.set_image(NS, "podinfo", "podinfo:3");
    // The gate says no three times (three intervals held), then the run's one WAITING alert
    // must be the only one: a repeat per held interval would be there by now.
    receiver.wait("/gate", count(gated + 3)).await;
    let waiting = |posts: &[Post]| posts.iter().any(|p| text_of(&p.body) == WAITING);
    receiver.wait("/discord/slack", waiting).await;
    let waited = texts(&receiver.posts_to("/discord/slack"));
    assert_eq!(waited, [WAITING], "one WAITING alert per run");
    receiver.answer("/gate", 200);
    let failed = phase("Failed").await.unwrap();
    let everything = [
        INITIALIZED,
        NEW_REVISION,
        PROMOTED,
        WAITING,
        NEW_REVISION,
        ROLLED_BACK,
    ];
    for path in ["/slack", "/msteams", "/gchat", "/webhook"] {
        let posts = receiver.wait(path, count(6)).await;
        assert_eq!(texts(&posts), sorted(&everything), "{path}");
    }
    let discord = receiver.wait("/discord/slack", count(2)).await;
    assert_eq!(texts(&discord), sorted(&[WAITING, ROLLED_BACK]));
    let rocket = receiver.wait("/rocket", count(1)).await;
    assert_eq!(texts(&rocket), [ROLLED_BACK]);

    // Slack: attachments with the run's fields, from the Secret's address with its token.
    let slack = post_of(&receiver, "/slack", NEW_REVISION);
    assert_eq!(
        slack.authorization.as_deref(),
        Some("Bearer xoxb-not-a-real-token")
    );
    assert_eq!(
        slack.body,
        json!({
            "channel": "on-call-alerts", "username": "dubbo-cp",
            "icon_url": "", "icon_emoji": ":rocket:",
            "attachments": [{
                "color": "good", "author_name": "podinfo.test", "text": NEW_REVISION,
                "mrkdwn_in": ["text"],
                "fields": [
                    {"title": "Target", "value": "Deployment/podinfo.test", "short": false},
                    {"title": "Failed checks threshold", "value": "1", "short": false},
                    {"title": "Progress deadline", "value": "600s", "short": false},
                    {"title": "Traffic routing", "value": "Weight step: 20 max: 20", "short": false},
                ],
            }],
        })
    );
    // Only Slack is given the token.
    assert!(
        receiver
            .posts
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.path != "/slack")
            .all(|p| p.authorization.is_none())
    );

    // Discord: Slack's shape under /slack, Flagger's defaults, an error in red.
    assert_eq!(
        post_of(&receiver, "/discord/slack", ROLLED_BACK).body,
        json!({
            "channel": "general", "username": "dubbo-cp",
            "icon_url": "", "icon_emoji": ":rocket:",
            "attachments": [{"color": "danger", "author_name": "podinfo.test", "text": ROLLED_BACK,
                             "mrkdwn_in": ["text"], "fields": []}],
        })
    );
    assert_eq!(
        post_of(&receiver, "/discord/slack", WAITING).body["attachments"][0]["color"],
        "good"
    );

    // Rocket: Slack's shape in Rocket's colours.
    assert_eq!(
        rocket[0].body,
        json!({
            "channel": "pager", "username": "cp", "icon_url": "", "icon_emoji": ":rocket:",
            "attachments": [{"color": "#FF0000", "author_name": "podinfo.test", "text": ROLLED_BACK,
                             "mrkdwn_in": ["text"], "fields": []}],
        })
    );

    // MS Teams: a MessageCard, through the proxy (one CONNECT tunnel per alert, with the
    // proxy's credentials).
    assert_eq!(
        post_of(&receiver, "/msteams", PROMOTED).body,
        json!({
            "@type": "MessageCard", "@context": "http://schema.org/extensions",
            "themeColor": "0076D7", "summary": "podinfo.test",
            "sections": [{"activityTitle": PROMOTED, "activitySubtitle": "podinfo.test", "facts": []}],
        })
    );
    assert_eq!(
        post_of(&receiver, "/msteams", ROLLED_BACK).body["themeColor"],
        "FF0000"
    );
    let tunnels = tunnels.lock().unwrap().clone();
    assert_eq!(tunnels.len(), 6, "{tunnels:?}");
    for (line, auth) in &tunnels {
        assert_eq!(line, &format!("CONNECT {plain} HTTP/1.1"));
        assert_eq!(auth, &format!("Basic {}", base64("ops:pa@ss")));
    }

    // Google Chat: a card, one section per field.
    assert_eq!(
        post_of(&receiver, "/gchat", INITIALIZED).body,
        json!({"cards": [{
            "header": {"title": "dubbo-cp", "subtitle": "podinfo.test"},
            "sections": [
                {"widgets": [{"textParagraph": {"text": format!("<font color=#848484><strong>{INITIALIZED}</strong></font>")}}]},
                {"widgets": [{"textParagraph": {"text": "Target<br><font color=#848484><strong>Deployment/podinfo.test</strong></font>"}}]},
                {"widgets": [{"textParagraph": {"text": "Failed checks threshold<br><font color=#848484><strong>1</strong></font>"}}]},
                {"widgets": [{"textParagraph": {"text": "Progress deadline<br><font color=#848484><strong>600s</strong></font>"}}]},
                {"widgets": [{"textParagraph": {"text": "Traffic routing<br><font color=#848484><strong>Weight step: 20 max: 20</strong></font>"}}]},
            ],
        }]})
    );

    // The generic webhook, over https trusted through canary.caFile: the event hook's body and
    // the Canary as the failing step wrote it.
    let webhook = post_of(&receiver, "/webhook", ROLLED_BACK).body;
    let status = &failed["status"];
    assert_eq!(webhook["name"], "podinfo");
    assert_eq!(webhook["namespace"], NS);
    assert_eq!(webhook["phase"], "Failed");
    assert_eq!(webhook["checksum"], status["lastAppliedSpec"]);
    let metadata = webhook["metadata"].as_object().unwrap();
    assert_eq!(
        metadata.keys().collect::<Vec<_>>(),
        ["eventMessage", "eventType", "severity", "timestamp"]
    );
    assert_eq!(metadata["eventType"], "Warning");
    assert_eq!(metadata["severity"], "error");
    assert_eq!(webhook["canary"]["kind"], "Canary");
    assert_eq!(webhook["canary"]["status"]["phase"], "Failed");
    assert_eq!(
        webhook["canary"]["status"]["failedChecks"],
        status["failedChecks"]
    );
    assert_eq!(
        webhook["canary"]["spec"]["analysis"]["alerts"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    let started = post_of(&receiver, "/webhook", INITIALIZED).body;
    assert_eq!(started["metadata"]["eventType"], "Normal");
    assert_eq!(
        started["metadata"]["Traffic routing"],
        "Weight step: 20 max: 20"
    );

    // Counted (once the sender has read each answer): 6 sent to each of four info receivers,
    // 2 to Discord, 1 to Rocket, none failed.
    let expected = [
        ("slack", 6),
        ("msteams", 6),
        ("gchat", 6),
        ("webhook", 6),
        ("discord", 2),
        ("rocket", 1),
    ];
    let metrics = scraped_until(server.admin_addr, |metrics| {
        expected
            .iter()
            .all(|(r#type, sent)| alerts_counted(metrics, r#type, "sent") == *sent)
    })
    .await;
    assert!(!metrics.contains("outcome=\"failed\""), "{metrics}");
    running.store(false, Ordering::Relaxed);
    server.stop().await.unwrap();
}

/// A receiver that fails, one that never answers, a provider that does not exist: the run goes
/// on as if no alert were configured, and each failure is counted.
#[tokio::test(flavor = "multi_thread")]
async fn failing_and_hanging_receivers_never_hold_or_fail_the_run() {
    let receiver = Receiver::default();
    let plain = serve(receiver.app()).await;
    receiver.answer("/refused", 500);
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let holder = held.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = silent.accept().await {
            holder.lock().unwrap().push(socket);
        }
    });

    let (api, running) = cluster(1).await;
    api.put_object(
        "alertproviders",
        NS,
        "refused",
        provider(
            "refused",
            json!({"type": "slack", "address": format!("http://{plain}/refused")}),
        ),
    );
    api.put_object(
        "alertproviders",
        NS,
        "silent",
        provider(
            "silent",
            json!({"type": "msteams", "address": format!("http://{silent_addr}/hook")}),
        ),
    );
    api.put_object(
        "alertproviders",
        NS,
        "no-secret",
        provider(
            "no-secret",
            json!({"type": "gchat", "secretRef": {"name": "missing"}}),
        ),
    );
    api.put_object(
        "canaries",
        NS,
        "podinfo",
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
               "metadata": {"name": "podinfo", "namespace": NS},
               "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                        "analysis": {"interval": "100ms", "threshold": 1, "maxWeight": 50, "stepWeight": 50,
                                     "alerts": [
                                         {"name": "refused", "providerRef": {"name": "refused"}},
                                         {"name": "silent", "providerRef": {"name": "silent"}},
                                         {"name": "no secret", "providerRef": {"name": "no-secret"}},
                                         {"name": "gone", "providerRef": {"name": "gone"}}]}}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = plane(&api, dir.path(), None).await;
    let phase = |wanted: &'static str| wait_phase(&api, wanted);
    phase("Initialized").await;
    // The silent receiver holds each alert until the sender gives up after 5 s (counted then as
    // failed). The release finishes before the first of them gives up: had the run waited for
    // one delivery, its failure would be counted by now. (The run takes well under a second;
    // the 5 s are the sender's own limit, not a guess of the test's.)
    api.set_image(NS, "podinfo", "podinfo:2");
    phase("Succeeded").await;
    let (_, metrics) = common::http_get(server.admin_addr, "/metrics").await;
    assert_eq!(
        alerts_counted(&metrics, "msteams", "failed"),
        0,
        "the run waited for a silent receiver: {metrics}"
    );
    receiver.wait("/refused", |p| p.len() >= 3).await;

    // Every failure is counted by type (empty: the provider could not be read): three events,
    // each failing at four alerts, two of them before any type is known.
    let metrics = scraped_until(server.admin_addr, |metrics| {
        alerts_counted(metrics, "slack", "failed") == 3
            && alerts_counted(metrics, "msteams", "failed") == 3
            && alerts_counted(metrics, "", "failed") == 6
    })
    .await;
    assert!(!metrics.contains("outcome=\"sent\""), "{metrics}");
    running.store(false, Ordering::Relaxed);
    server.stop().await.unwrap();
}

/// Flagger's `muteAlert`: a gate with it holds the run as any gate does, but its wait sends no
/// alert; the run's other alerts still go out.
#[tokio::test(flavor = "multi_thread")]
async fn a_muted_gate_holds_the_run_without_an_alert() {
    let receiver = Receiver::default();
    let addr = serve(receiver.app()).await;
    let (api, running) = cluster(1).await;
    api.put_object(
        "alertproviders",
        NS,
        "audit",
        provider(
            "audit",
            json!({"type": "webhook", "address": format!("http://{addr}/webhook")}),
        ),
    );
    let gate = |kind: &str, path: &str| {
        json!({"name": path, "type": kind, "url": format!("http://{addr}/{path}"),
               "muteAlert": true})
    };
    api.put_object(
        "canaries",
        NS,
        "podinfo",
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
               "metadata": {"name": "podinfo", "namespace": NS},
               "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                        "analysis": {"interval": "100ms", "threshold": 1, "maxWeight": 50, "stepWeight": 50,
                                     "webhooks": [gate("confirm-rollout", "rollout"),
                                                  gate("confirm-traffic-increase", "step"),
                                                  gate("confirm-promotion", "promote")],
                                     "alerts": [{"name": "audit", "providerRef": {"name": "audit"}}]}}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = plane(&api, dir.path(), None).await;
    let phase = |wanted: &'static str| wait_phase(&api, wanted);
    phase("Initialized").await;
    // Each gate refuses three times (three intervals held), then lets the run through.
    for path in ["/rollout", "/step", "/promote"] {
        receiver.answer(path, 403);
    }
    api.set_image(NS, "podinfo", "podinfo:2");
    for path in ["/rollout", "/step", "/promote"] {
        receiver.wait(path, |posts| posts.len() >= 3).await;
        receiver.answer(path, 200);
    }
    phase("Succeeded").await;
    let posts = receiver
        .wait("/webhook", |posts| {
            posts.iter().any(|p| text_of(&p.body) == PROMOTED)
        })
        .await;
    assert_eq!(
        texts(&posts),
        sorted(&[INITIALIZED, NEW_REVISION, PROMOTED]),
        "a muted gate alerted"
    );
    running.store(false, Ordering::Relaxed);
    server.stop().await.unwrap();
}
