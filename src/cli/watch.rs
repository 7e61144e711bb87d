//! `watch` and `get`: a real discovery-stream client that subscribes, acknowledges every
//! response and prints the states it receives.

use anyhow::Context;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Output, ServerArg};
use crate::dds::ObserveResponse;
use crate::index::Kind;
use crate::pb::dds::ObserveRequest;
use crate::pb::dds::rule_service_client::RuleServiceClient;
use crate::resources::{decode_mapping, object_key};

/// One object of a received state, as printed.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectView {
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    application_names: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    type_url: Option<String>,
    /// A rule's spec as the client receives it (wire JSON names).
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
struct StateView {
    r#type: String,
    revision: i64,
    objects: Vec<ObjectView>,
}

fn parse_kind(kind: &str) -> anyhow::Result<Kind> {
    Kind::from_type_name(kind)
        .or_else(|| {
            Kind::DISCOVERY
                .into_iter()
                .find(|k| k.name().eq_ignore_ascii_case(kind))
        })
        .with_context(|| {
            let known: Vec<&str> = Kind::DISCOVERY.iter().map(|k| k.name()).collect();
            format!("unknown type {kind:?}; known: {}", known.join(", "))
        })
}

fn view(
    kind: Kind,
    response: &ObserveResponse,
    namespace: Option<&str>,
) -> anyhow::Result<StateView> {
    let mut objects = Vec::new();
    for any in response.data.decode().context("malformed response data")? {
        let object = if kind == Kind::ServiceNameMapping {
            let mapping = decode_mapping(&any).context("malformed mapping")?;
            let spec = mapping.spec.unwrap_or_default();
            ObjectView {
                key: mapping.key,
                interface_name: Some(spec.interface_name),
                application_names: Some(spec.application_names),
                type_url: None,
                spec: None,
            }
        } else {
            ObjectView {
                key: object_key(&any).context("malformed object")?,
                interface_name: None,
                application_names: None,
                spec: rule_spec(kind, &any),
                type_url: Some(any.type_url),
            }
        };
        let in_namespace = namespace.is_none_or(|ns| {
            object
                .key
                .rsplit_once('/')
                .is_some_and(|(_, key_ns)| key_ns == ns)
        });
        if in_namespace {
            objects.push(object);
        }
    }
    Ok(StateView {
        r#type: response.r#type.clone(),
        revision: response.revision,
        objects,
    })
}

/// The `spec` of a rule object, decoded as the generated message of its kind.
fn rule_spec(kind: Kind, any: &prost_types::Any) -> Option<serde_json::Value> {
    use crate::pb::rules as pb;
    use prost::Message;
    let bytes = any.value.as_slice();
    let json = match kind {
        // Not on the discovery stream (`parse_kind` refuses it).
        Kind::ServiceNameMapping | Kind::ServiceEntry | Kind::Service => return None,
        Kind::TagRoute => serde_json::to_value(pb::TagRouteToClient::decode(bytes).ok()?.spec),
        Kind::ConditionRoute => {
            serde_json::to_value(pb::ConditionRouteToClient::decode(bytes).ok()?.spec)
        }
        Kind::DynamicConfig => {
            serde_json::to_value(pb::DynamicConfigToClient::decode(bytes).ok()?.spec)
        }
        Kind::AuthenticationPolicy => {
            serde_json::to_value(pb::AuthenticationPolicyToClient::decode(bytes).ok()?.spec)
        }
        Kind::AuthorizationPolicy => {
            serde_json::to_value(pb::AuthorizationPolicyToClient::decode(bytes).ok()?.spec)
        }
    };
    json.ok()
}

fn print_state(state: &StateView, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => outln!("{}", serde_json::to_string(state)?),
        // One YAML document per state, so `watch -o yaml` stays a valid stream.
        Output::Yaml => out!("---\n{}", serde_yaml::to_string(state)?),
        Output::Text => {
            outln!(
                "# {} revision {} ({} objects)",
                state.r#type,
                state.revision,
                state.objects.len()
            );
            for object in &state.objects {
                match (&object.interface_name, &object.application_names) {
                    (Some(interface), Some(apps)) => {
                        outln!("{}\t{}\t{}", object.key, interface, apps.join(","));
                    }
                    _ => match &object.spec {
                        Some(spec) => outln!("{}\t{spec}", object.key),
                        None => outln!(
                            "{}\t{}",
                            object.key,
                            object.type_url.as_deref().unwrap_or("")
                        ),
                    },
                }
            }
        }
    }
    Ok(())
}

