//! What one version of the served state holds, and the resources of a type a stream's
//! subscription selects from it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use dubbo_cp_domain::service::{HostName, Service};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use crate::bootstrap::SERVER_LISTENER_PREFIX;
use crate::conditions::Conditions;
use crate::generate::{self, Balancing, Services, Target};
use crate::inbound;
use crate::overrides;
use crate::security::{Policies, tls};
use crate::tags::{Subset, Tagging};
use crate::{CLUSTER, ENDPOINT, LISTENER, ROUTE};
use dubbo_cp_domain::rules::{
    ConditionRouteSpec, DynamicConfigSpec, HASH_HEADER, TagRouteSpec, hashable_header,
};

/// The encoded resources of one version: per type (in [`Encoded::TYPES`] order), name ->
/// namespace (empty when the name resolves alike for every client) -> the resource. Looked up
/// by `&str` on every push of every stream, so a hit allocates nothing.
#[derive(Debug, Default)]
struct Encoded([Fast<String, Fast<String, Arc<Any>>>; 4]);

/// A map hashed with foldhash, seeded at random per process. Only resources that exist are
/// kept, so clients cannot fill it with names of their choosing.
type Fast<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

impl Encoded {
    const TYPES: [&'static str; 4] = [LISTENER, ROUTE, CLUSTER, ENDPOINT];

    fn get(&self, type_url: &str, name: &str, namespace: &str) -> Option<&Arc<Any>> {
        let slot = Self::TYPES.iter().position(|t| *t == type_url)?;
        self.0[slot].get(name)?.get(namespace)
    }

    fn insert(&mut self, type_url: &str, name: &str, namespace: &str, any: Arc<Any>) {
        if let Some(slot) = Self::TYPES.iter().position(|t| *t == type_url) {
            self.0[slot]
                .entry(name.to_owned())
                .or_default()
                .insert(namespace.to_owned(), any);
        }
    }
}
/// (server listener name, namespace) -> what the server enforces.
type Servers = HashMap<(String, String), Arc<inbound::Server>>;

/// The services at one version. Nothing is answered from a snapshot that is not `synced`: an
/// empty listener or cluster answer would tell clients that everything was deleted.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub version: u64,
    pub synced: bool,
    /// When it was built, for the push-delay metric.
    pub published: tokio::time::Instant,
    services: Arc<Vec<Service>>,
    /// (namespace, name) -> position in `services`: every stream resolves every name it holds
    /// on every push, so lookups must not scan.
    by_name: Arc<HashMap<(String, String), usize>>,
    /// DNS name -> position in `services`, for services named by one of their own.
    by_host: Arc<HashMap<String, usize>>,
    /// Enabled TagRoutes by (namespace, application).
    tag_routes: Arc<HashMap<(String, String), TagRouteSpec>>,
    /// Enabled ConditionRoutes, translated, by (namespace, application): the service-scoped ones
    /// of the interfaces it serves, then its own.
    condition_routes: Arc<HashMap<(String, String), Conditions>>,
    /// (namespace, application) -> positions in `services`.
    by_application: Arc<HashMap<(String, String), Vec<usize>>>,
    /// (namespace, application) -> the request header its callers' calls are hashed on
    /// (session affinity, from a DynamicConfig's `hash.header`).
    affinity: Arc<HashMap<(String, String), String>>,
    /// (namespace, interface) -> the applications serving it (ServiceNameMappings).
    mappings: Arc<HashMap<(String, String), Vec<String>>>,
    /// The auth policies: servers' TLS and RBAC, clients' TLS to STRICT servers.
    policies: Arc<Policies>,
    /// (server listener name, namespace) -> what it enforces, derived once per version for the
    /// listener and for operators' views of every stream holding it.
    servers: Arc<Mutex<Servers>>,
    /// (type, name, namespace) -> the encoded resource, shared by every stream at this version.
    cache: Arc<RwLock<Encoded>>,
    /// The previous version's encodings: a resource encoded to the same bytes is that one, so
    /// streams that hold it from either version hold one copy. (Only the map, not the previous
    /// snapshot: versions do not chain.)
    previous: Option<Arc<RwLock<Encoded>>>,
    encodes: Arc<AtomicU64>,
    /// What may differ from the version before, when only services moved.
    changes: Option<Arc<Changes>>,
}

impl Default for Snapshot {
    /// Version 0, empty and not synced: nothing is answered from it.
    fn default() -> Snapshot {
        Snapshot::new(0, Vec::new(), false)
    }
}

