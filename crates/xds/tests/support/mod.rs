//! What the xDS tests share: an ADS server on 127.0.0.1:0 and services to publish.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use dubbo_cp_domain::service::{Service, ServiceEndpoint, ServicePort};
use dubbo_cp_xds::clients::Clients;
use dubbo_cp_xds::server::Ads;
use dubbo_cp_xds::snapshot::Snapshot;
use tokio::sync::watch;

/// An ADS server serving what is sent on `snapshots`.
pub struct Server {
    pub addr: SocketAddr,
    pub snapshots: watch::Sender<Arc<Snapshot>>,
    pub clients: Arc<Clients>,
    pub stats: Arc<dubbo_cp_xds::stats::XdsStats>,
}

impl Server {
    pub async fn start() -> Server {
        Server::start_with(dubbo_cp_xds::server::DEFAULT_MAX_STREAMS).await
    }

    pub async fn start_with(max_streams: usize) -> Server {
        Server::start_ads(|rx| Ads::new(rx, max_streams)).await
    }

    /// A server whose streams end when `shutdown` turns true (it keeps taking new ones).
    #[allow(dead_code)]
    pub async fn start_with_shutdown(shutdown: watch::Receiver<bool>) -> Server {
        Server::start_ads(|rx| {
            Ads::new(rx, dubbo_cp_xds::server::DEFAULT_MAX_STREAMS).with_shutdown(shutdown)
        })
        .await
    }

    async fn start_ads(ads: impl FnOnce(watch::Receiver<Arc<Snapshot>>) -> Ads) -> Server {
        let (snapshots, rx) = watch::channel(Arc::new(Snapshot::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let ads = ads(rx);
        let clients = ads.clients();
        let stats = ads.stats();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dubbo_cp_xds::service::AdsService::new(ads, 4 * 1024 * 1024))
                .serve_with_incoming(incoming),
        );
        Server {
            addr,
            snapshots,
            clients,
            stats,
        }
    }

    /// Publishes `services` as the next synced version; returns it.
    pub fn publish(&self, services: Vec<Service>) -> String {
        let version = self.snapshots.borrow().version + 1;
        self.snapshots
            .send_replace(Arc::new(Snapshot::new(version, services, true)));
        version.to_string()
    }

    /// Publishes `services` as the next synced version following the current one (only the
    /// services moved, as the control plane's source says of such a version); returns it.
    pub fn publish_following(&self, services: Vec<Service>) -> String {
        let previous = self.snapshots.borrow().clone();
        let version = previous.version + 1;
        let next = Snapshot::new(version, services, true).following(&previous);
        assert!(next.changes().is_some(), "a few services moved");
        self.snapshots.send_replace(Arc::new(next));
        version.to_string()
    }

    /// Publishes `services` with what `rules` adds to the snapshot, as the next synced version.
    pub fn publish_with(
        &self,
        services: Vec<Service>,
        rules: impl FnOnce(Snapshot) -> Snapshot,
    ) -> String {
        let version = self.snapshots.borrow().version + 1;
        self.snapshots
            .send_replace(Arc::new(rules(Snapshot::new(version, services, true))));
        version.to_string()
    }

    /// Publishes `services` with TagRoutes (all in `default`) as the next synced version.
    pub fn publish_with_tags(
        &self,
        services: Vec<Service>,
        tag_routes: Vec<dubbo_cp_domain::rules::TagRouteSpec>,
    ) -> String {
        let version = self.snapshots.borrow().version + 1;
        let rules = tag_routes
            .into_iter()
            .map(|rule| ("default".to_string(), rule))
            .collect();
        self.snapshots.send_replace(Arc::new(
            Snapshot::new(version, services, true).with_tag_routes(rules),
        ));
        version.to_string()
    }

    /// Publishes `services` with DynamicConfigs (all in `default`) as the next synced version.
    pub fn publish_with_configs(
        &self,
        services: Vec<Service>,
        configs: Vec<dubbo_cp_domain::rules::DynamicConfigSpec>,
    ) -> String {
        let version = self.snapshots.borrow().version + 1;
        let configs = configs
            .into_iter()
            .map(|spec| ("default".to_string(), spec))
            .collect();
        self.snapshots.send_replace(Arc::new(
            Snapshot::new(version, services, true).with_dynamic_configs(configs),
        ));
        version.to_string()
    }

