//! A DDS client for the SDK path: what a Dubbo SDK does with the discovery stream, calling the
//! same providers as the xDS client. No released SDK reads our stream (the brief), so this one
//! applies the rules as Dubbo Java's consumer does:
//! - ConditionRoutes of the application (`ConditionStateRouter`): each condition whose `when`
//!   the call matches narrows the providers to those its `then` selects, and is skipped when it
//!   would leave none (a rule that is not `force`); a rule without `=>` is all `then`, and
//!   `=> false` leaves none. Keys: `attachments[...]` and `method` on the call, `host` on the
//!   provider; values are Dubbo globs (one `*`) in comma lists.
//! - DynamicConfigs of the application (override configurators): each enabled provider-side
//!   config whose `addresses` name the provider (`ip`, `ip:port`, `0.0.0.0` or none) sets its
//!   parameters, address-wide ones first, then those naming the provider.
//! - `RandomLoadBalance`: a weighted pick by `weight` (default 100), uniform when every weight
//!   is the same or all are 0. Warm-up (a provider's weight ramping over its first minutes) is
//!   left out: these providers carry no start timestamp.
//!
//! The providers come from the test, as an SDK's registry would list the application's
//! instances. Rules are read from the namespace the client is in (keys `<name>/<namespace>`).
//! Commands and answers are those of [`super::Client`], so the tests read both alike.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use dubbo_cp::pb::dds::ObserveRequest;
use dubbo_cp::pb::dds::rule_service_client::RuleServiceClient;
use dubbo_cp::pb::rules::{
    ConditionRoute, ConditionRouteToClient, DynamicConfig, DynamicConfigToClient,
};
use dubbo_cp::rules::condition::glob;
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

const CONDITION_ROUTE: &str = "dubbo.apache.org/v1alpha1/ConditionRoute";
const DYNAMIC_CONFIG: &str = "dubbo.apache.org/v1alpha1/DynamicConfig";
const METHOD: &str = "/dubbo.test.Echo/Who";
const INJECTED: &str = "injected failure";
const DEFAULT_WEIGHT: u64 = 100;

/// The rules of one namespace as last received (each kind is state of the world).
#[derive(Default)]
struct Rules {
    routes: Vec<ConditionRoute>,
    configs: Vec<DynamicConfig>,
    /// Responses applied, per kind, for tests that count pushes.
    pushes: BTreeMap<&'static str, u64>,
    /// The weights each DynamicConfig push said, by address (the last 256 pushes).
    weight_pushes: std::collections::VecDeque<BTreeMap<String, String>>,
}

enum Command {
    Count(usize, Vec<(String, String)>),
    Settle(String, usize, Vec<(String, String)>),
    Totals,
    Reset,
}