impl Snapshot {
    pub fn new(version: u64, services: Vec<Service>, synced: bool) -> Snapshot {
        let by_name = services
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.namespace.clone(), s.name.clone()), i))
            .collect();
        let mut by_host = HashMap::new();
        for (i, service) in services.iter().enumerate() {
            if service.is_dns_host() {
                // The first declaration of a name is served (the sources order them).
                by_host.entry(service.name.clone()).or_insert(i);
            }
        }
        let mut by_application: HashMap<(String, String), Vec<usize>> = HashMap::new();
        for (i, service) in services.iter().enumerate() {
            by_application
                .entry((service.namespace.clone(), service.application().to_owned()))
                .or_default()
                .push(i);
        }
        Snapshot {
            version,
            synced,
            published: tokio::time::Instant::now(),
            services: Arc::new(services),
            by_name: Arc::new(by_name),
            by_host: Arc::new(by_host),
            tag_routes: Arc::default(),
            condition_routes: Arc::default(),
            by_application: Arc::new(by_application),
            affinity: Arc::default(),
            mappings: Arc::default(),
            policies: Arc::default(),
            servers: Arc::default(),
            cache: Arc::default(),
            previous: None,
            encodes: Arc::default(),
            changes: None,
        }
    }

    /// This version follows `previous` built from the same rules, mappings and policies (only
    /// services moved): it says which clusters and load assignments may differ
    /// ([`Snapshot::changes`]).
    pub fn following(mut self, previous: &Snapshot) -> Snapshot {
        if previous.synced && self.synced {
            self.changes = Changes::between(previous, &self).map(Arc::new);
        }
        self
    }

    /// What may differ from the version before, when that is known.
    pub fn changes(&self) -> Option<&Changes> {
        self.changes.as_deref()
    }

    /// This version shares the encodings of `previous` that it encodes to the same bytes.
    pub fn sharing_encodings_of(mut self, previous: &Snapshot) -> Snapshot {
        self.previous = Some(previous.cache.clone());
        self
    }

    /// The same services with the DynamicConfigs `(namespace, spec)` applied to their endpoints'
    /// weights, as Dubbo providers apply them ([`crate::overrides`]). Service-scoped configs
    /// reach the applications of the interface's mapping, so the mappings come first
    /// ([`Snapshot::with_mappings`]).
    ///
    /// A provider-side override's `hash.header` (dubbo-cp's, which Dubbo SDKs ignore) asks for
    /// session affinity on the application's clusters: calls are placed on a ring hash by that
    /// request header (docs/xds.md). The last one named wins; a name gRPC would not hash on is
    /// skipped.
    pub fn with_dynamic_configs(mut self, configs: Vec<(String, DynamicConfigSpec)>) -> Snapshot {
        // What was encoded before describes other state.
        self.forget_derived();
        let by_application = overrides::by_application(configs, &self.mappings);
        let affinity: HashMap<(String, String), String> = by_application
            .iter()
            .filter_map(|(key, overrides)| {
                let header = overrides
                    .iter()
                    .filter_map(|o| o.parameters.get(HASH_HEADER))
                    .rfind(|name| hashable_header(name))?;
                Some((key.clone(), header.clone()))
            })
            .collect();
        self.affinity = Arc::new(affinity);
        if by_application.is_empty() {
            return self;
        }
        let mut services = self.services.as_ref().clone();
        overrides::apply(&mut services, &by_application);
        self.services = Arc::new(services);
        self
    }

    /// The same services with the ServiceNameMappings `(namespace, interface, applications)`
    /// that resolve interface names.
    pub fn with_mappings(mut self, mappings: Vec<(String, String, Vec<String>)>) -> Snapshot {
        // What was encoded before describes other state.
        self.forget_derived();
        self.mappings = Arc::new(
            mappings
                .into_iter()
                .map(|(namespace, interface, applications)| ((namespace, interface), applications))
                .collect(),
        );
        self
    }

    /// The same services with `rules` (namespace, spec) routing by tag; disabled ones are left
    /// out, as Dubbo ignores them.
    pub fn with_tag_routes(mut self, rules: Vec<(String, TagRouteSpec)>) -> Snapshot {
        // What was encoded before describes other state.
        self.forget_derived();
        self.tag_routes = Arc::new(
            rules
                .into_iter()
                .filter(|(_, rule)| rule.enabled)
                .map(|(namespace, rule)| ((namespace, rule.key.clone()), rule))
                .collect(),
        );
        self
    }

    /// The same services with `rules` (namespace, spec) routing by condition: what clients can
    /// apply of each enabled one ([`crate::conditions`]); the highest priority wins per key.
    pub fn with_condition_routes(mut self, rules: Vec<(String, ConditionRouteSpec)>) -> Snapshot {
        // What was encoded before describes other state.
        self.forget_derived();
        // Of several rules for one key, the highest `priority`; per scope, as their keys differ.
        // Service-scoped keys (`false`) sort first, so they come first in each application's.
        let mut by_key: BTreeMap<(bool, String, String), (i32, Conditions)> = BTreeMap::new();
        for (namespace, rule) in rules.into_iter().filter(|(_, rule)| rule.enabled) {
            let (conditions, _) = crate::conditions::translate(&rule);
            if conditions.conditions.is_empty() {
                continue;
            }
            let application_scoped = rule.scope == "application";
            let key = (application_scoped, namespace, rule.key.clone());
            if by_key
                .get(&key)
                .is_none_or(|(priority, _)| rule.priority > *priority)
            {
                by_key.insert(key, (rule.priority, conditions));
            }
        }
        // Per application: the service-scoped rules of the interfaces it serves (by interface),
        // then its own, as Dubbo routes a call by its service's rule before its application's.
        let mut by_application: HashMap<(String, String), Conditions> = HashMap::new();
        for ((application_scoped, namespace, key), (_, conditions)) in by_key {
            let applications = match application_scoped {
                true => vec![key],
                false => self
                    .mappings
                    .get(&(namespace.clone(), key))
                    .cloned()
                    .unwrap_or_default(),
            };
            for application in applications {
                by_application
                    .entry((namespace.clone(), application))
                    .or_default()
                    .conditions
                    .extend(conditions.conditions.iter().cloned());
            }
        }
        self.condition_routes = Arc::new(by_application);
        self
    }

    /// The same services with the auth policies (and the settings to read them) that decide
    /// servers' TLS and RBAC and their callers' TLS.
    pub fn with_policies(mut self, policies: Policies) -> Snapshot {
        // What was encoded before describes other state.
        self.forget_derived();
        self.policies = Arc::new(policies);
        self
    }

    /// What the server listener `name` (an xDS-enabled server's, gRFC A36) enforces for a
    /// server in `namespace`; `None` when the name is not a server listener's.
    pub fn server(&self, name: &str, namespace: &str) -> Option<Arc<inbound::Server>> {
        let listening = inbound::parse(name)?;
        let key = (name.to_owned(), namespace.to_owned());
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = servers.get(&key) {
            return Some(server.clone());
        }
        let server = Arc::new(inbound::server(
            &self.services,
            &self.policies,
            listening,
            namespace,
        ));
        servers.insert(key, server.clone());
        Some(server)
    }

    /// Drops what was derived from the state before a change.
    fn forget_derived(&mut self) {
        self.cache = Arc::default();
        self.servers = Arc::default();
        self.changes = None;
    }

    /// How the clusters of a target's service pick endpoints.
    fn balancing(&self, target: Target<'_>) -> Balancing<'_> {
        let key = (
            target.service.namespace.clone(),
            target.service.application().to_owned(),
        );
        match self.affinity.get(&key) {
            Some(header) => Balancing::HashHeader(header),
            None => Balancing::RoundRobin,
        }
    }

    /// Tag routing for a target's service.
    fn tagging<'a>(&'a self, target: Target<'a>) -> Tagging<'a> {
        let key = (
            target.service.namespace.clone(),
            target.service.application().to_owned(),
        );
        Tagging {
            endpoints: &target.service.endpoints,
            port: target.port,
            rule: self.tag_routes.get(&key),
            conditions: self.condition_routes.get(&key),
        }
    }

    pub fn services(&self) -> &[Service] {
        &self.services
    }
}

