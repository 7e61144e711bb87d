//! Kubernetes Services and their EndpointSlices as the domain's services, for the xDS edge: one
//! watch of each over all namespaces (kube-runtime's watcher: list, watch, resume, re-list after
//! 410 Gone), joined by the slices' `kubernetes.io/service-name` label, as Istio reads them.
//!
//! Only ready endpoints are served, and an endpoint that is terminating leaves at once (Istio's
//! default: a terminating pod takes no new calls). Each endpoint carries its pod's labels (the
//! slice's `targetRef`), from a third watch of pods' metadata only, of which only the labels are
//! kept: static tags, TagRoute `match` tags and policy selectors read them as in the other modes.
//! The services go into the index's `Service` kind after each burst of events, once all three
//! have listed (the kind is loaded then), so an edge never mistakes "not listed yet" for
//! "deleted" (nor "labels not read yet" for "no labels": a policy selecting by label would not
//! apply). The index shares the services a burst did not change, so an edge derives only what
//! changed; a failing watch is the kind's condition, as for every kind.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use dubbo_cp_domain::mapping::client_key;
use dubbo_cp_domain::service::{Service, ServiceEndpoint, ServicePort};
use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::StreamExt;

use crate::index::{Index, Kind, Resource, SourceCondition, SourceProblem};
use crate::shutdown::signalled;

/// The label that names an EndpointSlice's Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Events within this window after the first are published together.
const COALESCE: Duration = Duration::from_millis(20);

/// (namespace, name) -> object.
type Objects<T> = BTreeMap<(String, String), T>;
/// A pod's labels.
type Labels = BTreeMap<String, String>;

/// What both watches have seen.
#[derive(Default)]
struct State {
    services: Objects<KubeService>,
    slices: Objects<EndpointSlice>,
    /// What a list in progress has returned so far (it replaces the state when done).
    /// Pods' labels, by (namespace, name): all a pod is read for.
    pods: Objects<Labels>,
    listing_services: Option<Objects<KubeService>>,
    listing_slices: Option<Objects<EndpointSlice>>,
    listing_pods: Option<Objects<Labels>>,
    services_listed: bool,
    slices_listed: bool,
    pods_listed: bool,
    condition: Option<String>,
}

/// Watches Services, EndpointSlices and pods until `shutdown`, putting the services they
/// describe in `index`.
pub async fn run(
    client: Client,
    index: std::sync::Arc<Index>,
    mut shutdown: watch::Receiver<bool>,
) {
    // managedFields are most of an object and never read: not kept.
    let services = watcher(
        Api::<KubeService>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|service| service.metadata.managed_fields = None);
    let slices = watcher(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|slice| slice.metadata.managed_fields = None);
    // Metadata only (no spec, no status), and of that only the labels are kept.
    let pods = watcher(
        Api::<PartialObjectMeta<Pod>>::all(client),
        watcher::Config::default(),
    )
    .default_backoff();
    tokio::pin!(services, slices, pods);
    let mut state = State::default();
    let mut publish_at: Option<Instant> = None;
    loop {
        let deadline = publish_at.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            () = signalled(&mut shutdown) => return,
            event = services.next() => match event {
                Some(Ok(event)) => on_service(&mut state, event),
                Some(Err(err)) => failed(&mut state, &index, "Services", &err),
                None => return,
            },
            event = slices.next() => match event {
                Some(Ok(event)) => on_slice(&mut state, event),
                Some(Err(err)) => failed(&mut state, &index, "EndpointSlices", &err),
                None => return,
            },
            event = pods.next() => match event {
                Some(Ok(event)) => {
                    if !on_pod(&mut state, event) {
                        // A pod whose labels did not change changes no endpoint; its event
                        // still says the pod watch runs again.
                        clear_recovered(&index, &state);
                        continue;
                    }
                }
                Some(Err(err)) => failed(&mut state, &index, "Pods", &err),
                None => return,
            },
            () = tokio::time::sleep_until(deadline), if publish_at.is_some() => {
                publish_at = None;
                publish(&index, &state);
                continue;
            }
        }
        clear_recovered(&index, &state);
        publish_at.get_or_insert_with(|| Instant::now() + COALESCE);
    }
}

