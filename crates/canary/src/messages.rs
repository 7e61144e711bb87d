//! What each provider type is sent about an event, in the shapes Flagger's notifiers post
//! (slack, msteams, discord, rocket, gchat), and the generic `webhook`'s body.

use serde_json::{Value, json};

use crate::alerts::Severity;
use crate::crd::{Canary, Strategy};

/// A name and value shown under the message (Flagger's `notifier.Field`).
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: String,
    pub value: String,
}

/// Flagger's `alertMetadata`: what the run is, shown with the "new revision" and "initialized"
/// alerts.
pub fn metadata_fields(canary: &Canary) -> Vec<Field> {
    let spec = &canary.spec;
    let namespace = canary.metadata.namespace.clone().unwrap_or_default();
    let field = |name: &str, value: String| Field {
        name: name.to_owned(),
        value,
    };
    let mut fields = vec![
        field(
            "Target",
            format!(
                "{}/{}.{namespace}",
                spec.target_ref.kind, spec.target_ref.name
            ),
        ),
        field(
            "Failed checks threshold",
            spec.analysis.threshold.to_string(),
        ),
        field(
            "Progress deadline",
            format!("{}s", spec.progress_deadline_seconds),
        ),
    ];
    let analysis = &spec.analysis;
    let routing = match Strategy::of(analysis) {
        Strategy::ABTesting => Some("A/B Testing".to_owned()),
        Strategy::BlueGreen => Some("Blue/Green".to_owned()),
        Strategy::Canary => match (analysis.step_weight, analysis.step_weights.is_empty()) {
            (Some(step), _) if step > 0 => {
                Some(format!("Weight step: {step} max: {}", analysis.max_weight))
            }
            (_, false) => Some(format!(
                "Weight steps: {} max: {}",
                analysis
                    .step_weights
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                analysis.max_weight
            )),
            _ => None,
        },
    };
    if let Some(routing) = routing {
        fields.push(field("Traffic routing", routing));
    }
    fields
}

/// What one provider is sent about one event.
pub struct Message<'a> {
    /// The Canary, with the status the run is writing (the generic webhook carries it whole).
    pub canary: &'a Canary,
    pub text: &'a str,
    pub fields: &'a [Field],
    pub severity: Severity,
    /// RFC 3339, when the event happened.
    pub time: &'a str,
}

/// The resolved provider: its type and the names it posts under.
pub struct Poster<'a> {
    pub r#type: &'a str,
    pub username: &'a str,
    pub channel: &'a str,
}

/// The URL an alert is posted to: Discord takes Slack's shape under `/slack`, as Flagger sends.
pub fn post_url(r#type: &str, address: &str) -> String {
    if r#type != "discord" {
        return address.to_owned();
    }
    // Flagger joins the path; a query string stays after it.
    let (path, query) = match address.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (address, None),
    };
    if path.ends_with("/slack") {
        return address.to_owned();
    }
    let mut url = format!("{}/slack", path.trim_end_matches('/'));
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}

