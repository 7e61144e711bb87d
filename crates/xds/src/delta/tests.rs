use envoy_types::pb::google::rpc::Status;

use super::*;
use crate::{ENDPOINT, ROUTE};

fn request(
    type_url: &str,
    subscribe: &[&str],
    unsubscribe: &[&str],
    nonce: &str,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
        resource_names_unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn any(value: &[u8]) -> std::sync::Arc<envoy_types::pb::google::protobuf::Any> {
    std::sync::Arc::new(envoy_types::pb::google::protobuf::Any {
        type_url: ROUTE.into(),
        value: value.to_vec(),
    })
}

fn names(response: &DeltaDiscoveryResponse) -> Vec<&str> {
    response.resources.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn only_changed_resources_and_removals_are_sent() {
    let mut stream = DeltaStream::default();
    assert_eq!(
        stream.on_request(&request(ROUTE, &["a", "b"], &[], "")),
        Ok(Verdict::Answer(ROUTE))
    );
    let first = stream
        .respond(
            ROUTE,
            "1",
            vec![("a".into(), any(b"a")), ("b".into(), any(b"b"))],
            true,
        )
        .expect("forced");
    assert_eq!(names(&first), ["a", "b"]);
    assert_eq!(
        stream.on_request(&request(ROUTE, &[], &[], &first.nonce)),
        Ok(Verdict::Settled)
    );
    // b changes: only b is sent.
    let second = stream
        .respond(
            ROUTE,
            "2",
            vec![("a".into(), any(b"a")), ("b".into(), any(b"b2"))],
            false,
        )
        .expect("b changed");
    assert_eq!(names(&second), ["b"]);
    assert!(second.removed_resources.is_empty());
    // Nothing changes: nothing is sent.
    assert!(
        stream
            .respond(
                ROUTE,
                "3",
                vec![("a".into(), any(b"a")), ("b".into(), any(b"b2"))],
                false
            )
            .is_none()
    );
    // a is gone: its name is sent as removed.
    let third = stream
        .respond(ROUTE, "4", vec![("b".into(), any(b"b2"))], false)
        .expect("a removed");
    assert!(third.resources.is_empty());
    assert_eq!(third.removed_resources, ["a"]);
}

#[test]
fn a_reconnect_gets_only_what_differs_from_what_it_holds() {
    let mut stream = DeltaStream::default();
    let mut reconnect = request(ROUTE, &["a", "b"], &[], "");
    let held = format!("{:016x}", crate::protocol::digest(&any(b"a")));
    reconnect.initial_resource_versions = [("a".to_string(), held)].into();
    stream.on_request(&reconnect).ok();
    let response = stream
        .respond(
            ROUTE,
            "9",
            vec![("a".into(), any(b"a")), ("b".into(), any(b"b"))],
            true,
        )
        .expect("forced");
    assert_eq!(names(&response), ["b"], "a is held at its version");
}

#[test]
fn subscriptions_count_on_a_stale_nonce_and_nacks_are_recorded() {
    let mut stream = DeltaStream::default();
    stream.on_request(&request(ENDPOINT, &["c1"], &[], "")).ok();
    let sent = stream
        .respond(ENDPOINT, "1", vec![("c1".into(), any(b"1"))], true)
        .expect("sent");
    let later = stream
        .respond(ENDPOINT, "2", vec![("c1".into(), any(b"2"))], false)
        .expect("sent");
    // An answer to the first response, with a new name: stale, but the name counts.
    assert_eq!(
        stream.on_request(&request(ENDPOINT, &["c2"], &[], &sent.nonce)),
        Ok(Verdict::Answer(ENDPOINT))
    );
    assert_eq!(
        stream
            .subscribed_names(ENDPOINT)
            .map(|(names, _)| names.len()),
        Some(2)
    );
    let mut nack = request(ENDPOINT, &[], &[], &later.nonce);
    nack.error_detail = Some(Status {
        code: 3,
        message: "duplicate endpoint".into(),
        ..Default::default()
    });
    assert_eq!(stream.on_request(&nack), Ok(Verdict::Settled));
    let status = stream.status("default", None);
    let endpoints = status.types.get(ENDPOINT).cloned().unwrap_or_default();
    assert_eq!(
        endpoints.nack.map(|n| (n.version, n.message)),
        Some(("2".to_string(), "duplicate endpoint".to_string()))
    );
    // Unsubscribing forgets the name.
    stream.on_request(&request(ENDPOINT, &[], &["c1"], "")).ok();
    assert_eq!(
        stream
            .subscribed_names(ENDPOINT)
            .map(|(names, _)| names.len()),
        Some(1)
    );
}

#[test]
fn wildcard_and_oversized_subscriptions() {
    let mut stream = DeltaStream::default();
    stream.on_request(&request(LISTENER, &[], &[], "")).ok();
    assert!(
        stream
            .subscribed_names(LISTENER)
            .is_some_and(|(_, wildcard)| wildcard)
    );
    stream.on_request(&request(CLUSTER, &["*"], &[], "")).ok();
    assert!(
        stream
            .subscribed_names(CLUSTER)
            .is_some_and(|(_, wildcard)| wildcard)
    );
    let names: Vec<String> = (0..=MAX_NAMES).map(|i| format!("n{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(matches!(
        stream.on_request(&request(ROUTE, &names, &[], "")),
        Err(Refused::TooManyNames(_, _))
    ));
}

#[test]
fn a_subscribed_name_that_does_not_exist_is_said_removed_once_until_it_appears() {
    let mut stream = DeltaStream::default();
    stream
        .on_request(&request(ROUTE, &["a", "zz"], &[], ""))
        .ok();
    let first = stream
        .respond(ROUTE, "1", vec![("a".into(), any(b"a"))], true)
        .expect("forced");
    assert_eq!(names(&first), ["a"]);
    assert_eq!(
        first.removed_resources,
        ["zz"],
        "Envoy waits for it otherwise"
    );
    assert!(
        stream
            .respond(ROUTE, "2", vec![("a".into(), any(b"a"))], false)
            .is_none(),
        "said once"
    );
    let appears = stream
        .respond(
            ROUTE,
            "3",
            vec![("a".into(), any(b"a")), ("zz".into(), any(b"z"))],
            false,
        )
        .expect("zz appeared");
    assert_eq!(names(&appears), ["zz"]);
    assert!(appears.removed_resources.is_empty());
    let gone = stream
        .respond(ROUTE, "4", vec![("a".into(), any(b"a"))], false)
        .expect("zz went");
    assert_eq!(gone.removed_resources, ["zz"]);
    assert!(
        stream
            .respond(ROUTE, "5", vec![("a".into(), any(b"a"))], false)
            .is_none(),
        "a removal is said once too"
    );
    // Unsubscribed and subscribed again: said again.
    stream.on_request(&request(ROUTE, &[], &["zz"], "")).ok();
    stream.on_request(&request(ROUTE, &["zz"], &[], "")).ok();
    let again = stream
        .respond(ROUTE, "6", vec![("a".into(), any(b"a"))], false)
        .expect("said again");
    assert_eq!(again.removed_resources, ["zz"]);
}

/// `respond_following` answers exactly what `respond` answers from the whole selection (the
/// untouched names as held, the touched ones looked up), or leaves it to `respond`: over random
/// versions, ACKs, NACKs, resources changed, unchanged, re-encoded alike, gone and back.
#[test]
fn answering_from_the_touched_names_is_answering_from_the_whole_selection() {
    use std::sync::Arc;

    use crate::changing::{NAMES, World};
    let mut answered_fast = 0;
    for run in 0..200u64 {
        let mut world = World::new(0x9e37_79b9_7f4a_7c15 ^ run);
        let (mut fast, mut whole) = (DeltaStream::default(), DeltaStream::default());
        for stream in [&mut fast, &mut whole] {
            stream.on_request(&request(ENDPOINT, &NAMES, &[], "")).ok();
            stream.respond(ENDPOINT, "0", world.all(), true);
        }
        for version in 1..30u64 {
            // The client answers the last response, rejects it, or not yet.
            let last = whole.types.get(ENDPOINT).and_then(|s| s.nonce);
            if let Some(last) = last {
                let mut answer = request(ENDPOINT, &[], &[], &last.to_string());
                match world.next(3) {
                    0 => {}
                    1 => {
                        answer.error_detail = Some(Status {
                            code: 3,
                            message: "no".into(),
                            ..Default::default()
                        })
                    }
                    _ => answer.response_nonce.clear(),
                }
                if !answer.response_nonce.is_empty() {
                    assert_eq!(fast.on_request(&answer), whole.on_request(&answer));
                }
            }
            let (touched, _) = world.change(&format!("{version}/{run}"));
            let v = version.to_string();
            let selected = world.selected(&touched, |name| whole.held_resource(ENDPOINT, name));
            let expected = whole.respond(ENDPOINT, &v, selected.clone(), false);
            let got = match fast.respond_following(
                ENDPOINT,
                &v,
                |name| touched.contains(&name),
                |name| world.resources.get(name).cloned(),
            ) {
                Some(answer) => {
                    answered_fast += 1;
                    answer
                }
                None => fast.respond(ENDPOINT, &v, selected, false),
            };
            assert_eq!(got, expected, "run {run}, version {version}");
            let key = |stream: &DeltaStream| {
                stream.types.get(ENDPOINT).map(|s| {
                    let pointers: Vec<_> = s
                        .known
                        .values()
                        .map(|held| held.resource.as_ref().map(Arc::as_ptr))
                        .collect();
                    (
                        s.known.clone(),
                        pointers,
                        s.absent.clone(),
                        s.nonce,
                        s.sent.clone(),
                        s.acked.clone(),
                        stream.nonces,
                    )
                })
            };
            assert_eq!(key(&fast), key(&whole), "run {run}, version {version}");
        }
    }
    // Most versions were answered from the touched names: the test compares something.
    assert!(answered_fast > 200 * 29 / 2, "{answered_fast}");
}

/// A reconnect's claims and a wildcard subscription are answered from the whole selection.
#[test]
fn the_quick_answer_leaves_claims_and_wildcards_to_the_whole_selection() {
    let mut claims = request(ENDPOINT, &["a"], &[], "");
    claims.initial_resource_versions = [("a".to_owned(), "0123".to_owned())].into();
    let mut stream = DeltaStream::default();
    stream.on_request(&claims).ok();
    assert!(
        stream
            .respond_following(ENDPOINT, "1", |_| false, |_| None)
            .is_none()
    );
    let mut wildcard = DeltaStream::default();
    wildcard
        .on_request(&request(ENDPOINT, &["*"], &[], ""))
        .ok();
    wildcard.respond(ENDPOINT, "1", vec![("a".into(), any(b"a"))], true);
    assert!(
        wildcard
            .respond_following(ENDPOINT, "2", |_| true, |_| Some(any(b"a2")))
            .is_none()
    );
}