/// A Dubbo SDK's consumer of `application`, calling `/dubbo.test.Echo/Who` from its first
/// command on; stopped when dropped.
pub struct SdkClient {
    commands: mpsc::Sender<(Command, oneshot::Sender<Value>)>,
    rules: Arc<Mutex<Rules>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for SdkClient {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl SdkClient {
    /// Reads the discovery stream at `plane` (the control plane's gRPC port) as a client in
    /// `namespace`; `providers` lists the application's instances (`ip:port`).
    pub async fn start(
        plane: SocketAddr,
        namespace: &str,
        application: &str,
        providers: watch::Receiver<Vec<SocketAddr>>,
    ) -> SdkClient {
        let rules = Arc::new(Mutex::new(Rules::default()));
        let (ready_tx, ready_rx) = oneshot::channel();
        let stream = tokio::spawn(observe(
            plane,
            format!("/{namespace}"),
            rules.clone(),
            ready_tx,
        ));
        // Calls start once the first response of each kind is applied, as an SDK's consumer
        // starts once its configuration is read.
        tokio::time::timeout(Duration::from_secs(60), ready_rx)
            .await
            .expect("the discovery stream answered both kinds within 60 s")
            .expect("the discovery stream answered both kinds");
        let (commands, rx) = mpsc::channel(1);
        let caller = tokio::spawn(call_loop(
            application.to_owned(),
            providers,
            rules.clone(),
            rx,
        ));
        SdkClient {
            commands,
            rules,
            tasks: vec![stream, caller],
        }
    }

    async fn ask(&self, command: Command) -> Value {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send((command, tx))
            .await
            .expect("the SDK client runs");
        tokio::time::timeout(Duration::from_secs(300), rx)
            .await
            .expect("an answer within 5 minutes")
            .expect("the SDK client answers")
    }

    pub async fn count(&mut self, n: usize) -> Value {
        self.count_with(n, "").await
    }

    /// Who answered the next `n` calls, each with `metadata` (`key=value` words), as
    /// [`super::Client::count_with`].
    pub async fn count_with(&mut self, n: usize, metadata: &str) -> Value {
        self.ask(Command::Count(n, words(metadata))).await
    }

    pub async fn settle(&mut self, who: &str, run: usize) {
        self.settle_with(who, run, "").await;
    }

    /// Waits until `who` answered `run` calls in a row (at most 5,000 calls); how many it took.
    pub async fn settle_with(&mut self, who: &str, run: usize, metadata: &str) -> u64 {
        let settled = self
            .ask(Command::Settle(who.to_owned(), run, words(metadata)))
            .await;
        assert_eq!(
            settled["settled"], true,
            "SDK: {who} never answered: {settled}"
        );
        settled["calls"].as_u64().unwrap()
    }

    pub async fn totals(&mut self) -> Value {
        self.ask(Command::Totals).await
    }

    /// Starts the totals afresh.
    pub async fn reset_totals(&mut self) {
        self.ask(Command::Reset).await;
    }

    /// The weights, by address, of each DynamicConfig push applied (the last 256), oldest first.
    pub fn weight_pushes(&self) -> Vec<BTreeMap<String, String>> {
        self.rules
            .lock()
            .unwrap()
            .weight_pushes
            .iter()
            .cloned()
            .collect()
    }

    /// How many responses of `kind` (`"ConditionRoute"`, `"DynamicConfig"`) were applied.
    pub fn pushes(&self, kind: &str) -> u64 {
        let rules = self.rules.lock().unwrap();
        rules
            .pushes
            .iter()
            .find(|(k, _)| k.ends_with(&format!("/{kind}")))
            .map_or(0, |(_, n)| *n)
    }
}

fn words(metadata: &str) -> Vec<(String, String)> {
    metadata
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The discovery stream: subscribes to both kinds, applies each response (the rules of keys
/// ending in `suffix`), then acknowledges it. Reconnects if the stream ends.
async fn observe(
    plane: SocketAddr,
    suffix: String,
    rules: Arc<Mutex<Rules>>,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    loop {
        if let Err(e) = observe_once(plane, &suffix, &rules, &mut ready).await {
            eprintln!("SDK client: discovery stream: {e}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn observe_once(
    plane: SocketAddr,
    suffix: &str,
    rules: &Mutex<Rules>,
    ready: &mut Option<oneshot::Sender<()>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let channel = Endpoint::from_shared(format!("http://{plane}"))?
        .connect()
        .await?;
    let (requests, rx) = mpsc::channel(4);
    for kind in [CONDITION_ROUTE, DYNAMIC_CONFIG] {
        requests
            .send(ObserveRequest {
                nonce: String::new(),
                r#type: kind.to_owned(),
            })
            .await?;
    }
    let mut responses = RuleServiceClient::new(channel)
        .observe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        let objects = response.data.decode()?;
        {
            let mut rules = rules.lock().unwrap();
            let kind = if response.r#type == CONDITION_ROUTE {
                rules.routes = of_namespace(&objects, suffix, |o: ConditionRouteToClient| {
                    (o.key, o.spec)
                })?;
                CONDITION_ROUTE
            } else if response.r#type == DYNAMIC_CONFIG {
                rules.configs =
                    of_namespace(&objects, suffix, |o: DynamicConfigToClient| (o.key, o.spec))?;
                let said = rules
                    .configs
                    .iter()
                    .flat_map(|c| &c.configs)
                    .filter_map(|o| Some((&o.addresses, o.parameters.get("weight")?)))
                    .flat_map(|(addresses, w)| addresses.iter().map(|a| (a.clone(), w.clone())))
                    .collect();
                if rules.weight_pushes.len() == 256 {
                    rules.weight_pushes.pop_front();
                }
                rules.weight_pushes.push_back(said);
                DYNAMIC_CONFIG
            } else {
                continue;
            };
            *rules.pushes.entry(kind).or_default() += 1;
            if rules.pushes.len() == 2
                && let Some(ready) = ready.take()
            {
                let _ = ready.send(());
            }
        }
        requests
            .send(ObserveRequest {
                nonce: response.nonce,
                r#type: response.r#type,
            })
            .await?;
    }
    Ok(())
}

/// The specs of `objects` (each a `<Kind>ToClient`, split by `keyed` into key and spec) whose
/// key ends in `suffix`, the client's namespace.
fn of_namespace<T: Message + Default, S>(
    objects: &[prost_types::Any],
    suffix: &str,
    keyed: impl Fn(T) -> (String, Option<S>),
) -> Result<Vec<S>, prost::DecodeError> {
    let mut specs = Vec::new();
    for any in objects {
        let (key, spec) = keyed(T::decode(any.value.as_slice())?);
        if key.ends_with(suffix) {
            specs.extend(spec);
        }
    }
    Ok(specs)
}

/// What the current command counts, as the released client's script keeps it.
struct Window {
    command: Command,
    reply: oneshot::Sender<Value>,
    counts: BTreeMap<String, u64>,
    done: usize,
    streak: (String, usize),
}

async fn call_loop(
    application: String,
    providers: watch::Receiver<Vec<SocketAddr>>,
    rules: Arc<Mutex<Rules>>,
    mut commands: mpsc::Receiver<(Command, oneshot::Sender<Value>)>,
) {
    let mut channels: BTreeMap<SocketAddr, Channel> = BTreeMap::new();
    let mut random = Random::seeded();
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_error = String::new();
    let mut window: Option<Window> = None;
    let mut metadata: Vec<(String, String)> = Vec::new();
    let mut started = false;
    loop {
        // A command replaces the window at once, or is awaited while idle.
        let next = if window.is_none() && !started {
            commands.recv().await
        } else {
            commands.try_recv().ok()
        };
        if let Some((command, reply)) = next {
            started = true;
            match command {
                Command::Totals => {
                    let mut answer = json!(totals);
                    if !last_error.is_empty() {
                        answer["last_error"] = json!(last_error);
                    }
                    let _ = reply.send(answer);
                    continue;
                }
                Command::Reset => {
                    totals.clear();
                    last_error.clear();
                    let _ = reply.send(json!({"reset": true}));
                    continue;
                }
                Command::Count(_, ref m) | Command::Settle(_, _, ref m) => metadata = m.clone(),
            }
            window = Some(Window {
                command,
                reply,
                counts: BTreeMap::new(),
                done: 0,
                streak: (String::new(), 0),
            });
        }
        let instances = providers.borrow().clone();
        channels.retain(|addr, _| instances.contains(addr));
        let chosen = {
            let rules = rules.lock().unwrap();
            choose(&rules, &application, &instances, &metadata, &mut random)
        };
        let who = match chosen {
            None => {
                last_error = "no provider".to_owned();
                // Nothing to call: wait for the registry rather than spin.
                let mut changed = providers.clone();
                let _ = tokio::time::timeout(Duration::from_millis(100), changed.changed()).await;
                "error".to_owned()
            }
            Some(addr) => {
                let channel = channels.entry(addr).or_insert_with(|| {
                    Endpoint::from_shared(format!("http://{addr}"))
                        .unwrap()
                        .connect_lazy()
                });
                match call(channel.clone(), &metadata).await {
                    Ok(who) => who,
                    Err(status) if status.message() == INJECTED => "injected".to_owned(),
                    Err(status) => {
                        last_error = format!("{addr}: {status}");
                        // A provider that is gone refuses at once, without the call ever
                        // waiting: back off as an SDK would, or this loop spins, starves the
                        // runtime (and the registry update that would end the spin) and cannot
                        // be aborted.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        "error".to_owned()
                    }
                }
            }
        };
        *totals.entry(who.clone()).or_default() += 1;
        // Every call may be answered without a pending await (an error, a cached answer): give
        // the runtime its turn, so the test's other tasks run and dropping the client stops it.
        tokio::task::yield_now().await;
        let Some(current) = window.as_mut() else {
            continue;
        };
        *current.counts.entry(who.clone()).or_default() += 1;
        current.done += 1;
        current.streak = if current.streak.0 == who {
            (who, current.streak.1 + 1)
        } else {
            (who, 1)
        };
        let answer = match &current.command {
            Command::Count(n, _) if current.done >= *n => {
                let mut answer = json!(current.counts);
                if current.counts.contains_key("error") {
                    answer["last_error"] = json!(last_error);
                }
                Some(answer)
            }
            Command::Settle(who, run, _) => {
                let settled = current.streak.0 == *who && current.streak.1 >= *run;
                (settled || current.done >= 5000)
                    .then(|| json!({"settled": settled, "calls": current.done}))
            }
            _ => None,
        };
        if let Some(answer) = answer
            && let Some(done) = window.take()
        {
            let _ = done.reply.send(answer);
        }
    }
}

/// One unary call with `metadata`; the provider's name, or the status.
async fn call(channel: Channel, metadata: &[(String, String)]) -> Result<String, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(Bytes::new());
    request.set_timeout(Duration::from_secs(10));
    for (key, value) in metadata {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            request.metadata_mut().insert(key, value);
        }
    }
    let path = http::uri::PathAndQuery::from_static(METHOD);
    let answer = grpc.unary(request, path, RawCodec).await?.into_inner();
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The provider a Dubbo consumer would call: routed, then weighed.
fn choose(
    rules: &Rules,
    application: &str,
    instances: &[SocketAddr],
    metadata: &[(String, String)],
    random: &mut Random,
) -> Option<SocketAddr> {
    let mut candidates = instances.to_vec();
    for route in rules
        .routes
        .iter()
        .filter(|r| r.enabled && r.scope == "application" && r.key == application)
    {
        for condition in &route.conditions {
            candidates = apply_condition(condition, route.force, candidates, metadata);
        }
    }
    let weights: Vec<u64> = candidates
        .iter()
        .map(|addr| weight(rules, application, *addr))
        .collect();
    let total: u64 = weights.iter().sum();
    let same = weights.windows(2).all(|w| w[0] == w[1]);
    if candidates.is_empty() {
        return None;
    }
    if total == 0 || same {
        return Some(candidates[random.below(candidates.len() as u64) as usize]);
    }
    let mut point = random.below(total);
    for (addr, weight) in candidates.iter().zip(&weights) {
        if point < *weight {
            return Some(*addr);
        }
        point -= weight;
    }
    candidates.last().copied()
}

/// `when => then`: a call `when` matches keeps the providers `then` selects, unless none
/// would be left and the rule is not `force`.
fn apply_condition(
    condition: &str,
    force: bool,
    candidates: Vec<SocketAddr>,
    metadata: &[(String, String)],
) -> Vec<SocketAddr> {
    // Without `=>` the whole rule is the `then` (every call matches).
    let (when, then) = match condition.split_once("=>") {
        Some((when, then)) => (when.trim(), then.trim()),
        None => ("", condition.trim()),
    };
    let call_value = |key: &str| -> Option<String> {
        if key == "method" {
            return METHOD.rsplit('/').next().map(str::to_owned);
        }
        let name = key.strip_prefix("attachments[")?.strip_suffix(']')?;
        metadata
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let matches_call = clauses(when)
        .into_iter()
        .all(|(key, negated, values)| match_value(call_value(key), negated, &values));
    if !matches_call {
        return candidates;
    }
    if then.is_empty() || then == "false" {
        // `=> false` or nothing after `=>`: no provider for this call, forced or not.
        return Vec::new();
    }
    let kept: Vec<SocketAddr> = candidates
        .iter()
        .copied()
        .filter(|addr| {
            clauses(then).into_iter().all(|(key, negated, values)| {
                let value = (key == "host").then(|| addr.ip().to_string());
                match_value(value, negated, &values)
            })
        })
        .collect();
    if kept.is_empty() && !force {
        candidates
    } else {
        kept
    }
}

/// `k=v1,v2 & k2!=v3` as (key, negated, values).
fn clauses(text: &str) -> Vec<(&str, bool, Vec<&str>)> {
    text.split('&')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .filter_map(|clause| {
            let (key, negated, values) = match clause.split_once("!=") {
                Some((k, v)) => (k, true, v),
                None => {
                    let (k, v) = clause.split_once('=')?;
                    (k, false, v)
                }
            };
            Some((
                key.trim(),
                negated,
                values.split(',').map(str::trim).collect(),
            ))
        })
        .collect()
}

/// Dubbo's `MatchPair`: `=` needs a value among the globs; `!=` needs none of them. A missing
/// value matches neither.
fn match_value(value: Option<String>, negated: bool, globs: &[&str]) -> bool {
    let Some(value) = value else {
        return false;
    };
    let any = globs.iter().any(|g| glob(g, &value));
    if negated { !any } else { any }
}

/// The provider's `weight` after the application's provider-side overrides.
fn weight(rules: &Rules, application: &str, addr: SocketAddr) -> u64 {
    let ip = addr.ip().to_string();
    let full = addr.to_string();
    let mut wide = None;
    let mut own = None;
    for config in rules
        .configs
        .iter()
        .filter(|c| c.enabled && c.scope == "application" && c.key == application)
    {
        for over in config
            .configs
            .iter()
            .filter(|o| o.enabled && o.side == "provider" && o.r#match.is_none())
            .filter(|o| {
                o.applications.is_empty() || o.applications.iter().any(|a| a == application)
            })
        {
            let Some(value) = over.parameters.get("weight") else {
                continue;
            };
            let names_it = over.addresses.iter().any(|a| *a == ip || *a == full);
            let wildcard =
                over.addresses.is_empty() || over.addresses.iter().any(|a| a == "0.0.0.0");
            if names_it {
                own = Some(value.clone());
            } else if wildcard {
                wide = Some(value.clone());
            }
        }
    }
    own.or(wide)
        .and_then(|w| w.parse::<i64>().ok())
        .map_or(DEFAULT_WEIGHT, |w| w.max(0) as u64)
}

/// Request and answer bytes as they are: the providers answer their name.
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// xorshift64*: the weighted pick needs uniform numbers, not a dependency.
struct Random(u64);

impl Random {
    fn seeded() -> Random {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Random(nanos | 1)
    }

    /// Uniform in `0..bound` (`bound` > 0; the modulo bias is below 1e-9 for these bounds).
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_narrow_as_dubbo_does() {
        let a: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "10.0.1.1:1".parse().unwrap();
        let insider = vec![("x-canary".to_owned(), "insider".to_owned())];
        let rule = "attachments[x-canary]=insider,beta* => host=10.0.0.1";
        assert_eq!(apply_condition(rule, false, vec![a, b], &insider), [a]);
        assert_eq!(apply_condition(rule, false, vec![a, b], &[]), [a, b]);
        // Leaving nobody: skipped unless forced.
        assert_eq!(apply_condition(rule, false, vec![b], &insider), [b]);
        assert!(apply_condition(rule, true, vec![b], &insider).is_empty());
        assert_eq!(
            apply_condition("=> host!=10.0.0.1", false, vec![a, b], &[]),
            [b]
        );
        assert!(glob("beta*", "beta-7") && !glob("beta*", "alpha"));
    }
}