impl Services for Snapshot {
    fn find(&self, namespace: &str, name: &str) -> Option<&Service> {
        let position = self.by_name.get(&(namespace.to_owned(), name.to_owned()))?;
        self.services.get(*position)
    }

    fn find_host(&self, host: &str) -> Option<&Service> {
        self.services.get(*self.by_host.get(host)?)
    }

    fn of_application(&self, namespace: &str, application: &str) -> Vec<&Service> {
        self.by_application
            .get(&(namespace.to_owned(), application.to_owned()))
            .map(|positions| {
                positions
                    .iter()
                    .filter_map(|i| self.services.get(*i))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn serving(&self, namespace: &str, interface: &str) -> Vec<String> {
        self.mappings
            .get(&(namespace.to_owned(), interface.to_owned()))
            .cloned()
            .unwrap_or_default()
    }
}

/// The target (and subset) of a cluster name `outbound|<port>|<subset>|<fqdn>`.
fn cluster_target<'a>(services: &'a Snapshot, name: &str) -> Option<(Target<'a>, Option<Subset>)> {
    let mut parts = name.split('|');
    let (Some("outbound"), Some(port), Some(subset), Some(fqdn), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let port: u16 = port.parse().ok()?;
    let service = match services.find_host(fqdn) {
        Some(service) => service,
        None => {
            let host = HostName::parse(fqdn)?;
            services.find(&host.namespace?, &host.name)?
        }
    };
    let port = service.port(Some(port))?;
    let subset = match subset {
        "" => None,
        subset => Some(Subset::parse(subset)?),
    };
    let target = Target { service, port };
    // One spelling per cluster (the one routes use): `greeter.shop`, `07070` or upper-case hex
    // would be further names of it, each cached on its own.
    if generate::subset_cluster_name(target, subset.as_ref()) != name {
        return None;
    }
    // Only subsets the routes name exist: clients cannot make up others (and grow the cache).
    if subset
        .as_ref()
        .is_some_and(|subset| !services.tagging(target).routes_to(subset))
    {
        return None;
    }
    Some((target, subset))
}

/// Every service port, for wildcard subscriptions (Envoy's): `(fqdn:port, target)`.
fn every_target(services: &[Service]) -> impl Iterator<Item = (String, Target<'_>)> {
    services.iter().flat_map(|service| {
        service.ports.iter().map(move |port| {
            (
                format!("{}:{}", service.fqdn(), port.number),
                Target { service, port },
            )
        })
    })
}

/// The resource `name` of `type_url` for a client in `client_namespace`, generated and encoded.
/// `None` when nothing answers to the name.
fn generate_one(
    snapshot: &Snapshot,
    type_url: &str,
    name: &str,
    client_namespace: &str,
) -> Option<Any> {
    match type_url {
        LISTENER if name.starts_with(SERVER_LISTENER_PREFIX) => {
            let server = snapshot.server(name, client_namespace)?;
            Some(pack_any(inbound::listener(name, &server)))
        }
        LISTENER => {
            let exists = !generate::resolve_all(snapshot, name, client_namespace).is_empty();
            exists.then(|| pack_any(generate::listener(name)))
        }
        ROUTE => {
            // Wildcard listeners' routes are named fqdn:port, which resolves like any name.
            let targets = generate::resolve_all(snapshot, name, client_namespace);
            let mut routes = match targets.as_slice() {
                [] => return None,
                [target] => {
                    let tagging = snapshot.tagging(*target);
                    generate::route_configuration(name, *target, Some(&tagging))
                }
                several => {
                    let parts: Vec<_> = several
                        .iter()
                        .map(|target| (*target, snapshot.tagging(*target)))
                        .collect();
                    generate::weighted_route_configuration(name, &parts)
                }
            };
            let mut headers: Vec<&str> = targets
                .iter()
                .filter_map(|target| match snapshot.balancing(*target) {
                    Balancing::HashHeader(header) => Some(header),
                    Balancing::RoundRobin => None,
                })
                .collect();
            headers.sort_unstable();
            headers.dedup();
            generate::hash_on_headers(&mut routes, &headers);
            Some(pack_any(routes))
        }
        CLUSTER => {
            let (target, subset) = cluster_target(snapshot, name)?;
            let balancing = snapshot.balancing(target);
            let mut cluster = generate::subset_cluster(target, subset.as_ref(), balancing);
            let policies = &snapshot.policies;
            let endpoints = match &subset {
                Some(subset) => snapshot.tagging(target).endpoints_of(subset),
                None => target.service.endpoints.iter().collect(),
            };
            if policies.upstream_mtls(target.service, endpoints, target.port) {
                cluster.transport_socket = Some(tls::upstream_mtls(
                    &policies.settings.trust_domain,
                    &target.service.namespace,
                ));
            }
            Some(pack_any(cluster))
        }
        ENDPOINT => {
            let (target, subset) = cluster_target(snapshot, name)?;
            let endpoints = match &subset {
                Some(subset) => snapshot.tagging(target).endpoints_of(subset),
                None => target.service.endpoints.iter().collect(),
            };
            let assignment = generate::subset_load_assignment(
                target,
                subset.as_ref(),
                &endpoints,
                snapshot.balancing(target),
            );
            Some(pack_any(assignment))
        }
        _ => None,
    }
}

impl Snapshot {
    /// [`generate_one`], once per version for every stream: the bytes are shared. Only
    /// resources that exist are kept, so names clients make up cannot grow the cache.
    fn encoded(&self, type_url: &str, name: &str, client_namespace: &str) -> Option<Arc<Any>> {
        // Clusters and load assignments are named absolutely; listeners and routes resolve in
        // the client's namespace.
        let namespace = match type_url {
            // A server's listener depends on the server's namespace.
            LISTENER if name.starts_with(SERVER_LISTENER_PREFIX) => client_namespace,
            // Only a name that says its namespace, of a service there, resolves the same for
            // every client.
            LISTENER | ROUTE if !generate::resolves_alike(self, name) => client_namespace,
            _ => "",
        };
        {
            let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(any) = cache.get(type_url, name, namespace) {
                return Some(any.clone());
            }
        }
        // Generated under the write lock, so each resource is generated once per version.
        let mut cache = self.cache.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(any) = cache.get(type_url, name, namespace) {
            return Some(any.clone());
        }
        let generated = generate_one(self, type_url, name, client_namespace)?;
        self.encodes.fetch_add(1, Ordering::Relaxed);
        // Another snapshot's lock, never this one's: no two tasks take them in turn.
        let earlier = self.previous.as_ref().and_then(|previous| {
            let previous = previous.read().unwrap_or_else(PoisonError::into_inner);
            previous
                .get(type_url, name, namespace)
                .filter(|old| old.value == generated.value && old.type_url == generated.type_url)
                .cloned()
        });
        let any = earlier.unwrap_or_else(|| Arc::new(generated));
        cache.insert(type_url, name, namespace, any.clone());
        Some(any)
    }

    /// Resources generated and encoded at this version, across every stream (or, after
    /// [`Snapshot::counting_encodes_in`], across every version sharing the counter).
    pub fn encodes(&self) -> u64 {
        self.encodes.load(Ordering::Relaxed)
    }

    /// Counts this version's encodings in `counter` (the edge's metric), not its own.
    pub fn counting_encodes_in(mut self, counter: Arc<AtomicU64>) -> Snapshot {
        self.encodes = counter;
        self
    }
}

/// The resources of `type_url` that `state` subscribes to, by name. A name that resolves to
/// nothing is left out, which tells the client it does not exist.
#[cfg(test)]
pub(crate) fn resources(
    snapshot: &Snapshot,
    type_url: &str,
    state: &crate::protocol::TypeState,
    client_namespace: &str,
) -> crate::protocol::Selected {
    select(
        snapshot,
        type_url,
        &state.names,
        state.wildcard,
        client_namespace,
    )
}

/// [`resources`] of the subscription to `names` (or every resource, `wildcard`).
pub fn select(
    snapshot: &Snapshot,
    type_url: &str,
    names: &BTreeSet<String>,
    wildcard: bool,
    client_namespace: &str,
) -> crate::protocol::Selected {
    // Every stream runs this for every type on every version: the names it holds are read in
    // place, and only a wildcard's (every service) are built.
    let every: BTreeSet<String>;
    let names = match wildcard {
        false => names,
        true => {
            let targets = every_target(snapshot.services());
            let mut names = names.clone();
            match type_url {
                LISTENER => names.extend(targets.map(|(name, _)| name)),
                CLUSTER => names.extend(targets.map(|(_, target)| generate::cluster_name(target))),
                _ => {}
            }
            every = names;
            &every
        }
    };
    // A server listens on a few ports: names beyond that are made up, and would grow the
    // version's caches.
    let mut servers = 0usize;
    names
        .iter()
        .filter(|name| {
            if type_url != LISTENER || !name.starts_with(SERVER_LISTENER_PREFIX) {
                return true;
            }
            servers += 1;
            servers <= MAX_SERVER_LISTENERS
        })
        .filter_map(|name| {
            let any = snapshot.encoded(type_url, name, client_namespace)?;
            Some((name.clone(), any))
        })
        .collect()
}

/// The cluster or load assignment `name` at this version, as [`select`] finds it.
pub fn cluster_resource(snapshot: &Snapshot, type_url: &str, name: &str) -> Option<Arc<Any>> {
    debug_assert!(type_url == CLUSTER || type_url == ENDPOINT);
    // Clusters and load assignments are named absolutely: no client namespace.
    snapshot.encoded(type_url, name, "")
}

/// Server listeners one stream is answered (a server process listening on more xDS ports than
/// this is not expected; the rest are answered as not existing).
pub const MAX_SERVER_LISTENERS: usize = 16;

mod changes;
pub use changes::Changes;

#[cfg(test)]
mod tests;