/// A watch's own events clear the condition it set, and only that one (a busy pod watch must not
/// hide a failing Service watch).
fn recovered(state: &mut State, what: &str) {
    if state
        .condition
        .as_deref()
        .is_some_and(|condition| condition.starts_with(&format!("{what}: ")))
    {
        state.condition = None;
    }
}

/// Clears the kind's condition once no watch is failing any more.
fn clear_recovered(index: &Index, state: &State) {
    if state.condition.is_none() && index.set_condition(Kind::Service, None) {
        tracing::info!("the watches of Services, EndpointSlices and pods run again");
    }
}

/// Puts the services in the index once every watch has listed (until then the kind is not
/// loaded, and nothing of it is served as gone).
fn publish(index: &Index, state: &State) {
    if !(state.services_listed && state.slices_listed && state.pods_listed) {
        return;
    }
    let services = services_of(&state.services, &state.slices, &state.pods)
        .into_iter()
        .map(|service| {
            let key = client_key(&service.name, &service.namespace);
            (key, Resource::Service(service))
        })
        .collect();
    index.reset(Kind::Service, services, 0);
    index.mark_loaded(Kind::Service);
}

fn failed(state: &mut State, index: &Index, what: &str, err: &watcher::Error) {
    if crate::watch::expired(err) {
        tracing::debug!(watch = what, "watch expired; listing again");
        return;
    }
    // kube's backoff retries; the last good state keeps being served meanwhile.
    let condition = format!("{what}: {err}");
    if state.condition.as_deref() != Some(condition.as_str()) {
        tracing::warn!(%condition, "watch for xDS failed; retrying");
    }
    let served = match index.is_kind_loaded(Kind::Service) {
        true => "serving the services listed before",
        false => "no service is served until they list",
    };
    let hint = match crate::watch::error_code(err) == Some(403) {
        true => {
            " (the control plane's service account needs get, list and watch on services, \
                 endpointslices and pods: deploy/rbac.yaml)"
        }
        false => "",
    };
    index.set_condition(
        Kind::Service,
        Some(SourceCondition {
            problem: SourceProblem::Failing,
            message: format!(
                "the watch of {what} is failing ({served}; retrying): {}{hint}",
                crate::watch::describe(err)
            ),
        }),
    );
    state.condition = Some(condition);
}

