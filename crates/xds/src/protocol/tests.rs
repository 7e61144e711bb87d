use envoy_types::pb::google::rpc::Status;

use super::*;
use crate::{ENDPOINT, ROUTE};

fn request(type_url: &str, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn nack(type_url: &str, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        error_detail: Some(Status {
            code: 3,
            message: "route has no domains".into(),
            ..Default::default()
        }),
        ..request(type_url, names, version, nonce)
    }
}

fn any(value: &[u8]) -> std::sync::Arc<envoy_types::pb::google::protobuf::Any> {
    std::sync::Arc::new(envoy_types::pb::google::protobuf::Any {
        type_url: ROUTE.into(),
        value: value.to_vec(),
    })
}

#[test]
fn first_request_is_answered_and_an_ack_with_the_same_names_is_not() {
    let mut stream = Stream::default();
    assert_eq!(
        stream.on_request(&request(ROUTE, &["a"], "", "")),
        Ok(Verdict::Answer(ROUTE))
    );
    let sent = stream
        .respond(ROUTE, "1", vec![("a".into(), any(b"a1"))], true)
        .expect("forced");
    assert_eq!(sent.version_info, "1");
    assert_eq!(
        stream.on_request(&request(ROUTE, &["a"], "1", &sent.nonce)),
        Ok(Verdict::Settled)
    );
    let state = stream.state(ROUTE).cloned().unwrap_or_default();
    assert_eq!(state.acked.as_deref(), Some("1"));
    // A new version with the same bytes says nothing new; a changed one does.
    assert!(
        stream
            .respond(ROUTE, "2", vec![("a".into(), any(b"a1"))], false)
            .is_none()
    );
    let next = stream.respond(ROUTE, "3", vec![("a".into(), any(b"a2"))], false);
    assert_eq!(next.map(|r| r.version_info).as_deref(), Some("3"));
}

#[test]
fn stale_nonces_are_ignored_and_a_new_subscription_is_answered() {
    let mut stream = Stream::default();
    stream.on_request(&request(ROUTE, &["a"], "", "")).ok();
    let first = stream
        .respond(ROUTE, "1", vec![("a".into(), any(b"a"))], true)
        .expect("sent");
    let second = stream
        .respond(ROUTE, "2", vec![("a".into(), any(b"b"))], false)
        .expect("sent");
    // The ACK of the first response arrives after the second was sent: stale, even with new
    // names in it.
    assert_eq!(
        stream.on_request(&request(ROUTE, &["a", "b"], "1", &first.nonce)),
        Ok(Verdict::Stale)
    );
    assert_eq!(stream.state(ROUTE).map(|s| s.names.len()), Some(1));
    assert_eq!(
        stream.on_request(&request(ROUTE, &["a", "b"], "2", &second.nonce)),
        Ok(Verdict::Answer(ROUTE))
    );
    assert_eq!(stream.state(ROUTE).map(|s| s.names.len()), Some(2));
}

#[test]
fn a_nack_keeps_the_last_good_version_and_is_recorded() {
    let mut stream = Stream::default();
    stream.on_request(&request(ROUTE, &["a"], "", "")).ok();
    let good = stream
        .respond(ROUTE, "1", vec![("a".into(), any(b"good"))], true)
        .expect("sent");
    stream
        .on_request(&request(ROUTE, &["a"], "1", &good.nonce))
        .ok();
    let bad = stream
        .respond(ROUTE, "2", vec![("a".into(), any(b"bad"))], false)
        .expect("sent");
    assert_eq!(
        stream.on_request(&nack(ROUTE, &["a"], "1", &bad.nonce)),
        Ok(Verdict::Settled),
        "a NACK is not answered with the same thing again"
    );
    let state = stream.state(ROUTE).cloned().unwrap_or_default();
    assert_eq!(state.acked.as_deref(), Some("1"));
    assert_eq!(
        state.nack,
        Some(Nack {
            version: "2".into(),
            message: "route has no domains".into(),
            nonce: bad.nonce.parse().expect("a number"),
        })
    );
    // The status keeps what the client holds: the acknowledged response's resources.
    let status = stream.status("shop", None);
    let route = &status.types[ROUTE];
    assert_eq!(
        route.accepted["a"].resource.as_deref(),
        Some(&*any(b"good"))
    );
    assert_eq!(route.held["a"].resource.as_deref(), Some(&*any(b"bad")));
    assert!(route.acked_nonce < route.held["a"].nonce);
    // The next good version goes out, and its ACK clears the NACK.
    let fixed = stream
        .respond(ROUTE, "3", vec![("a".into(), any(b"fixed"))], false)
        .expect("a changed version is sent after a NACK");
    stream
        .on_request(&request(ROUTE, &["a"], "3", &fixed.nonce))
        .ok();
    let state = stream.state(ROUTE).cloned().unwrap_or_default();
    assert_eq!((state.acked.as_deref(), state.nack), (Some("3"), None));
}

