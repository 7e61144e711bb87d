//! Metric checks against Prometheus's HTTP API (`/api/v1/query`): the built-in queries over
//! Dubbo's provider metrics, custom queries with placeholders, and the range check.

use std::time::Duration;

use super::crd::{MetricCheck, MetricResult};
use super::http::{HttpClient, HttpError};

/// Percent of the canary pods' calls that succeeded.
pub const SUCCESS_RATE: &str = "request-success-rate";
/// The canary pods' p99 response time, milliseconds.
pub const DURATION: &str = "request-duration";

/// The canary's pods, not the primary's: `<target>-<replicaset>-<pod>`, where a primary pod is
/// `<target>-primary-<replicaset>-<pod>` (Flagger's selector, for the same reason).
const CANARY_PODS: &str = r#"namespace="{{ namespace }}",pod=~"{{ target }}-[0-9a-zA-Z]+(-[0-9a-zA-Z]+)",application_name="{{ application }}""#;

/// The query of `check`: its own, or the built-in of that name. A template's query is read
/// when the check runs ([`Prometheus::check`] takes it).
pub fn query_of(check: &MetricCheck) -> Result<String, String> {
    if let Some(query) = &check.query {
        return Ok(query.clone());
    }
    if let Some(template) = &check.template_ref {
        return Err(format!(
            "metric {:?}: its query is MetricTemplate {}'s",
            check.name, template.name
        ));
    }
    match check.name.as_str() {
        SUCCESS_RATE => Ok(format!(
            "sum(rate(dubbo_provider_requests_succeed_total{{{CANARY_PODS}}}[{{{{ interval }}}}])) \
             / sum(rate(dubbo_provider_requests_total{{{CANARY_PODS}}}[{{{{ interval }}}}])) * 100"
        )),
        DURATION => Ok(format!(
            "max(max_over_time(dubbo_provider_rt_milliseconds_p99{{{CANARY_PODS}}}[{{{{ interval }}}}]))"
        )),
        other => Err(format!(
            "metric {other:?} is not built in ({SUCCESS_RATE}, {DURATION}); give it a query"
        )),
    }
}

/// The values placeholders stand for.
pub struct Placeholders<'a> {
    pub namespace: &'a str,
    pub target: &'a str,
    pub application: &'a str,
    pub interval: &'a str,
    /// A template's `{{ variables.<name> }}` (the metric's `templateVariables`).
    pub variables: &'a std::collections::BTreeMap<String, String>,
}

/// `query` with `{{ namespace }}`, `{{ target }}`, `{{ application }}`, `{{ interval }}` and
/// `{{ variables.<name> }}` replaced; an unknown placeholder is an error naming it.
pub fn render(query: &str, values: &Placeholders<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(format!(
                "unclosed placeholder in query at {:?}",
                &rest[start..]
            ));
        };
        let name = after[..end].trim();
        let value = match name {
            "namespace" => values.namespace,
            "target" => values.target,
            "application" => values.application,
            "interval" => values.interval,
            other => match other.strip_prefix("variables.") {
                Some(variable) => values
                    .variables
                    .get(variable)
                    .map(String::as_str)
                    .ok_or_else(|| {
                        format!("templateVariables has no {variable:?} for {{{{ {other} }}}}")
                    })?,
                None => {
                    return Err(format!(
                        "unknown placeholder {{{{ {other} }}}} (namespace, target, application, \
                         interval, variables.<name>)"
                    ));
                }
            },
        };
        // Label values sit inside double quotes.
        out.push_str(&value.replace('\\', "\\\\").replace('"', "\\\""));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QueryError {
    #[error("no data: the query returned no sample (is the canary receiving calls and scraped?)")]
    NoData,
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("Prometheus answered HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("Prometheus's answer is not a query result: {0}")]
    Malformed(String),
}

/// The first sample of an instant query's answer (vector or scalar). NaN (a rate over no calls)
/// is no data, as in Flagger.
pub fn parse_answer(status: u16, body: &str) -> Result<f64, QueryError> {
    let json: serde_json::Value = match serde_json::from_str(body) {
        Ok(json) => json,
        // A refusal before the API is plain text (Prometheus's basic auth answers 401
        // "Unauthorized", a proxy 502): the status says more than the body's syntax.
        Err(_) if !(200..300).contains(&status) => {
            return Err(QueryError::Status {
                status,
                message: body.trim().chars().take(200).collect(),
            });
        }
        Err(e) => return Err(QueryError::Malformed(e.to_string())),
    };
    if !(200..300).contains(&status) || json["status"] != "success" {
        let message = json["error"]
            .as_str()
            .map_or_else(|| body.chars().take(200).collect(), str::to_owned);
        return Err(QueryError::Status { status, message });
    }
    let data = &json["data"];
    let sample = match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .and_then(|result| result.first())
            .map(|series| &series["value"]),
        Some("scalar") => Some(&data["result"]),
        other => {
            return Err(QueryError::Malformed(format!(
                "result type {other:?}; the query must give an instant vector or a scalar"
            )));
        }
    };
    let Some(sample) = sample else {
        return Err(QueryError::NoData);
    };
    let value: f64 = sample[1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| QueryError::Malformed(format!("sample {sample}")))?;
    if value.is_nan() {
        return Err(QueryError::NoData);
    }
    Ok(value)
}