    /// Publishes `services` with ConditionRoutes (all in `default`) as the next synced version.
    pub fn publish_with_conditions(
        &self,
        services: Vec<Service>,
        rules: Vec<dubbo_cp_domain::rules::ConditionRouteSpec>,
    ) -> String {
        let version = self.snapshots.borrow().version + 1;
        let rules = rules
            .into_iter()
            .map(|rule| ("default".to_string(), rule))
            .collect();
        self.snapshots.send_replace(Arc::new(
            Snapshot::new(version, services, true).with_condition_routes(rules),
        ));
        version.to_string()
    }

    /// Publishes `services` with ServiceNameMappings `(interface, applications)` in `default`.
    pub fn publish_with_mappings(
        &self,
        services: Vec<Service>,
        mappings: Vec<(&str, Vec<&str>)>,
    ) -> String {
        self.publish_with_mappings_and_tags(services, mappings, Vec::new())
    }

    /// The same, with TagRoutes (all in `default`).
    pub fn publish_with_mappings_and_tags(
        &self,
        services: Vec<Service>,
        mappings: Vec<(&str, Vec<&str>)>,
        tag_routes: Vec<dubbo_cp_domain::rules::TagRouteSpec>,
    ) -> String {
        let version = self.snapshots.borrow().version + 1;
        let tag_routes = tag_routes
            .into_iter()
            .map(|rule| ("default".to_string(), rule))
            .collect();
        let mappings = mappings
            .into_iter()
            .map(|(interface, apps)| {
                (
                    "default".to_string(),
                    interface.to_string(),
                    apps.into_iter().map(str::to_owned).collect(),
                )
            })
            .collect();
        self.snapshots.send_replace(Arc::new(
            Snapshot::new(version, services, true)
                .with_mappings(mappings)
                .with_tag_routes(tag_routes),
        ));
        version.to_string()
    }

    /// Waits (30 s at most, then fails) until every connected client acknowledged `version` of
    /// `type_url`.
    pub async fn acked(&self, type_url: &str, version: &str) {
        let wait = self.clients.wait_for(|clients| {
            !clients.is_empty()
                && clients.iter().all(|c| {
                    c.types
                        .get(type_url)
                        .is_some_and(|t| t.acked.as_deref() == Some(version))
                })
        });
        tokio::time::timeout(std::time::Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no ACK of {type_url} version {version}: {:?}",
                    self.clients.list()
                )
            });
    }

    /// Waits (30 s at most) until every connected stream has taken `version` in hand.
    pub async fn published_to_all(&self, version: &str) {
        let wait = self
            .clients
            .wait_for(|clients| clients.iter().all(|c| c.seen.as_deref() == Some(version)));
        tokio::time::timeout(std::time::Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("version {version} not taken: {:?}", self.clients.list()));
    }
}

/// `greeter` in `namespace` on port 7070 (named `grpc`), one endpoint per (port, weight) on
/// 127.0.0.1.
pub fn greeter(namespace: &str, endpoints: &[(u16, u32)]) -> Service {
    Service {
        namespace: namespace.into(),
        name: "greeter".into(),
        labels: BTreeMap::new(),
        ports: vec![ServicePort {
            number: 7070,
            name: "grpc".into(),
            protocol: "GRPC".into(),
        }],
        endpoints: endpoints
            .iter()
            .map(|(port, weight)| ServiceEndpoint {
                address: std::net::IpAddr::from([127, 0, 0, 1]),
                ports: BTreeMap::from([("grpc".to_string(), *port)]),
                labels: BTreeMap::new(),
                weight: *weight,
                locality: String::new(),
            })
            .collect(),
    }
}

/// A service `name` of `application` in `default` on port 7070, one endpoint on 127.0.0.1:`port`.
pub fn app_service(name: &str, application: &str, port: u16) -> Service {
    let mut service = greeter("default", &[(port, 1)]);
    service.name = name.into();
    service.labels = BTreeMap::from([(
        dubbo_cp_domain::service::APPLICATION_LABEL.to_string(),
        application.to_string(),
    )]);
    service
}