fn key_of(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> (String, String) {
    (
        metadata.namespace.clone().unwrap_or_default(),
        metadata.name.clone().unwrap_or_default(),
    )
}

fn on_service(state: &mut State, event: Event<KubeService>) {
    recovered(state, "Services");
    match event {
        Event::Init => state.listing_services = Some(BTreeMap::new()),
        Event::InitApply(service) => {
            state
                .listing_services
                .get_or_insert_with(BTreeMap::new)
                .insert(key_of(&service.metadata), service);
        }
        Event::InitDone => {
            state.services = state.listing_services.take().unwrap_or_default();
            state.services_listed = true;
        }
        Event::Apply(service) => {
            state.services.insert(key_of(&service.metadata), service);
        }
        Event::Delete(service) => {
            state.services.remove(&key_of(&service.metadata));
        }
    }
}

fn on_slice(state: &mut State, event: Event<EndpointSlice>) {
    recovered(state, "EndpointSlices");
    match event {
        Event::Init => state.listing_slices = Some(BTreeMap::new()),
        Event::InitApply(slice) => {
            state
                .listing_slices
                .get_or_insert_with(BTreeMap::new)
                .insert(key_of(&slice.metadata), slice);
        }
        Event::InitDone => {
            state.slices = state.listing_slices.take().unwrap_or_default();
            state.slices_listed = true;
        }
        Event::Apply(slice) => {
            state.slices.insert(key_of(&slice.metadata), slice);
        }
        Event::Delete(slice) => {
            state.slices.remove(&key_of(&slice.metadata));
        }
    }
}

/// Keeps a pod's labels; whether they changed (an endpoint may carry them).
fn on_pod(state: &mut State, event: Event<PartialObjectMeta<Pod>>) -> bool {
    recovered(state, "Pods");
    let labels = |pod: &PartialObjectMeta<Pod>| pod.metadata.labels.clone().unwrap_or_default();
    match event {
        Event::Init => {
            state.listing_pods = Some(BTreeMap::new());
            false
        }
        Event::InitApply(pod) => {
            state
                .listing_pods
                .get_or_insert_with(BTreeMap::new)
                .insert(key_of(&pod.metadata), labels(&pod));
            false
        }
        Event::InitDone => {
            state.pods = state.listing_pods.take().unwrap_or_default();
            state.pods_listed = true;
            true
        }
        Event::Apply(pod) => {
            let labels = labels(&pod);
            state.pods.insert(key_of(&pod.metadata), labels.clone()) != Some(labels)
        }
        Event::Delete(pod) => state.pods.remove(&key_of(&pod.metadata)).is_some(),
    }
}

/// The domain's services: every Service but `ExternalName` ones, with the ready endpoints of
/// its slices, each with its pod's labels (`pods`).
pub fn services_of(
    services: &Objects<KubeService>,
    slices: &Objects<EndpointSlice>,
    pods: &Objects<Labels>,
) -> Vec<Service> {
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for ((namespace, _), slice) in slices {
        if let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SERVICE_NAME_LABEL))
        {
            by_service
                .entry((namespace.as_str(), service.as_str()))
                .or_default()
                .push(slice);
        }
    }
    services
        .iter()
        .filter_map(|((namespace, name), service)| {
            let spec = service.spec.as_ref()?;
            if spec.type_.as_deref() == Some("ExternalName") {
                return None;
            }
            let ports = spec
                .ports
                .iter()
                .flatten()
                .filter_map(|port| {
                    let name = port.name.clone().unwrap_or_default();
                    Some(ServicePort {
                        number: u16::try_from(port.port).ok()?,
                        protocol: protocol_of(&name, port.app_protocol.as_deref()),
                        name,
                    })
                })
                .collect();
            let endpoints = by_service
                .get(&(namespace.as_str(), name.as_str()))
                .into_iter()
                .flatten()
                .flat_map(|slice| endpoints_of(slice, pods))
                .collect();
            Some(Service {
                namespace: namespace.clone(),
                name: name.clone(),
                labels: service.metadata.labels.clone().unwrap_or_default(),
                ports,
                endpoints,
            })
        })
        .collect()
}

/// Who wrote an EndpointSlice.
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Managers whose slices name this cluster's pods as they run: Kubernetes' EndpointSlice
/// controller and the canary controller (the apex's slice).
const POD_MANAGERS: [&str; 2] = ["endpointslice-controller.k8s.io", "canary.dubbo.apache.org"];