/// Runs instant queries against one Prometheus.
#[derive(Clone, Default)]
pub struct Prometheus {
    http: HttpClient,
}

/// Where a query runs and how it is let in.
#[derive(Debug, Clone, Default)]
pub struct Endpoint {
    pub address: String,
    pub credentials: Option<crate::template::Credentials>,
    /// Accept any certificate (a template's `insecureSkipVerify`).
    pub insecure: bool,
}

impl Endpoint {
    pub fn plain(address: &str) -> Endpoint {
        Endpoint {
            address: address.to_owned(),
            ..Endpoint::default()
        }
    }
}

impl Prometheus {
    /// Queries over `http` (its roots are the ones https trusts).
    pub fn new(http: HttpClient) -> Prometheus {
        Prometheus { http }
    }

    pub async fn query(
        &self,
        endpoint: &Endpoint,
        query: &str,
        timeout: Duration,
    ) -> Result<f64, QueryError> {
        let address = &endpoint.address;
        let url = format!(
            "{}/api/v1/query?{}",
            address.trim_end_matches('/'),
            form_urlencoded::Serializer::new(String::new())
                .append_pair("query", query)
                .finish()
        );
        let authorization = endpoint.credentials.as_ref().map(|c| c.header());
        let answer = self
            .http
            .get_with(&url, authorization.as_deref(), endpoint.insecure, timeout)
            .await?;
        parse_answer(answer.status, &answer.body)
    }

    /// Runs `check` (with `template_query` for a check naming a template) and judges its value
    /// against its range.
    pub async fn check(
        &self,
        endpoint: &Endpoint,
        check: &MetricCheck,
        template_query: Option<&str>,
        values: &Placeholders<'_>,
        timeout: Duration,
    ) -> MetricResult {
        let range = &check.threshold_range;
        let mut result = MetricResult {
            name: check.name.clone(),
            value: None,
            min: range.min,
            max: range.max,
            ok: false,
            message: String::new(),
        };
        let query = template_query.map_or_else(|| query_of(check), |q| Ok(q.to_owned()));
        let query = match query.and_then(|q| render(&q, values)) {
            Ok(query) => query,
            Err(message) => {
                result.message = message;
                return result;
            }
        };
        match self.query(endpoint, &query, timeout).await {
            Ok(value) => {
                result.value = Some(value);
                result.ok = judge(value, range.min, range.max);
                if !result.ok {
                    result.message = format!(
                        "{} {value} is outside [{}, {}]",
                        check.name,
                        range.min.map_or("-inf".to_owned(), |v| v.to_string()),
                        range.max.map_or("+inf".to_owned(), |v| v.to_string()),
                    );
                }
            }
            Err(error) => result.message = format!("{}: {error}", check.name),
        }
        result
    }
}

