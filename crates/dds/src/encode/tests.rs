use super::*;
use crate::index::{Change, Index, test_audience_in, test_value};

fn upsert(key: &str, value: &[u8]) -> Change {
    Change::Upsert(key.to_owned(), test_value(value))
}

fn any(key: &str, value: &[u8]) -> Any {
    to_any(key, &test_value(value))
}

#[test]
fn one_changed_object_costs_one_encode_and_the_state_is_exact() {
    let index = Index::new(1);
    let encoder = Encoder::default();
    let kind = Kind::ServiceNameMapping;
    let batch: Vec<Change> = (0..100)
        .map(|i| upsert(&format!("k{i:03}"), format!("v{i}").as_bytes()))
        .collect();
    assert!(index.apply(kind, batch, 0));
    let first = index.current(kind);
    encoder.state(&first);
    encoder.state(&first);
    assert_eq!(encoder.stats().encodes_of(kind), 100);
    assert_eq!(encoder.stats().assemblies_of(kind), 1, "once per revision");

    // A batch touching one object (twice) and repeating 99 unchanged ones.
    let mut batch: Vec<Change> = (0..100)
        .map(|i| upsert(&format!("k{i:03}"), format!("v{i}").as_bytes()))
        .collect();
    batch.push(upsert("k050", b"changed"));
    assert!(index.apply(kind, batch, 0));
    let current = index.current(kind);
    let state = encoder.state(&current);
    assert_eq!(
        encoder.stats().encodes_of(kind),
        101,
        "only the changed object is encoded"
    );
    assert_eq!(encoder.stats().assemblies_of(kind), 2);

    // The assembled bytes equal a from-scratch encoding of the same objects.
    let expected: Vec<Any> = current
        .objects
        .iter()
        .map(|(key, o)| to_any(key, &o.value))
        .collect();
    assert_eq!(state.data, EncodedData::encode(&expected));
    assert!(
        state
            .data
            .decode()
            .unwrap()
            .contains(&any("k050", b"changed"))
    );
}

#[test]
fn clients_that_see_the_same_objects_share_one_view() {
    let index = Index::new(1);
    let encoder = Encoder::default();
    let kind = Kind::AuthenticationPolicy;
    let in_namespace = test_audience_in;
    index.apply(
        kind,
        [
            Change::Upsert("everyone/root".into(), test_value(b"all")),
            Change::Scoped("a/ns-a".into(), test_value(b"a"), in_namespace("ns-a")),
            Change::Scoped("b/ns-b".into(), test_value(b"b"), in_namespace("ns-b")),
        ],
        0,
    );
    let snapshot = index.current(kind);
    assert!(snapshot.is_scoped());
    let endpoint = |ns: &str, i: usize| Endpoint {
        namespace: ns.to_owned(),
        id: format!("{ns}/client-{i}"),
        ..Endpoint::default()
    };
    for i in 0..100 {
        let ns = if i % 2 == 0 { "ns-a" } else { "ns-b" };
        let view = encoder.view_for(&snapshot, &endpoint(ns, i));
        let own = ns.trim_start_matches("ns-");
        let expected: Vec<Any> = vec![
            any(&format!("{own}/{ns}"), own.as_bytes()),
            any("everyone/root", b"all"),
        ];
        assert_eq!(view.decode().unwrap(), expected, "{ns}");
    }
    assert_eq!(
        encoder.state(&snapshot).views_assembled(),
        2,
        "one assembly per distinct view"
    );
    assert_eq!(encoder.stats().view_assemblies_of(kind), 2);
    // A client of neither namespace sees only the unscoped object.
    let other = encoder.view_for(&snapshot, &endpoint("ns-c", 0));
    assert_eq!(other.decode().unwrap(), vec![any("everyone/root", b"all")]);
    // A selector-only edit is a change, although the sent bytes are equal.
    assert!(index.apply(
        kind,
        [Change::Scoped(
            "a/ns-a".into(),
            test_value(b"a"),
            in_namespace("ns-c")
        )],
        0
    ));
}

#[test]
fn digests_are_of_the_encoded_state() {
    let index = Index::new(1);
    let encoder = Encoder::default();
    index.apply(Kind::TagRoute, [upsert("x/ns", b"x")], 0);
    let snapshot = index.current(Kind::TagRoute);
    let expected = crate::digest::state_digest(
        [("x/ns", EncodedData::record(&any("x/ns", b"x")).as_ref())].into_iter(),
    );
    assert_eq!(encoder.digest(&snapshot), expected);
    assert_eq!(encoder.object_digests(&snapshot).len(), 1);
}

#[test]
fn type_urls_name_each_kinds_to_client_message() {
    for kind in Kind::DISCOVERY {
        assert_eq!(
            crate::pb::type_url(kind),
            format!(
                "type.googleapis.com/dubbo.apache.org.v1alpha1.{}ToClient",
                kind.name()
            )
        );
    }
    assert_eq!(
        crate::pb::type_url(Kind::ServiceNameMapping),
        "type.googleapis.com/dubbo.apache.org.v1alpha1.ServiceNameMappingToClient"
    );
}