/// The ready, not terminating endpoints of a slice (IP slices only; FQDN slices name hosts
/// clients would have to resolve), with the labels of the pod each names.
fn endpoints_of(slice: &EndpointSlice, pods: &Objects<Labels>) -> Vec<ServiceEndpoint> {
    let namespace = slice.metadata.namespace.clone().unwrap_or_default();
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Vec::new();
    }
    let waits_for_pods = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL))
        .is_some_and(|manager| POD_MANAGERS.contains(&manager.as_str()));
    let ports: BTreeMap<String, u16> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|port| {
            let number = u16::try_from(port.port?).ok()?;
            Some((port.name.clone().unwrap_or_default(), number))
        })
        .collect();
    slice
        .endpoints
        .iter()
        .flatten()
        .filter(|endpoint| {
            let conditions = endpoint.conditions.as_ref();
            // An absent `ready` means ready, as the API documents it.
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            ready && !terminating
        })
        .flat_map(|endpoint| {
            let locality = endpoint
                .zone
                .as_ref()
                .map(|zone| format!("/{zone}"))
                .unwrap_or_default();
            let ports = ports.clone();
            // In a slice of a controller that names pods as they are, a pod the pod watch has
            // not delivered yet is left out until it has: served without its labels, it would
            // escape what selects it by label (a canary's weight 0, a TagRoute, a policy) for
            // as long as the watches differ. Other slices (mirrored Endpoints, other clusters'
            // pods) may name pods that never come: served without labels.
            let labels = match endpoint
                .target_ref
                .as_ref()
                .filter(|target| target.kind.as_deref() == Some("Pod"))
            {
                Some(target) => {
                    let pod_namespace = target.namespace.clone().unwrap_or(namespace.clone());
                    let known = target
                        .name
                        .clone()
                        .and_then(|name| pods.get(&(pod_namespace, name)))
                        .cloned();
                    known.or_else(|| (!waits_for_pods).then(BTreeMap::new))
                }
                None => Some(BTreeMap::new()),
            };
            let addresses = match labels {
                Some(_) => endpoint.addresses.as_slice(),
                None => &[],
            };
            let labels = labels.unwrap_or_default();
            addresses
                .iter()
                .filter_map(|address| address.parse::<IpAddr>().ok())
                .map(move |address| ServiceEndpoint {
                    address,
                    ports: ports.clone(),
                    labels: labels.clone(),
                    weight: dubbo_cp_domain::service::DEFAULT_WEIGHT,
                    locality: locality.clone(),
                })
        })
        .collect()
}