/// Whether `value` lies within `[min, max]` (either bound may be open).
pub fn judge(value: f64, min: Option<f64>, max: Option<f64>) -> bool {
    min.is_none_or(|min| value >= min) && max.is_none_or(|max| value <= max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ThresholdRange;

    fn values() -> Placeholders<'static> {
        static VARIABLES: std::sync::LazyLock<std::collections::BTreeMap<String, String>> =
            std::sync::LazyLock::new(|| [("service".to_owned(), "greeter".to_owned())].into());
        Placeholders {
            namespace: "test",
            target: "podinfo",
            application: "podinfo-app",
            interval: "1m",
            variables: &VARIABLES,
        }
    }

    #[test]
    fn a_templates_variables_are_replaced_and_a_missing_one_is_named() {
        assert_eq!(
            render(r#"up{service="{{ variables.service }}"}"#, &values()).unwrap(),
            r#"up{service="greeter"}"#
        );
        assert_eq!(
            render("{{ variables.zone }}", &values()).unwrap_err(),
            r#"templateVariables has no "zone" for {{ variables.zone }}"#
        );
    }

    #[test]
    fn placeholders_are_replaced_with_or_without_spaces() {
        let q = r#"sum(rate(x{namespace="{{ namespace }}",pod=~"{{target}}-.*",app="{{  application }}"}[{{ interval }}]))"#;
        assert_eq!(
            render(q, &values()).unwrap(),
            r#"sum(rate(x{namespace="test",pod=~"podinfo-.*",app="podinfo-app"}[1m]))"#
        );
        assert!(
            render("x{a=\"{{ nope }}\"}", &values())
                .unwrap_err()
                .contains("unknown placeholder {{ nope }}")
        );
        assert!(
            render("x{{ namespace", &values())
                .unwrap_err()
                .contains("unclosed")
        );
    }

    #[test]
    fn built_in_queries_read_the_canary_pods_only() {
        let check = |name: &str| MetricCheck {
            name: name.to_owned(),
            query: None,
            threshold_range: ThresholdRange::default(),
            interval: None,
            template_ref: None,
            template_variables: Default::default(),
        };
        let rate = render(&query_of(&check(SUCCESS_RATE)).unwrap(), &values()).unwrap();
        assert!(rate.contains("dubbo_provider_requests_succeed_total{namespace=\"test\""));
        assert!(rate.contains("/ sum(rate(dubbo_provider_requests_total{"));
        assert!(rate.contains("[1m]"));
        let duration = render(&query_of(&check(DURATION)).unwrap(), &values()).unwrap();
        assert!(duration.contains("dubbo_provider_rt_milliseconds_p99{"));
        // The pod pattern takes podinfo-7d9f-x2x9z, not podinfo-primary-7d9f-x2x9z.
        let pattern = regex::Regex::new("^podinfo-[0-9a-zA-Z]+(-[0-9a-zA-Z]+)$").unwrap();
        assert!(pattern.is_match("podinfo-7d9f-x2x9z"));
        assert!(!pattern.is_match("podinfo-primary-7d9f-x2x9z"));
        assert!(
            query_of(&check("error-budget"))
                .unwrap_err()
                .contains("give it a query")
        );
    }

    #[test]
    fn answers_are_read_like_prometheus_writes_them() {
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.1,"99.5"]}]}}"#;
        assert_eq!(parse_answer(200, vector), Ok(99.5));
        let scalar =
            r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000,"3"]}}"#;
        assert_eq!(parse_answer(200, scalar), Ok(3.0));
        let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(parse_answer(200, empty), Err(QueryError::NoData));
        let nan = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}"#;
        assert_eq!(parse_answer(200, nan), Err(QueryError::NoData));
        let bad = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 4"}"#;
        assert_eq!(
            parse_answer(400, bad),
            Err(QueryError::Status {
                status: 400,
                message: "parse error at char 4".to_owned()
            })
        );
        assert!(matches!(
            parse_answer(200, "<html>"),
            Err(QueryError::Malformed(_))
        ));
        assert_eq!(
            parse_answer(401, "Unauthorized\n"),
            Err(QueryError::Status {
                status: 401,
                message: "Unauthorized".to_owned()
            })
        );
        assert!(QueryError::NoData.to_string().starts_with("no data"));
    }

    #[test]
    fn ranges_are_inclusive_and_open_ended() {
        assert!(judge(99.0, Some(99.0), None));
        assert!(!judge(98.9, Some(99.0), None));
        assert!(judge(500.0, None, Some(500.0)));
        assert!(!judge(501.0, None, Some(500.0)));
        assert!(judge(-5.0, None, None));
    }
}
