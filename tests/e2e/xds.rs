//! Kubernetes mode's xDS on the real API server: Services and EndpointSlices applied with
//! kubectl become clusters and endpoints (ready ones only; a terminating endpoint leaves at
//! once), and a ServiceEntry applied with kubectl serves workloads outside the cluster. The
//! endpoints are not loopback addresses (the API server refuses those), so a raw ADS client
//! built on Envoy's protos checks them, authenticated with a real service-account token.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
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
        let metadata = Struct {
            fields: [(
                "NAMESPACE".to_owned(),
                ProtoValue {
                    kind: Some(value::Kind::StringValue(NS.to_owned())),
                },
            )]
            .into(),
        };
        let request = DiscoveryRequest {
            type_url: dubbo_cp::xds::ENDPOINT.into(),
            resource_names: self.clusters.clone(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            node: Some(envoy_types::pb::envoy::config::core::v3::Node {
                id: "e2e-raw-client".into(),
                metadata: Some(metadata),
                ..Default::default()
            }),
            ..Default::default()
        };
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

pub async fn kubernetes_services_and_entries(cluster: &Cluster, xds: SocketAddr) {
    cluster.namespace(NS, &[]);
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "greeter", "namespace": NS,
                     "labels": {"dubbo.apache.org/application": "greeter"}},
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
                {"addresses": ["10.1.0.1"], "conditions": {"ready": true}},
                // Still ready while terminating (as a pod that keeps serving its drain): only
                // the terminating condition can take it out.
                {"addresses": ["10.1.0.2"], "conditions": {"ready": true, "terminating": terminating}},
                {"addresses": ["10.1.0.3"], "conditions": {"ready": false}},
            ],
        })
        .to_string()
    };
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
    // A terminating endpoint leaves at once.
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&slice(true)));
    eds.until(&["10.1.0.1:17070"]).await;

    // Workloads outside the cluster, declared by a ServiceEntry.
    let legacy = format!("outbound|9090||legacy.{NS}.svc.cluster.local");
    let mut entries = Eds::connect(xds, &token, &[legacy]).await;
    entries.until(&["192.0.2.10:9090"]).await;

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
