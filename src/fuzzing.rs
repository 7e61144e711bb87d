//! Harnesses shared by the fuzz targets (`fuzz/`) and the test that replays their committed
//! corpus (`tests/fuzz_corpus.rs`). Each takes arbitrary bytes and panics only when an invariant
//! breaks; malformed input must come back as an error, never a panic.

use std::collections::BTreeSet;
use std::time::Duration;

use prost::Message;

use crate::dds::wire::ObserveResponse;
use crate::debounce::{self, Batch, DebounceConfig, Merge};
use crate::mapping::{MAX_INTERFACES_PER_REQUEST, validate_registration};
use crate::pb::dds::ObserveRequest;
use crate::pb::snp::ServiceMappingRequest;
use crate::rules::{Kind, RuleSpec, parse_condition};

/// Decoding and validating a registration: a valid one satisfies every rule it promises.
pub fn registration(data: &[u8]) {
    let Ok(request) = ServiceMappingRequest::decode(data) else {
        return;
    };
    match validate_registration(
        &request.namespace,
        &request.application_name,
        &request.interface_names,
    ) {
        Ok(registration) => {
            assert!(!registration.interfaces.is_empty());
            assert!(registration.interfaces.len() <= MAX_INTERFACES_PER_REQUEST);
            assert!(
                registration
                    .interfaces
                    .iter()
                    .all(|i| !i.is_empty() && !i.chars().any(char::is_whitespace))
            );
            assert!(!registration.application.contains(','));
            let requested: BTreeSet<&String> = request.interface_names.iter().collect();
            assert_eq!(
                requested.len(),
                registration.interfaces.len(),
                "duplicates must collapse, nothing else"
            );
        }
        Err(err) => assert!(!err.field.is_empty(), "an error must name its field"),
    }
}

/// The ConditionRoute grammar on arbitrary text: a parsed condition has keys and values free of
/// separators and whitespace, every key has a value, and its canonical text parses back to the
/// same condition. A refusal names a column within the text. The same text as a whole rule must
/// be refused or accepted without a panic.
pub fn condition_route(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_condition(text) {
        Ok(condition) => {
            let clauses = condition.when.iter().chain(condition.then.iter().flatten());
            for clause in clauses {
                assert!(!clause.matches.is_empty() || !clause.mismatches.is_empty());
                for word in std::iter::once(&clause.key)
                    .chain(&clause.matches)
                    .chain(&clause.mismatches)
                {
                    assert!(!word.is_empty());
                    assert!(
                        !word
                            .chars()
                            .any(|c| c.is_whitespace() || "&!=,".contains(c)),
                        "{word:?} holds a separator"
                    );
                }
            }
            let canonical = condition.to_string();
            assert_eq!(
                parse_condition(&canonical).as_ref(),
                Ok(&condition),
                "{canonical:?} does not parse back"
            );
        }
        Err(err) => assert!(
            err.column >= 1 && err.column <= text.chars().count() + 1,
            "column {} outside {text:?}",
            err.column
        ),
    }
    let spec = serde_json::json!({
        "key": "app",
        "scope": "application",
        "configVersion": "v3.0",
        "conditions": [text],
    });
    match RuleSpec::parse(Kind::ConditionRoute, &spec) {
        Ok(_) => assert!(parse_condition(text).is_ok()),
        Err(err) => {
            assert!(parse_condition(text).is_err());
            assert_eq!(err.path, "spec.conditions[0]");
        }
    }
}

