//! What the watch knows of the ensemble, node by node, and the index changes each node change
//! makes. Owned by the watch's flush alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::index::catalog::{RuleKey, change_for, delete_for, key_of};
use crate::index::{Change, Kind, Resource};
use crate::layout::{self, Node};
use crate::mapping::{MappingKey, candidate_names, client_key};
use crate::providers::Provider;
use crate::rules::Rule;

/// What one node read gave.
pub enum Read {
    /// The node is gone (or empty, for a rule).
    Absent,
    /// What the node holds, and when it was created (its `ctime`, milliseconds since the epoch).
    Data(Vec<u8>, i64),
    /// The node could not be read (its ACL, say): reported, and what it held is no longer served.
    Failed(String),
}

/// Changes to hand to the index and the catalog after a batch of node reads.
#[derive(Default)]
pub struct Changes {
    pub by_kind: BTreeMap<Kind, Vec<Change>>,
    pub rules: Vec<(Option<Rule>, Option<RuleKey>)>,
    pub services_changed: bool,
    /// Mapping nodes read (for the outbox's view, which follows the nodes alone).
    pub mapping_nodes: BTreeSet<MappingKey>,
}

#[derive(Default)]
pub struct State {
    /// Mapping nodes, by key.
    nodes: BTreeMap<MappingKey, Vec<String>>,
    /// Applications interface-level providers name, per key, with how many providers name each.
    provided: BTreeMap<MappingKey, BTreeMap<String, usize>>,
    /// The object name of each served mapping key (kept while the key is served).
    names: BTreeMap<MappingKey, String>,
    /// Names taken, per namespace.
    taken: HashMap<(String, String), MappingKey>,
    /// Rules by node path.
    rules: BTreeMap<String, Rule>,
    /// Which node holds each rule.
    holders: BTreeMap<RuleKey, String>,
    /// Rules whose object another node holds already, by path: served once that node lets go.
    shadowed: BTreeMap<String, Rule>,
    /// Providers by node path.
    providers: BTreeMap<String, Vec<Provider>>,
    /// Nodes whose content cannot be read, and why.
    pub unreadable: BTreeMap<String, String>,
    /// Nodes last read.
    pub nodes_read: usize,
}

impl State {
    /// A fresh state that keeps `previous`'s object names for the keys it still serves.
    pub fn after(previous: &State) -> State {
        State {
            names: previous.names.clone(),
            taken: previous.taken.clone(),
            ..State::default()
        }
    }

    /// Applies what `path` now holds; records its changes in `changes`.
    pub fn set(&mut self, path: &str, read: Read, changes: &mut Changes) {
        self.unreadable.remove(path);
        let (read, created) = match read {
            Read::Failed(why) => {
                self.report(path, why);
                (None, None)
            }
            Read::Absent => (None, None),
            Read::Data(data, created) => (Some(data), Some(created)),
        };
        let dated = |rule: Result<Option<Rule>, String>| {
            rule.map(|rule| rule.map(|rule| Rule { created, ..rule }))
        };
        match layout::classify(path) {
            Node::Mapping(key) => self.set_mapping(path, key, read, changes),
            Node::Rule { namespace, name } => {
                let rule = match read {
                    None => Ok(None),
                    Some(data) => crate::body::decode_rule(&namespace, &name, &data),
                };
                self.set_rule(path, dated(rule), changes);
            }
            Node::Ours {
                namespace,
                kind,
                name,
            } => {
                let rule = match read {
                    None => Ok(None),
                    Some(data) if data.is_empty() => Ok(None),
                    Some(data) => {
                        crate::body::decode_ours(&namespace, kind, &name, &data).map(Some)
                    }
                };
                self.set_rule(path, dated(rule), changes);
            }
            Node::Provider {
                namespace,
                interface,
                url,
            } => {
                let providers = match read {
                    None => Ok(Vec::new()),
                    Some(_) => crate::providers::parse_url(&namespace, &interface, &url)
                        .map(|provider| vec![provider]),
                };
                self.set_providers(path, providers, changes);
            }
            Node::Instance { application, .. } => {
                let providers = match read {
                    None => Ok(Vec::new()),
                    Some(data) => crate::providers::parse_instance(&application, &data),
                };
                self.set_providers(path, providers, changes);
            }
            Node::Other => {}
        }
    }

