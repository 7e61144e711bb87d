//! Kubernetes mode's xDS on the real API server: Services and EndpointSlices applied with
//! kubectl become clusters and endpoints (ready ones only; a terminating endpoint leaves at
//! once), and a ServiceEntry applied with kubectl serves workloads outside the cluster. The
//! endpoints are not loopback addresses (the API server refuses those), so a raw ADS client
//! built on Envoy's protos checks them, authenticated with a real service-account token.
//! They reach xDS through the index's `Service` kind, which readiness and the index's metrics
//! show like any kind.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster as XdsCluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value as ProtoValue, value};
use prost::Message;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::common::kube_local::Cluster;

const NS: &str = "xds-shop";
const WAIT: Duration = Duration::from_secs(60);

/// `address:port` of every endpoint of a load assignment, sorted.
fn endpoints_of(response: &DiscoveryResponse) -> Vec<String> {
    let mut found = Vec::new();
    for any in &response.resources {
        let assignment = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
        for lb in assignment
            .endpoints
            .iter()
            .flat_map(|l| l.lb_endpoints.iter())
        {
            let Some(HostIdentifier::Endpoint(endpoint)) = &lb.host_identifier else {
                continue;
            };
            let socket = endpoint.address.as_ref().and_then(|a| match &a.address {
                Some(
                    envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(s),
                ) => Some(s),
                _ => None,
            });
            if let Some(socket) = socket {
                let port = match socket.port_specifier {
                    Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => p,
                    _ => 0,
                };
                found.push(format!("{}:{port}", socket.address));
            }
        }
    }
    found.sort();
    found
}