/// `appProtocol` when set (`kubernetes.io/h2c` is HTTP2), else the port name's prefix as Istio
/// reads it (`grpc-web`, `grpc`, `http2`, `tri`), else TCP.
fn protocol_of(name: &str, app_protocol: Option<&str>) -> String {
    let named = app_protocol.unwrap_or(name).to_ascii_lowercase();
    let protocol = if named == "kubernetes.io/h2c" {
        "HTTP2"
    } else if named.starts_with("grpc-web") {
        "GRPC-WEB"
    } else if named.starts_with("grpc") {
        "GRPC"
    } else if named.starts_with("http2") {
        "HTTP2"
    } else if named.starts_with("tri") {
        "TRIPLE"
    } else if named.starts_with("http") {
        "HTTP"
    } else {
        "TCP"
    };
    protocol.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn objects<T: serde::de::DeserializeOwned>(items: &[serde_json::Value]) -> Objects<T> {
        items
            .iter()
            .map(|item| {
                let key = (
                    item["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    item["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
                (
                    key,
                    serde_json::from_value(item.clone()).unwrap_or_else(|e| panic!("{e}")),
                )
            })
            .collect()
    }

    fn forbidden() -> watcher::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "pods is forbidden: User \"system:serviceaccount:x:y\" cannot list resource \"pods\"",
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn an_expired_watch_is_no_failure() {
        let index = Index::new(1);
        let mut state = State::default();
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 410, "reason": "Expired",
            "message": "too old resource version",
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        failed(
            &mut state,
            &index,
            "EndpointSlices",
            &watcher::Error::WatchError(Box::new(status)),
        );
        assert!(state.condition.is_none());
        assert!(
            index
                .sources()
                .iter()
                .all(|(_, _, condition)| condition.is_none())
        );
    }

    #[test]
    fn the_kind_loads_once_all_three_list_and_a_failing_watch_is_its_condition() {
        let index = Index::new(1);
        let mut state = State {
            services: objects::<KubeService>(&[
                serde_json::json!({"metadata": {"namespace": "shop", "name": "greeter"},
                                   "spec": {"ports": [{"name": "grpc", "port": 7070}]}}),
                serde_json::json!({"metadata": {"namespace": "shop", "name": "other"},
                                   "spec": {"ports": [{"name": "grpc", "port": 7070}]}}),
            ]),
            services_listed: true,
            slices_listed: true,
            ..State::default()
        };
        failed(&mut state, &index, "Pods", &forbidden());
        publish(&index, &state);
        assert!(!index.is_kind_loaded(Kind::Service), "pods never listed");
        assert!(index.current(Kind::Service).objects.is_empty());
        let (_, _, condition) = index
            .sources()
            .into_iter()
            .find(|(kind, _, _)| *kind == Kind::Service)
            .unwrap_or_else(|| panic!("no Service kind"));
        let message = condition.map(|c| c.message).unwrap_or_default();
        for part in [
            "Pods",
            "list answered 403",
            "no service is served until they list",
            "deploy/rbac.yaml",
        ] {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }

        state.pods_listed = true;
        publish(&index, &state);
        assert!(index.is_kind_loaded(Kind::Service));
        let first = index.current(Kind::Service);
        assert_eq!(
            first.objects.keys().collect::<Vec<_>>(),
            ["greeter/shop", "other/shop"]
        );
        // A burst that changed one service is a new revision sharing the other.
        state
            .services
            .remove(&("shop".to_owned(), "other".to_owned()));
        publish(&index, &state);
        let second = index.current(Kind::Service);
        assert!(second.revision > first.revision);
        assert!(Arc::ptr_eq(
            &first.objects["greeter/shop"],
            &second.objects["greeter/shop"]
        ));
        assert_eq!(second.objects.len(), 1);
        // Nothing changed: no new revision.
        publish(&index, &state);
        assert_eq!(index.current(Kind::Service).revision, second.revision);
    }

    #[test]
    fn ready_endpoints_of_a_services_slices_are_its_endpoints() {
        let services = objects::<KubeService>(&[
            serde_json::json!({
                "metadata": {"namespace": "shop", "name": "greeter",
                             "labels": {"dubbo.apache.org/application": "greeter-app"}},
                "spec": {"ports": [{"name": "grpc", "port": 7070}, {"name": "web", "port": 80, "appProtocol": "kubernetes.io/h2c"}]},
            }),
            serde_json::json!({
                "metadata": {"namespace": "shop", "name": "outside"},
                "spec": {"type": "ExternalName", "externalName": "example.com"},
            }),
        ]);
        let slices = objects::<EndpointSlice>(&[
            serde_json::json!({
                "metadata": {"namespace": "shop", "name": "greeter-abc",
                             "labels": {"kubernetes.io/service-name": "greeter",
                                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                "addressType": "IPv4",
                "ports": [{"name": "grpc", "port": 17070}],
                "endpoints": [
                    {"addresses": ["10.0.0.1"], "zone": "z1",
                     "targetRef": {"kind": "Pod", "name": "greeter-1"}},
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                    {"addresses": ["10.0.0.3"], "conditions": {"ready": true, "terminating": true}},
                    {"addresses": ["10.0.0.4"], "conditions": {"ready": true}},
                    {"addresses": ["10.0.0.5"], "targetRef": {"kind": "Pod", "name": "greeter-new"}},
                ],
            }),
            serde_json::json!({
                "metadata": {"namespace": "other", "name": "greeter-x",
                             "labels": {"kubernetes.io/service-name": "greeter"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.9.9.9"]}],
            }),
        ]);
        let pods = BTreeMap::from([(
            ("shop".to_owned(), "greeter-1".to_owned()),
            BTreeMap::from([("dubbo.tag".to_owned(), "gray".to_owned())]),
        )]);
        let served = services_of(&services, &slices, &pods);
        assert_eq!(served.len(), 1, "ExternalName is not served: {served:?}");
        let greeter = &served[0];
        assert_eq!(greeter.application(), "greeter-app");
        let protocols: Vec<&str> = greeter.ports.iter().map(|p| p.protocol.as_str()).collect();
        assert_eq!(protocols, ["GRPC", "HTTP2"]);
        let addresses: Vec<String> = greeter
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect();
        assert_eq!(
            addresses,
            ["10.0.0.1", "10.0.0.4"],
            "ready and not terminating, of a pod whose labels are known (or of no pod)"
        );
        assert_eq!(greeter.endpoints[0].port_for(&greeter.ports[0]), 17070);
        assert_eq!(greeter.endpoints[0].locality, "/z1");
        // Each endpoint carries its pod's labels (none for one naming no pod).
        assert_eq!(greeter.endpoints[0].labels["dubbo.tag"], "gray");
        assert!(greeter.endpoints[1].labels.is_empty());
        // The pod watch delivers greeter-new: its endpoint is served, with its labels.
        let mut pods = pods;
        pods.insert(
            ("shop".to_owned(), "greeter-new".to_owned()),
            BTreeMap::from([("version".to_owned(), "v2".to_owned())]),
        );
        let served = services_of(&services, &slices, &pods);
        let late = served[0]
            .endpoints
            .last()
            .unwrap_or_else(|| panic!("served"));
        assert_eq!(late.address.to_string(), "10.0.0.5");
        assert_eq!(late.labels["version"], "v2");
        // A slice of another manager may name pods that never come: served without labels.
        let mirrored = objects::<EndpointSlice>(&[serde_json::json!({
            "metadata": {"namespace": "shop", "name": "greeter-m",
                         "labels": {"kubernetes.io/service-name": "greeter",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslicemirroring-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.6"], "targetRef": {"kind": "Pod", "name": "gone"}}],
        })]);
        let served = services_of(&services, &mirrored, &pods);
        assert_eq!(served[0].endpoints.len(), 1, "{served:?}");
        assert!(served[0].endpoints[0].labels.is_empty());
    }

    /// The Services a Canary keeps (`spec.service`), through this source: only the apex is of
    /// the application (so xDS clients of it get no extra clusters), with both roles' pods.
    #[test]
    fn a_canarys_services_add_no_cluster_to_its_application_and_the_apex_holds_both_roles() {
        use dubbo_cp_canary::services::{self as canary, CanaryService, Owner};
        let spec: CanaryService = serde_json::from_value(serde_json::json!(
            {"port": 9898, "portName": "grpc", "targetPort": "grpc"}
        ))
        .unwrap();
        let owner = Owner {
            name: "podinfo".to_owned(),
            namespace: Some("shop".to_owned()),
            ..Owner::default()
        };
        let selector = |app: &str| Some(BTreeMap::from([("app".to_owned(), app.to_owned())]));
        let made = [
            canary::service(&owner, &spec, "podinfo", None, Some("podinfo")),
            canary::service(
                &owner,
                &spec,
                "podinfo-primary",
                selector("podinfo-primary"),
                None,
            ),
            canary::service(&owner, &spec, "podinfo-canary", selector("podinfo"), None),
        ];
        let services = objects::<KubeService>(&made.map(|s| serde_json::to_value(s).unwrap()));
        let ips = [("10.0.0.1".to_owned(), None), ("10.1.0.1".to_owned(), None)];
        let apex = canary::apex_slice(&owner, &spec, "podinfo", 50051, &ips);
        // Kubernetes' EndpointSlice controller's slices of the two selecting Services.
        let role_slice = |service: &str, ip: &str| {
            serde_json::json!({
                "metadata": {"namespace": "shop", "name": format!("{service}-x"),
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"name": "grpc", "port": 50051}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
            })
        };
        let slices = objects::<EndpointSlice>(&[
            serde_json::to_value(apex).unwrap(),
            role_slice("podinfo-primary", "10.1.0.1"),
            role_slice("podinfo-canary", "10.0.0.1"),
        ]);
        let domain = services_of(&services, &slices, &BTreeMap::new());
        let of_application: Vec<&Service> = domain
            .iter()
            .filter(|s| s.application() == "podinfo")
            .collect();
        assert_eq!(of_application.len(), 1, "{domain:#?}");
        let apex = of_application[0];
        assert_eq!(apex.name, "podinfo");
        let mut addresses: Vec<String> = apex
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect();
        addresses.sort();
        assert_eq!(addresses, ["10.0.0.1", "10.1.0.1"]);
        assert_eq!(apex.endpoints[0].port_for(&apex.ports[0]), 50051);
        assert_eq!(apex.ports[0].protocol, "GRPC");
        for role in ["podinfo-primary", "podinfo-canary"] {
            let service = domain.iter().find(|s| s.name == role).unwrap();
            assert_eq!(service.application(), role);
            assert_eq!(service.endpoints.len(), 1);
        }
    }
}