    fn report(&mut self, path: &str, error: String) {
        tracing::warn!(path, %error, "ZooKeeper node skipped: its content cannot be read");
        // Bounded: the first MAX_REPORTED_NODES by path stay listed (the log has every one),
        // each reason cut short.
        if self.unreadable.len() < crate::stats::MAX_REPORTED_NODES
            || self.unreadable.contains_key(path)
        {
            self.unreadable
                .insert(path.to_owned(), crate::stats::short(&error));
        }
    }

    fn set_mapping(
        &mut self,
        path: &str,
        key: MappingKey,
        read: Option<Vec<u8>>,
        changes: &mut Changes,
    ) {
        let applications = match read {
            None => Vec::new(),
            Some(data) => match crate::mapping_value::parse(&data) {
                Ok(applications) => applications,
                Err(err) => {
                    self.report(path, format!("mapping value {err}"));
                    Vec::new()
                }
            },
        };
        if applications.is_empty() {
            self.nodes.remove(&key);
        } else {
            self.nodes.insert(key.clone(), applications);
        }
        changes.mapping_nodes.insert(key.clone());
        self.mapping_changed(key, changes);
    }

    fn set_providers(
        &mut self,
        path: &str,
        providers: Result<Vec<Provider>, String>,
        changes: &mut Changes,
    ) {
        let providers = providers.unwrap_or_else(|err| {
            self.report(path, format!("provider {err}"));
            Vec::new()
        });
        let before = if providers.is_empty() {
            self.providers.remove(path)
        } else {
            self.providers.insert(path.to_owned(), providers.clone())
        };
        if before.as_ref() == Some(&providers) {
            return;
        }
        changes.services_changed = true;
        let mut keys = BTreeSet::new();
        for (provider, delta) in before
            .iter()
            .flatten()
            .map(|p| (p, -1))
            .chain(providers.iter().map(|p| (p, 1)))
        {
            let Some(interface) = &provider.interface else {
                continue;
            };
            let key = MappingKey::new(provider.namespace.clone(), interface.clone());
            let counts = self.provided.entry(key.clone()).or_default();
            let count = counts.entry(provider.application.clone()).or_default();
            *count = count.saturating_add_signed(delta);
            if *count == 0 {
                counts.remove(&provider.application);
            }
            if counts.is_empty() {
                self.provided.remove(&key);
            }
            keys.insert(key);
        }
        for key in keys {
            self.mapping_changed(key, changes);
        }
    }

    /// The served applications of `key`: its node's, in node order, then those only providers
    /// name (an interface-level provider maps its interface to its `application`).
    fn served(&self, key: &MappingKey) -> Vec<String> {
        let mut applications = self.nodes.get(key).cloned().unwrap_or_default();
        for application in self.provided.get(key).into_iter().flat_map(|c| c.keys()) {
            if !applications.contains(application) {
                applications.push(application.clone());
            }
        }
        applications
    }

    fn mapping_changed(&mut self, key: MappingKey, changes: &mut Changes) {
        let applications = self.served(&key);
        let changes = changes.by_kind.entry(Kind::ServiceNameMapping).or_default();
        if applications.is_empty() {
            if let Some(name) = self.names.remove(&key) {
                self.taken.remove(&(key.namespace.clone(), name.clone()));
                changes.push(Change::Delete(client_key(&name, &key.namespace)));
            }
            return;
        }
        let name = match self.names.get(&key) {
            Some(name) => name.clone(),
            None => {
                let Some(name) = candidate_names(&key.interface).into_iter().find(|name| {
                    !self
                        .taken
                        .contains_key(&(key.namespace.clone(), name.clone()))
                }) else {
                    return;
                };
                self.taken
                    .insert((key.namespace.clone(), name.clone()), key.clone());
                self.names.insert(key.clone(), name.clone());
                name
            }
        };
        changes.push(Change::Upsert(
            client_key(&name, &key.namespace),
            Resource::mapping(key.interface.clone(), applications),
        ));
    }