/// Decoding what a data-plane client sends, and our hand-written response encoding: a decoded
/// response re-encodes to bytes that decode to the same message.
pub fn observe(data: &[u8]) {
    if let Ok(request) = ObserveRequest::decode(data) {
        let _ = Kind::from_type_name(&request.r#type);
    }
    if let Ok(response) = ObserveResponse::decode(data) {
        let encoded = response.encode_to_vec();
        assert_eq!(encoded.len(), response.encoded_len());
        let again = ObserveResponse::decode(encoded.as_slice());
        assert_eq!(
            again.ok().as_ref(),
            Some(&response),
            "re-encoding changed the message"
        );
        let _ = response.data.decode();
    }
}

#[derive(Debug, Default)]
struct Values(BTreeSet<u8>);

impl Merge for Values {
    fn merge(&mut self, other: Self) {
        self.0.extend(other.0);
    }
}

/// The debounce loop driven by bytes: pairs of (delay before the event in ms, value); flushes
/// take a duration from the input too. Invariants: every event sent ends up in some flush (the
/// union is complete) and at most one flush is ever in flight.
pub fn debounce(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let config = DebounceConfig {
        after: Duration::from_millis(u64::from(mode % 7) * 30),
        max: Duration::from_millis(u64::from(mode % 5 + 1) * 200),
        enable: mode % 11 != 0,
    };
    let flush_time = Duration::from_millis(u64::from(mode / 8));
    let events: Vec<(u8, u8)> = rest
        .chunks_exact(2)
        .map(|pair| (pair[0], pair[1]))
        .collect();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => panic!("no runtime: {err}"),
    };
    runtime.block_on(async move {
        let (tx, rx) = tokio::sync::mpsc::channel(events.len().max(1));
        let flushed = std::sync::Arc::new(std::sync::Mutex::new((BTreeSet::new(), 0usize, 0usize)));
        let record = flushed.clone();
        let task = tokio::spawn(debounce::run(config, rx, move |batch: Batch<Values>| {
            let record = record.clone();
            async move {
                {
                    let mut state = record.lock().unwrap_or_else(|e| e.into_inner());
                    state.1 += 1;
                    state.2 = state.2.max(state.1);
                    state.0.extend(batch.value.0);
                }
                tokio::time::sleep(flush_time).await;
                record.lock().unwrap_or_else(|e| e.into_inner()).1 -= 1;
            }
        }));
        let mut sent = BTreeSet::new();
        for (delay, value) in events {
            tokio::time::sleep(Duration::from_millis(u64::from(delay))).await;
            if tx.send(Values(BTreeSet::from([value]))).await.is_ok() {
                sent.insert(value);
            }
        }
        drop(tx);
        assert!(task.await.is_ok(), "the debouncer panicked");
        let state = flushed.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(
            state.0, sent,
            "an accepted event is missing from the flushed union"
        );
        assert!(state.2 <= 1, "{} flushes ran at once", state.2);
    });
}

/// The admission webhook on arbitrary bytes: every body gets an `AdmissionReview` answer that
/// allows the pod (the webhook fails open), and a patch, when there is one, applies to the
/// review's pod and gives a pod that a second review leaves unchanged (injection is
/// idempotent).
pub fn webhook_review(data: &[u8]) {
    struct Everything;
    impl crate::webhook::Lookup for Everything {
        fn namespace_labels(&self, _: &str) -> std::collections::BTreeMap<String, String> {
            std::collections::BTreeMap::from([(
                "registry-nacos-inject".to_owned(),
                "true".to_owned(),
            )])
        }
        fn service_with_label(&self, namespace: &str, _: &str) -> Option<String> {
            Some(format!("svc-{namespace}"))
        }
    }
    let (answer, _) = crate::webhook::review(data, &Everything, "cp.ns.svc:30062");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["allowed"], true);
    let Some(patch) = answer["response"]["patch"].as_str() else {
        return;
    };
    use base64::Engine;
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(patch) else {
        panic!("the patch is not base64: {patch}");
    };
    let Ok(patch) = serde_json::from_slice::<json_patch::Patch>(&bytes) else {
        panic!("the patch is not a JSON Patch");
    };
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(data) else {
        panic!("a patch came from a body that is not JSON");
    };
    let mut pod = review["request"]["object"].clone();
    if let Err(err) = json_patch::patch(&mut pod, &patch) {
        panic!("the patch does not apply to the review's pod: {err}");
    }
    let mut again = review.clone();
    again["request"]["object"] = pod;
    let Ok(body) = serde_json::to_vec(&again) else {
        panic!("a JSON value must encode");
    };
    let (second, _) = crate::webhook::review(&body, &Everything, "cp.ns.svc:30062");
    assert!(
        second["response"].get("patch").is_none(),
        "a second review of the injected pod changes nothing: {second}"
    );
}

/// An AuthorizationPolicy (JSON) translated to gRPC's RBAC filters, on an mTLS and a plaintext
/// port: no panic, DENY before ALLOW, never an optional filter, every regex sent compiles, and
/// the same policy encodes to the same bytes (servers would drain otherwise).
pub fn authorization_policy(data: &[u8]) {
    use crate::xds::security::{Named, rbac};
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(spec) = RuleSpec::parse(Kind::AuthorizationPolicy, &json) else {
        return;
    };
    let RuleSpec::AuthorizationPolicy(spec) = spec else {
        return;
    };
    let policy = Named {
        namespace: "shop".to_owned(),
        name: "fuzzed".to_owned(),
        spec,
    };
    for mtls in [true, false] {
        let first = rbac::translate(std::iter::once(&policy), mtls);
        let again = rbac::translate(std::iter::once(&policy), mtls);
        assert_eq!(first.filters, again.filters, "the same bytes each time");
        let names: Vec<&str> = first.filters.iter().map(|f| f.name.as_str()).collect();
        assert!(
            names == [rbac::DENY_FILTER] || names == [rbac::ALLOW_FILTER] || names.is_empty(),
            "{names:?}"
        );
        assert!(first.filters.iter().all(|f| !f.is_optional));
    }
}