#[test]
fn wildcard_is_for_listeners_and_clusters_only() {
    let mut stream = Stream::default();
    stream.on_request(&request(LISTENER, &[], "", "")).ok();
    assert!(stream.state(LISTENER).is_some_and(|s| s.wildcard));
    stream
        .on_request(&request(CLUSTER, &["*", "c"], "", ""))
        .ok();
    let clusters = stream.state(CLUSTER).cloned().unwrap_or_default();
    assert!(clusters.wildcard);
    assert_eq!(clusters.names.len(), 1);
    stream.on_request(&request(ENDPOINT, &[], "", "")).ok();
    assert!(stream.state(ENDPOINT).is_some_and(|s| !s.wildcard));
    assert_eq!(
        stream.subscribed().collect::<Vec<_>>(),
        vec![CLUSTER, ENDPOINT, LISTENER],
        "push order"
    );
}

#[test]
fn unknown_types_and_oversized_subscriptions_are_refused() {
    let mut stream = Stream::default();
    assert!(matches!(
        stream.on_request(&request("type.googleapis.com/x.Secret", &[], "", "")),
        Err(Refused::UnknownType(_))
    ));
    let names: Vec<String> = (0..=MAX_NAMES).map(|i| format!("n{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let refused = stream.on_request(&request(ROUTE, &names, "", ""));
    assert_eq!(refused, Err(Refused::TooManyNames(MAX_NAMES + 1, ROUTE)));
    assert!(
        refused
            .err()
            .is_some_and(|e| e.to_string().contains("10000"))
    );
}

#[test]
fn a_reconnect_is_answered_in_full() {
    let mut stream = Stream::default();
    // A new stream from a client that had version 7 before: no nonce, answered.
    assert_eq!(
        stream.on_request(&request(ROUTE, &["a"], "7", "")),
        Ok(Verdict::Answer(ROUTE))
    );
}

/// `respond_following` answers exactly what `respond` answers from the whole selection (the
/// untouched names as held, the touched ones looked up), or leaves it to `respond`: over random
/// versions, ACKs, NACKs, resources changed, unchanged, re-encoded alike, added and removed.
#[test]
fn answering_from_the_touched_names_is_answering_from_the_whole_selection() {
    use crate::changing::{NAMES, World};
    let mut answered_fast = 0;
    for run in 0..200u64 {
        let mut world = World::new(0x2545_f491_4f6c_dd1d ^ run);
        let (mut fast, mut whole) = (Stream::default(), Stream::default());
        for stream in [&mut fast, &mut whole] {
            stream.on_request(&request(ENDPOINT, &NAMES, "", "")).ok();
            stream.respond(ENDPOINT, "0", world.all(), true);
        }
        for version in 1..30u64 {
            // The client answers what it was last sent, or not yet.
            let last = whole
                .state(ENDPOINT)
                .and_then(|s| s.sent.as_deref())
                .cloned();
            if let Some(last) = last {
                let answer = match world.next(3) {
                    0 => Some(request(ENDPOINT, &NAMES, &last.version, &last.nonce)),
                    1 => Some(nack(ENDPOINT, &NAMES, &last.version, &last.nonce)),
                    _ => None,
                };
                if let Some(answer) = answer {
                    assert_eq!(fast.on_request(&answer), whole.on_request(&answer));
                }
            }
            let (touched, same_pointers) = world.change(&format!("{version}/{run}"));
            let shared = |stream: &Stream| {
                stream.state(ENDPOINT).is_some_and(|s| {
                    s.sent
                        .as_ref()
                        .is_some_and(|sent| sent.held.ptr_eq(&s.accepted))
                })
            };
            let shared_before = shared(&fast);
            let v = version.to_string();
            let selected = world.selected(&touched, |name| whole.held_resource(ENDPOINT, name));
            let expected = whole.respond(ENDPOINT, &v, selected.clone(), false);
            let fast_answer = fast.respond_following(
                ENDPOINT,
                &v,
                |name| touched.contains(&name),
                |name| world.resources.get(name).cloned(),
            );
            let answered = fast_answer.is_some();
            let got = match fast_answer {
                Some(answer) => {
                    answered_fast += 1;
                    answer
                }
                None => fast.respond(ENDPOINT, &v, selected, false),
            };
            assert_eq!(got, expected, "run {run}, version {version}");
            // Nothing sent and nothing re-pointed: what was sent is still what was accepted, so
            // the next version is answered the quick way too.
            if answered && got.is_none() && same_pointers && shared_before {
                assert!(shared(&fast), "run {run}, version {version}");
            }
            // Which encoding each entry points at, too: both streams are given the same ones.
            let pointers = |held: &HeldResources| -> Vec<Option<*const Any>> {
                held.values()
                    .map(|held| held.resource.as_ref().map(Arc::as_ptr))
                    .collect()
            };
            let key = |s: Option<&TypeState>| {
                s.map(|s| {
                    let sent = s.sent.as_deref();
                    (
                        sent.map(|s| (s.version.clone(), s.nonce.clone(), s.held.clone())),
                        sent.map(|s| pointers(&s.held)),
                        sent.map(|s| s.absent.clone()),
                        s.accepted.clone(),
                        s.acked.clone(),
                    )
                })
            };
            assert_eq!(
                key(fast.state(ENDPOINT)),
                key(whole.state(ENDPOINT)),
                "run {run}, version {version}"
            );
        }
    }
    // Most versions were answered from the touched names: the test compares something.
    assert!(answered_fast > 200 * 29 / 6, "{answered_fast}");
}

/// Names changed by an ACK (as many as before) are not what was sent was selected from: the
/// quick answer leaves it to the whole selection until a response is selected from them.
#[test]
fn the_quick_answer_waits_for_an_answer_to_changed_names() {
    let mut stream = Stream::default();
    stream
        .on_request(&request(ENDPOINT, &["a", "x"], "", ""))
        .ok();
    let a = any(b"a");
    let first = stream
        .respond(ENDPOINT, "1", vec![("a".into(), a.clone())], true)
        .expect("forced");
    assert_eq!(
        stream.on_request(&request(ENDPOINT, &["a", "c"], "1", &first.nonce)),
        Ok(Verdict::Answer(ENDPOINT))
    );
    let c = any(b"c");
    let touches_c = |name: &str| name == "c";
    let lookup = |name: &str| match name {
        "a" => Some(a.clone()),
        "c" => Some(c.clone()),
        _ => None,
    };
    assert_eq!(
        stream.respond_following(ENDPOINT, "2", touches_c, lookup),
        None
    );
    // Answered in full, as the server answers a changed subscription, and acknowledged.
    let all = vec![("a".into(), a.clone()), ("c".into(), c.clone())];
    let second = stream.respond(ENDPOINT, "2", all, true).expect("forced");
    assert_eq!(
        stream.on_request(&request(ENDPOINT, &["a", "c"], "2", &second.nonce)),
        Ok(Verdict::Settled)
    );
    let c2 = any(b"c2");
    let lookup = |name: &str| (name == "c").then(|| c2.clone());
    let third = stream.respond_following(ENDPOINT, "3", touches_c, lookup);
    let resources = third.flatten().map(|r| r.resources);
    assert_eq!(resources, Some(vec![c2.clone()]));
}