    fn set_rule(&mut self, path: &str, rule: Result<Option<Rule>, String>, changes: &mut Changes) {
        let rule = rule.unwrap_or_else(|err| {
            self.report(path, err);
            None
        });
        self.shadowed.remove(path);
        // What this node held before leaves first (a changed header, a deleted node).
        if let Some(previous) = self.rules.remove(path) {
            let key = key_of(&previous);
            self.holders.remove(&key);
            if rule.as_ref().is_none_or(|rule| key_of(rule) != key) {
                // Another node with the same object takes over, else it goes.
                if !self.promote(&key, changes) {
                    changes
                        .by_kind
                        .entry(key.0)
                        .or_default()
                        .push(delete_for(&key));
                    changes.rules.push((None, Some(key)));
                }
            }
        }
        let Some(rule) = rule else {
            return;
        };
        let key = key_of(&rule);
        if let Some(holder) = self.holders.get(&key) {
            let error = format!(
                "holds {}, which node {holder} already holds (served once that node lets go)",
                crate::index::catalog::describe(&key)
            );
            self.report(path, error);
            self.shadowed.insert(path.to_owned(), rule);
            return;
        }
        self.hold(path, rule, changes);
    }

    fn hold(&mut self, path: &str, rule: Rule, changes: &mut Changes) {
        self.holders.insert(key_of(&rule), path.to_owned());
        self.rules.insert(path.to_owned(), rule.clone());
        changes.rules.push((Some(rule), None));
    }

    /// Serves the first shadowed node (by path) holding `key`; false when there is none.
    fn promote(&mut self, key: &RuleKey, changes: &mut Changes) -> bool {
        let Some(path) = self
            .shadowed
            .iter()
            .find(|(_, rule)| key_of(rule) == *key)
            .map(|(path, _)| path.clone())
        else {
            return false;
        };
        let Some(rule) = self.shadowed.remove(&path) else {
            return false;
        };
        self.unreadable.remove(&path);
        self.hold(&path, rule, changes);
        true
    }

    /// The index's change for each rule change, with the audience of auth policies.
    pub fn rule_changes(changes: &mut Changes, root_namespace: &str) {
        for (rule, _) in &changes.rules {
            if let Some(rule) = rule {
                changes
                    .by_kind
                    .entry(rule.kind())
                    .or_default()
                    .push(change_for(rule, root_namespace));
            }
        }
    }

    /// Every mapping, rule and provider as a whole state, for a re-list.
    pub fn everything(&self, root_namespace: &str) -> BTreeMap<Kind, Vec<Change>> {
        let mut by_kind: BTreeMap<Kind, Vec<Change>> = crate::rules::RULE_KINDS
            .into_iter()
            .chain([Kind::ServiceNameMapping])
            .map(|kind| (kind, Vec::new()))
            .collect();
        for (key, name) in &self.names {
            let applications = self.served(key);
            if let Some(changes) = by_kind.get_mut(&Kind::ServiceNameMapping) {
                changes.push(Change::Upsert(
                    client_key(name, &key.namespace),
                    Resource::mapping(key.interface.clone(), applications),
                ));
            }
        }
        for rule in self.rules.values() {
            by_kind
                .entry(rule.kind())
                .or_default()
                .push(change_for(rule, root_namespace));
        }
        by_kind
    }

