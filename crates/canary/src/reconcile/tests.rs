use super::*;

fn canary(analysis: serde_json::Value) -> Canary {
    serde_json::from_value(json!({
        "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
        "metadata": {"name": "podinfo", "namespace": "test"},
        "spec": {"targetRef": {"name": "podinfo"}, "analysis": analysis},
    }))
    .unwrap()
}

#[test]
fn weights_step_up_to_the_maximum() {
    let c = canary(json!({"maxWeight": 50, "stepWeight": 10}));
    let mut weights = vec![0];
    while let Some(next) = next_weight(&c, *weights.last().unwrap()) {
        weights.push(next);
    }
    assert_eq!(weights, [0, 10, 20, 30, 40, 50]);
    let c = canary(json!({"maxWeight": 50, "stepWeight": 20}));
    assert_eq!(next_weight(&c, 40), Some(50));
    assert_eq!(next_weight(&c, 50), None);
}

#[test]
fn explicit_steps_are_followed() {
    let c = canary(json!({"maxWeight": 50, "stepWeights": [1, 5, 10, 50]}));
    let mut weights = vec![0];
    while let Some(next) = next_weight(&c, *weights.last().unwrap()) {
        weights.push(next);
    }
    assert_eq!(weights, [0, 1, 5, 10, 50]);
}

#[test]
fn the_spec_is_checked_with_clear_messages() {
    let c = canary(json!({"stepWeight": 10, "interval": "soon"}));
    assert!(
        plan(&c)
            .unwrap_err()
            .contains("spec.analysis.interval \"soon\"")
    );
    let c = canary(json!({}));
    assert!(plan(&c).unwrap_err().contains("stepWeight or stepWeights"));
    let c = canary(json!({"stepWeight": 10, "metrics": [{"name": "latency"}]}));
    assert!(plan(&c).unwrap_err().contains("give it a query"));
    for analysis in [
        json!({"maxWeight": 0, "stepWeight": 10}),
        json!({"stepWeights": [0, 10]}),
    ] {
        let err = plan(&canary(analysis.clone())).unwrap_err();
        assert!(err.contains("must be at least 1"), "{analysis}: {err}");
    }
    let c = canary(json!({"stepWeight": 10, "interval": "1m30s"}));
    assert_eq!(plan(&c).unwrap().interval, Duration::from_secs(90));
    assert_eq!(plan(&c).unwrap().application, "podinfo");
}

#[test]
fn session_affinity_names_a_header_and_needs_weights() {
    let affinity =
        |value: serde_json::Value| canary(json!({"stepWeight": 10, "sessionAffinity": value}));
    let c = affinity(json!({"headerName": "x-user"}));
    assert_eq!(plan(&c).unwrap().affinity.as_deref(), Some("x-user"));
    for (value, said) in [
        (
            json!({"cookieName": "flagger-cookie"}),
            "sessionAffinity.cookieName",
        ),
        (
            json!({"headerName": "x-user", "maxAge": 60}),
            "sessionAffinity.maxAge",
        ),
        (json!({}), "sessionAffinity.headerName is required"),
        (json!({"headerName": "content-type"}), "\"content-type\""),
        (json!({"headerName": "grpc-x"}), "\"grpc-x\""),
    ] {
        let err = plan(&affinity(value.clone())).unwrap_err();
        assert!(err.contains(said), "{value}: {err}");
    }
    let c = canary(json!({"iterations": 2, "sessionAffinity": {"headerName": "x-user"}}));
    assert!(plan(&c).unwrap_err().contains("only the Canary strategy"));
}

#[test]
fn outside_messages_are_clipped_on_a_character_boundary() {
    assert_eq!(clip_to("short", 10), "short");
    let long = "é".repeat(600);
    let clipped = clip(&long);
    assert!(
        clipped.len() <= MESSAGE_BYTES + "…".len(),
        "{}",
        clipped.len()
    );
    assert!(clipped.ends_with('…'));
    assert_eq!(clip_to("abcdefghij", 6), "abc…");
}

#[test]
fn selectors_the_primary_cannot_tell_apart_are_refused() {
    let deployment = |selector: serde_json::Value| -> Deployment {
        serde_json::from_value(json!({"metadata": {"name": "provider"},
            "spec": {"selector": selector, "template": {}}}))
        .unwrap()
    };
    assert_eq!(
        selector_problem(
            &deployment(json!({"matchLabels": {"app": "provider"}})),
            "provider"
        ),
        None
    );
    assert!(
        selector_problem(
            &deployment(json!({"matchLabels": {"app": "dubbo"}})),
            "provider"
        )
        .unwrap()
        .contains("no selector label has the value \"provider\"")
    );
    assert!(
        selector_problem(
            &deployment(json!({"matchLabels": {"app": "provider"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]})),
            "provider"
        )
        .unwrap()
        .contains("matchExpressions")
    );
}

#[test]
fn phases_round_trip() {
    for phase in [
        Phase::Initializing,
        Phase::Initialized,
        Phase::Waiting,
        Phase::Progressing,
        Phase::WaitingPromotion,
        Phase::Promoting,
        Phase::Finalising,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Terminating,
    ] {
        assert_eq!(Phase::parse(phase.as_str()), phase);
    }
    assert_eq!(Phase::parse(""), Phase::Initializing);
}