/// Subscribes to `kind`, calls `on_state` for each response (stopping when it returns false),
/// and acknowledges every response it accepts.
async fn observe(
    server: &ServerArg,
    kind: Kind,
    wait_for_first: bool,
    mut on_state: impl FnMut(&ObserveResponse) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let (requests, requests_rx) = mpsc::channel(4);
    requests
        .send(ObserveRequest {
            nonce: String::new(),
            r#type: kind.type_name().to_owned(),
        })
        .await
        .context("request stream closed")?;
    let what = format!("the discovery stream of {}", kind.name());
    // Bounded up to the response headers, which the server sends at once: a port that
    // accepts and never answers is not a control plane.
    let mut responses = server
        .within(&what, async {
            let channel = server.connect().await?;
            Ok(RuleServiceClient::new(channel)
                .observe(server.request(ReceiverStream::new(requests_rx))?)
                .await
                .map_err(|status| server.failed(&what, &status))?
                .into_inner())
        })
        .await?;
    // The first state waits until the server has loaded the kind: `watch` waits with it,
    // `get` (one state, then exit) does not wait forever.
    let first = responses.message();
    let first = if wait_for_first {
        first.await
    } else {
        tokio::time::timeout(server.timeout, first)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{what} at {}: subscribed, but no state within {}: the server has not \
                     loaded {} yet (`dubbo-cp status` lists what it has not loaded)",
                    server.address,
                    humantime::format_duration(server.timeout),
                    kind.name()
                )
            })?
    }
    .map_err(|status| server.failed(&what, &status))?;
    let mut next = first;
    while let Some(response) = next {
        if !on_state(&response)? {
            return Ok(());
        }
        requests
            .send(ObserveRequest {
                nonce: response.nonce.clone(),
                r#type: response.r#type.clone(),
            })
            .await
            .context("request stream closed")?;
        next = responses
            .message()
            .await
            .map_err(|status| server.failed(&what, &status))?;
    }
    Ok(())
}

pub async fn watch(server: &ServerArg, kind: &str, output: Output) -> anyhow::Result<()> {
    let kind = parse_kind(kind)?;
    observe(server, kind, true, |response| {
        print_state(&view(kind, response, None)?, output)?;
        Ok(true)
    })
    .await
}

/// Waits until the discovery stream serves each of `interfaces` in `namespace` with
/// `application` among its applications; how long that took, or an error after `timeout`.
pub async fn wait_served(
    server: &ServerArg,
    namespace: &str,
    application: &str,
    interfaces: &[String],
    timeout: std::time::Duration,
) -> anyhow::Result<std::time::Duration> {
    let kind = Kind::ServiceNameMapping;
    let started = std::time::Instant::now();
    let mut missing: Vec<String> = interfaces.to_vec();
    let served = observe(server, kind, true, |response| {
        let state = view(kind, response, Some(namespace))?;
        missing.retain(|interface| {
            !state.objects.iter().any(|object| {
                object.interface_name.as_deref() == Some(interface.as_str())
                    && object
                        .application_names
                        .as_ref()
                        .is_some_and(|apps| apps.iter().any(|a| a == application))
            })
        });
        Ok(!missing.is_empty())
    });
    match tokio::time::timeout(timeout, served).await {
        Ok(Ok(())) if missing.is_empty() => Ok(started.elapsed()),
        // The stream ended before every interface was served (the server going away).
        Ok(Ok(())) => anyhow::bail!(
            "registered, but the discovery stream ended before {} was served with {application}",
            missing.join(", ")
        ),
        Ok(Err(error)) => Err(error),
        Err(_) => anyhow::bail!(
            "registered, but {} not served with {application} in {namespace} within {}: \
             registrations are merged into mappings every debounce window (--debounce-after, \
             --debounce-max); `dubbo-cp status` shows a source that is not synced",
            missing.join(", "),
            humantime::format_duration(timeout)
        ),
    }
}

pub async fn get_mappings(
    server: &ServerArg,
    namespace: Option<&str>,
    output: Output,
) -> anyhow::Result<()> {
    let kind = Kind::ServiceNameMapping;
    observe(server, kind, false, |response| {
        print_state(&view(kind, response, namespace)?, output)?;
        Ok(false)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_that_never_answers_is_an_error_naming_what_and_where() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        // Accepts and holds the connection, never answering.
        let held = tokio::spawn(async move { listener.accept().await.map(|(socket, _)| socket) });
        let server = ServerArg {
            address: address.clone(),
            token: None,
            token_type: None,
            ca_file: None,
            tls_server_name: None,
            timeout: std::time::Duration::from_millis(300),
        };
        let run = get_mappings(&server, None, Output::Text);
        let err = tokio::time::timeout(std::time::Duration::from_secs(10), run)
            .await
            .expect("get mappings still waits on a port that never answers")
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "the discovery stream of ServiceNameMapping at {address}: no answer within 300ms"
            )) && message.contains("gRPC port"),
            "{message}"
        );
        held.abort();
    }
}