    /// Mapping, rule, provider and instance nodes known.
    pub fn node_count(&self) -> usize {
        self.nodes.len() + self.rules.len() + self.providers.len()
    }

    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.values()
    }

    /// The mapping nodes (not what providers add), for the outbox's view.
    pub fn mapping_nodes(&self) -> impl Iterator<Item = (&MappingKey, &[String])> {
        self.nodes.iter().map(|(key, apps)| (key, apps.as_slice()))
    }

    pub fn mapping_node(&self, key: &MappingKey) -> Option<&[String]> {
        self.nodes.get(key).map(Vec::as_slice)
    }

    pub fn services(&self) -> Vec<crate::service::Service> {
        crate::providers::services(self.providers.values().flatten())
    }

    /// Forgets names of keys no longer served (after a re-list built a fresh state).
    pub fn drop_unused_names(&mut self) {
        let served: BTreeSet<MappingKey> = self
            .nodes
            .keys()
            .chain(self.provided.keys())
            .cloned()
            .collect();
        self.names.retain(|key, _| served.contains(key));
        self.taken.retain(|_, key| served.contains(key));
        for key in served {
            if !self.names.contains_key(&key) {
                let mut ignored = Changes::default();
                self.mapping_changed(key, &mut ignored);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag_route(key: &str) -> Vec<u8> {
        let manifest = format!(
            "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\n\
             metadata: {{name: grey, namespace: default}}\nspec:\n  key: {key}\n  \
             configVersion: v3.0\n  tags: [{{name: gray, addresses: ['10.0.0.1:1']}}]\n"
        );
        let rules = crate::rules::parse_manifests(&manifest).unwrap();
        crate::body::encode(&rules[0], crate::body::Origin::Api).unwrap()
    }

    fn served_key(state: &State) -> Vec<String> {
        state
            .rules()
            .map(|rule| match &rule.spec {
                crate::rules::RuleSpec::TagRoute(spec) => spec.key.clone(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn a_shadowed_rule_is_served_once_its_holder_lets_go() {
        let (shop, cart) = (
            "/dubbo/config/dubbo/shop.tag-router",
            "/dubbo/config/dubbo/cart.tag-router",
        );
        let mut state = State::default();
        let mut changes = Changes::default();
        state.set(shop, Read::Data(tag_route("shop"), 1), &mut changes);
        // The same object (default/grey) at a second node: reported, not served.
        state.set(cart, Read::Data(tag_route("cart"), 2), &mut changes);
        assert_eq!(served_key(&state), ["shop"]);
        assert!(
            state.unreadable[cart].contains("already holds"),
            "{:?}",
            state.unreadable
        );
        // The holder goes: the other node's rule is served, in the same batch.
        let mut changes = Changes::default();
        state.set(shop, Read::Absent, &mut changes);
        assert_eq!(served_key(&state), ["cart"]);
        // Dated by its node's ctime, which orders ServiceEntries declaring one host.
        let created: Vec<Option<i64>> = state.rules().map(|rule| rule.created).collect();
        assert_eq!(created, [Some(2)]);
        assert!(state.unreadable.is_empty());
        assert!(
            changes.rules.iter().any(|(rule, _)| rule.is_some()),
            "the promoted rule is handed on"
        );
        assert!(
            !changes
                .by_kind
                .values()
                .flatten()
                .any(|c| matches!(c, Change::Delete(_))),
            "the object never left: no delete"
        );
    }

    #[test]
    fn a_node_that_cannot_be_read_leaves_and_is_reported() {
        let path = "/dubbo/mapping/org.demo.Greeter";
        let mut state = State::default();
        let mut changes = Changes::default();
        state.set(path, Read::Data(b"a,b".to_vec(), 3), &mut changes);
        assert_eq!(
            state.mapping_node(&MappingKey::new("default", "org.demo.Greeter")),
            Some(&["a".to_owned(), "b".to_owned()][..])
        );
        state.set(path, Read::Failed("not authorized".into()), &mut changes);
        assert_eq!(
            state.mapping_node(&MappingKey::new("default", "org.demo.Greeter")),
            None
        );
        assert_eq!(state.unreadable[path], "not authorized");
    }
}