/// A request of a client in `NS` for `names` of `type_url`.
fn request(type_url: &str, names: &[String], version: &str, nonce: &str) -> DiscoveryRequest {
    let metadata = Struct {
        fields: [(
            "NAMESPACE".to_owned(),
            ProtoValue {
                kind: Some(value::Kind::StringValue(NS.to_owned())),
            },
        )]
        .into(),
    };
    DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.to_vec(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        node: Some(envoy_types::pb::envoy::config::core::v3::Node {
            id: "e2e-raw-client".into(),
            metadata: Some(metadata),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The first answer of a raw ADS stream holding `token` to a request for `name` of `type_url`
/// in which `done` holds (each answer is asked again until then, for at most [`WAIT`]).
async fn answer_until(
    xds: SocketAddr,
    token: &str,
    type_url: &str,
    name: &str,
    done: impl Fn(&DiscoveryResponse) -> bool,
) -> DiscoveryResponse {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}"))
            .await
            .unwrap();
        let (requests, rx) = mpsc::channel(1);
        requests
            .send(request(type_url, &[name.to_owned()], "", ""))
            .await
            .unwrap();
        let mut call = tonic::Request::new(ReceiverStream::new(rx));
        call.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let mut responses = client
            .stream_aggregated_resources(call)
            .await
            .unwrap()
            .into_inner();
        let response = tokio::time::timeout_at(deadline, responses.message())
            .await
            .unwrap_or_else(|_| panic!("no answer for {name}"))
            .unwrap()
            .expect("an answer");
        if done(&response) {
            return response;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never became as wanted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A raw ADS stream subscribed to the load assignments of `clusters`, as a client in `NS`
/// holding `token`.
struct Eds {
    requests: mpsc::Sender<DiscoveryRequest>,
    responses: tonic::Streaming<DiscoveryResponse>,
    clusters: Vec<String>,
}

impl Eds {
    async fn connect(xds: SocketAddr, token: &str, clusters: &[String]) -> Eds {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}"))
            .await
            .unwrap();
        let (requests, rx) = mpsc::channel(16);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let responses = client
            .stream_aggregated_resources(request)
            .await
            .unwrap()
            .into_inner();
        let eds = Eds {
            requests,
            responses,
            clusters: clusters.to_vec(),
        };
        eds.send("", "").await;
        eds
    }

    async fn send(&self, version: &str, nonce: &str) {
        let request = request(dubbo_cp::xds::ENDPOINT, &self.clusters, version, nonce);
        self.requests.send(request).await.unwrap();
    }

    /// ACKs every response until the endpoints are `wanted`.
    async fn until(&mut self, wanted: &[&str]) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut last = Vec::new();
        loop {
            let response = tokio::time::timeout_at(deadline, self.responses.message())
                .await
                .unwrap_or_else(|_| panic!("endpoints never became {wanted:?}; last {last:?}"))
                .unwrap()
                .expect("the stream is open");
            self.send(&response.version_info, &response.nonce).await;
            last = endpoints_of(&response);
            if last == wanted {
                return;
            }
        }
    }
}

/// `/readyz`: ready, and nothing said of the `Service` kind (not loaded, or failing).
async fn services_ready(admin: SocketAddr) {
    let (code, body) = crate::common::http_get(admin, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("Service:"), "{body}");
}

const SERVICE_PUBLISHES: &str = "dubbo_cp_index_state_publishes_total{kind=\"Service\"}";

pub async fn kubernetes_services_and_entries(
    cluster: &Cluster,
    xds: SocketAddr,
    admin: SocketAddr,
) {
    cluster.namespace(NS, &[]);
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "greeter", "namespace": NS,
                     "labels": {"dubbo.apache.org/application": "greeter", "app": "greeter"}},
        "spec": {"ports": [{"name": "grpc", "port": 7070, "targetPort": 17070}]},
    });
    let slice = |terminating: bool| {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "greeter-1", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": "greeter"}},
            "addressType": "IPv4",
            "ports": [{"name": "grpc", "port": 17070}],
            "endpoints": [
                {"addresses": ["10.1.0.1"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "greeter-v2", "namespace": NS}},
                // Still ready while terminating (as a pod that keeps serving its drain): only
                // the terminating condition can take it out.
                {"addresses": ["10.1.0.2"], "conditions": {"ready": true, "terminating": terminating}},
                {"addresses": ["10.1.0.3"], "conditions": {"ready": false}},
            ],
        })
        .to_string()
    };
    // The pod behind 10.1.0.1: its labels (a static Dubbo tag, a version) reach its endpoint.
    cluster.pod(
        NS,
        "greeter-v2",
        json!({"dubbo.tag": "gray", "version": "v2"}),
    );
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&service.to_string()));
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&slice(false)));
    let entry = json!({
        "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "ServiceEntry",
        "metadata": {"name": "legacy", "namespace": NS},
        "spec": {"hosts": ["legacy"], "ports": [{"number": 9090, "name": "grpc"}],
                 "endpoints": [{"address": "192.0.2.10"}]},
    });
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&entry.to_string()));

    let token = cluster.token(NS, "default", None, None);
    let greeter = format!("outbound|7070||greeter.{NS}.svc.cluster.local");
    let mut eds = Eds::connect(xds, &token, std::slice::from_ref(&greeter)).await;
    // Ready endpoints on the slice's port; the one not ready is not served.
    eds.until(&["10.1.0.1:17070", "10.1.0.2:17070"]).await;
    // Listed, so loaded, with nothing wrong; each change is a new revision of the kind.
    services_ready(admin).await;
    assert!(crate::common::metric(admin, "dubbo_cp_index_objects{kind=\"Service\"}").await >= 1.0);
    let publishes = crate::common::metric(admin, SERVICE_PUBLISHES).await;
    assert!(publishes >= 1.0);
    // A terminating endpoint leaves at once.
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&slice(true)));
    eds.until(&["10.1.0.1:17070"]).await;
    assert!(crate::common::metric(admin, SERVICE_PUBLISHES).await > publishes);

    // The pod's static tag makes a tag subset of its endpoint alone.
    let gray = format!("outbound|7070|tag-67726179|greeter.{NS}.svc.cluster.local");
    let mut tagged = Eds::connect(xds, &token, &[gray]).await;
    tagged.until(&["10.1.0.1:17070"]).await;

    // Workloads outside the cluster, declared by a ServiceEntry.
    let legacy = format!("outbound|9090||legacy.{NS}.svc.cluster.local");
    let mut entries = Eds::connect(xds, &token, &[legacy]).await;
    entries.until(&["192.0.2.10:9090"]).await;

    // xDS-enabled servers: one behind an EndpointSlice endpoint (found, with its pod's labels),
    // one at an address nothing lists (only its namespace is known). A policy selecting another
    // label applies to the unknown one (as if it matched, reported) and not to the found one;
    // one selecting the pod's label applies to the found one.
    let found = "grpc/server?xds.resource.listening_address=10.1.0.1:17070";
    let unknown = "grpc/server?xds.resource.listening_address=10.9.9.9:17070";
    let mtls = |response: &DiscoveryResponse| {
        response.resources.len() == 1
            && Listener::decode(response.resources[0].value.as_slice())
                .unwrap()
                .filter_chains[0]
                .transport_socket
                .is_some()
    };
    let listener =
        |type_url, name| answer_until(xds, &token, type_url, name, |r| r.resources.len() == 1);
    assert!(!mtls(&listener(dubbo_cp::xds::LISTENER, found).await));
    // STRICT for the pods whose `label` is `value`.
    let strict_for = |name: &str, label: &str, value: &str| {
        let policy = json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "AuthenticationPolicy",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"action": "STRICT", "selector": [{"extends": [
                {"key": format!("kubernetesEnv.podLabels.{label}"), "value": value}]}]},
        });
        cluster.kubectl_in(&["apply", "-f", "-"], Some(&policy.to_string()));
    };
    strict_for("others", "app", "other");
    answer_until(xds, &token, dubbo_cp::xds::LISTENER, unknown, mtls).await;
    assert!(
        !mtls(&listener(dubbo_cp::xds::LISTENER, found).await),
        "the found server's labels say app=greeter"
    );
    // Selecting the pod's own label: the found server turns mTLS, and its callers' cluster TLS.
    strict_for("v2", "version", "v2");
    answer_until(xds, &token, dubbo_cp::xds::LISTENER, found, mtls).await;
    answer_until(xds, &token, dubbo_cp::xds::CLUSTER, &greeter, |r| {
        r.resources.len() == 1
            && XdsCluster::decode(r.resources[0].value.as_slice())
                .unwrap()
                .transport_socket
                .is_some()
    })
    .await;
    for name in ["v2", "others"] {
        cluster.kubectl_in(&["delete", "authenticationpolicy", name, "-n", NS], None);
    }

    // Without a token the stream is refused, as on every gRPC port.
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}"))
        .await
        .unwrap();
    let (_requests, rx) = mpsc::channel::<DiscoveryRequest>(1);
    let refused = match client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
    {
        Ok(_) => panic!("a stream without a token was accepted"),
        Err(status) => status,
    };
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
}