/// The body `poster` is sent, as Flagger's notifier of that type builds it.
pub fn payload(poster: &Poster<'_>, message: &Message<'_>) -> Value {
    let name = message.canary.metadata.name.clone().unwrap_or_default();
    let namespace = message
        .canary
        .metadata
        .namespace
        .clone()
        .unwrap_or_default();
    let workload = format!("{name}.{namespace}");
    let error = message.severity == Severity::Error;
    let slack = |color: &str| {
        let fields: Vec<Value> = message
            .fields
            .iter()
            .map(|f| json!({"title": f.name, "value": f.value, "short": false}))
            .collect();
        json!({
            "channel": poster.channel,
            "username": poster.username,
            "icon_url": "",
            "icon_emoji": ":rocket:",
            "attachments": [{
                "color": color,
                "author_name": workload,
                "text": message.text,
                "mrkdwn_in": ["text"],
                "fields": fields,
            }],
        })
    };
    match poster.r#type {
        "slack" | "discord" => slack(if error { "danger" } else { "good" }),
        "rocket" => slack(if error { "#FF0000" } else { "#0076D7" }),
        "msteams" => {
            let facts: Vec<Value> = message
                .fields
                .iter()
                .map(|f| json!({"name": f.name, "value": f.value}))
                .collect();
            json!({
                "@type": "MessageCard",
                "@context": "http://schema.org/extensions",
                "themeColor": if error { "FF0000" } else { "0076D7" },
                "summary": workload,
                "sections": [{
                    "activityTitle": message.text,
                    "activitySubtitle": workload,
                    "facts": facts,
                }],
            })
        }
        "gchat" => {
            let paragraph = |text: String| json!({"widgets": [{"textParagraph": {"text": text}}]});
            let mut sections = vec![paragraph(format!(
                "<font color=#848484><strong>{}</strong></font>",
                message.text
            ))];
            sections.extend(message.fields.iter().map(|f| {
                paragraph(format!(
                    "{}<br><font color=#848484><strong>{}</strong></font>",
                    f.name, f.value
                ))
            }));
            json!({"cards": [{
                "header": {"title": "dubbo-cp", "subtitle": workload},
                "sections": sections,
            }]})
        }
        // `webhook`: the body of Flagger's event webhooks, with the severity and fields in its
        // metadata and the Canary itself beside it.
        _ => {
            let status = message.canary.status.clone().unwrap_or_default();
            let mut metadata = serde_json::Map::new();
            for f in message.fields {
                metadata.insert(f.name.clone(), json!(f.value));
            }
            metadata.insert("eventMessage".to_owned(), json!(message.text));
            metadata.insert(
                "eventType".to_owned(),
                json!(if message.severity == Severity::Info {
                    "Normal"
                } else {
                    "Warning"
                }),
            );
            metadata.insert("severity".to_owned(), json!(message.severity.as_str()));
            metadata.insert("timestamp".to_owned(), json!(message.time));
            let mut canary = serde_json::to_value(message.canary).unwrap_or(Value::Null);
            if let Some(meta) = canary
                .get_mut("metadata")
                .and_then(serde_json::Value::as_object_mut)
            {
                meta.remove("managedFields");
            }
            json!({
                "name": name,
                "namespace": namespace,
                "phase": status.phase,
                "checksum": status.last_applied_spec,
                "metadata": metadata,
                "canary": canary,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canary() -> Canary {
        serde_json::from_value(json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
            "metadata": {"name": "podinfo", "namespace": "test",
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"targetRef": {"name": "podinfo"},
                     "analysis": {"stepWeight": 10, "maxWeight": 50, "threshold": 3}},
            "status": {"phase": "Progressing", "lastAppliedSpec": "abc123"},
        }))
        .unwrap()
    }

    fn sent(r#type: &str, severity: Severity) -> Value {
        let canary = canary();
        let fields = [Field {
            name: "Target".to_owned(),
            value: "Deployment/podinfo.test".to_owned(),
        }];
        let poster = Poster {
            r#type,
            username: "bot",
            channel: "ops",
        };
        let message = Message {
            canary: &canary,
            text: "New revision detected, progressing canary analysis.",
            fields: &fields,
            severity,
            time: "2026-01-01T00:00:00Z",
        };
        payload(&poster, &message)
    }

    #[test]
    fn slack_discord_and_rocket_get_slack_attachments_with_fields() {
        let slack = json!({
            "channel": "ops", "username": "bot", "icon_url": "", "icon_emoji": ":rocket:",
            "attachments": [{
                "color": "good", "author_name": "podinfo.test",
                "text": "New revision detected, progressing canary analysis.",
                "mrkdwn_in": ["text"],
                "fields": [{"title": "Target", "value": "Deployment/podinfo.test", "short": false}],
            }],
        });
        assert_eq!(sent("slack", Severity::Info), slack);
        assert_eq!(sent("discord", Severity::Info), slack);
        assert_eq!(
            sent("slack", Severity::Error)["attachments"][0]["color"],
            "danger"
        );
        assert_eq!(
            sent("slack", Severity::Warn)["attachments"][0]["color"],
            "good"
        );
        let mut rocket = slack.clone();
        rocket["attachments"][0]["color"] = json!("#0076D7");
        assert_eq!(sent("rocket", Severity::Warn), rocket);
        assert_eq!(
            sent("rocket", Severity::Error)["attachments"][0]["color"],
            "#FF0000"
        );
    }

    #[test]
    fn msteams_gets_a_message_card() {
        assert_eq!(
            sent("msteams", Severity::Info),
            json!({
                "@type": "MessageCard", "@context": "http://schema.org/extensions",
                "themeColor": "0076D7", "summary": "podinfo.test",
                "sections": [{
                    "activityTitle": "New revision detected, progressing canary analysis.",
                    "activitySubtitle": "podinfo.test",
                    "facts": [{"name": "Target", "value": "Deployment/podinfo.test"}],
                }],
            })
        );
        assert_eq!(sent("msteams", Severity::Error)["themeColor"], "FF0000");
    }

    #[test]
    fn gchat_gets_a_card_with_one_section_per_field() {
        assert_eq!(
            sent("gchat", Severity::Info),
            json!({"cards": [{
                "header": {"title": "dubbo-cp", "subtitle": "podinfo.test"},
                "sections": [
                    {"widgets": [{"textParagraph": {"text":
                        "<font color=#848484><strong>New revision detected, progressing canary analysis.</strong></font>"}}]},
                    {"widgets": [{"textParagraph": {"text":
                        "Target<br><font color=#848484><strong>Deployment/podinfo.test</strong></font>"}}]},
                ],
            }]})
        );
    }

    #[test]
    fn the_generic_webhook_gets_the_event_hook_body_and_the_canary() {
        let body = sent("webhook", Severity::Warn);
        assert_eq!(body["name"], "podinfo");
        assert_eq!(body["namespace"], "test");
        assert_eq!(body["phase"], "Progressing");
        assert_eq!(body["checksum"], "abc123");
        assert_eq!(
            body["metadata"],
            json!({"Target": "Deployment/podinfo.test",
                   "eventMessage": "New revision detected, progressing canary analysis.",
                   "eventType": "Warning", "severity": "warn",
                   "timestamp": "2026-01-01T00:00:00Z"})
        );
        assert_eq!(body["canary"]["spec"]["analysis"]["stepWeight"], 10);
        assert_eq!(body["canary"]["status"]["phase"], "Progressing");
        assert!(body["canary"]["metadata"].get("managedFields").is_none());
        assert_eq!(
            sent("webhook", Severity::Info)["metadata"]["eventType"],
            "Normal"
        );
    }

    #[test]
    fn discord_is_posted_under_slack() {
        assert_eq!(
            post_url("discord", "https://discord.com/api/webhooks/1/x"),
            "https://discord.com/api/webhooks/1/x/slack"
        );
        assert_eq!(
            post_url("discord", "https://discord.com/api/webhooks/1/x/slack"),
            "https://discord.com/api/webhooks/1/x/slack"
        );
        assert_eq!(
            post_url("discord", "http://127.0.0.1:8/hook/?wait=true"),
            "http://127.0.0.1:8/hook/slack?wait=true"
        );
        assert_eq!(post_url("slack", "http://h/x"), "http://h/x");
    }

    #[test]
    fn metadata_fields_describe_the_run_as_flaggers_do() {
        let fields: Vec<(String, String)> = metadata_fields(&canary())
            .into_iter()
            .map(|f| (f.name, f.value))
            .collect();
        let expected = [
            ("Target", "Deployment/podinfo.test"),
            ("Failed checks threshold", "3"),
            ("Progress deadline", "600s"),
            ("Traffic routing", "Weight step: 10 max: 50"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()));
        assert_eq!(fields, expected);
    }
}
