//! What the control plane serves of each rule kind, for operators (`dubbo-cp get`, `/debug/rules`):
//! the rules as their sources gave them (the discovery stream sends auth policies without their
//! selectors, so the index alone cannot show them), and the objects a watch had to skip.
//! Also turns a rule into the index's change, with the audience of auth policies.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use dubbo_cp_domain::mapping::client_key;
use dubbo_cp_domain::rules::scope::Audience;
use dubbo_cp_domain::rules::{AuthorizationRule, Kind, Rule, RuleSpec};

use crate::{Change, Resource};

/// (kind, namespace, name).
pub type RuleKey = (Kind, String, String);

pub fn key_of(rule: &Rule) -> RuleKey {
    (rule.kind(), rule.namespace.clone(), rule.name.clone())
}

/// `TagRoute demo/grey`, as reports and errors name an object.
pub fn describe(key: &RuleKey) -> String {
    format!("{} {}/{}", key.0.name(), key.1, key.2)
}

/// The index's change for `rule`: auth policies reach only their audience, scoped to their
/// namespace unless they live in `root_namespace`.
pub fn change_for(rule: &Rule, root_namespace: &str) -> Change {
    let key = rule.client_key();
    match &rule.spec {
        RuleSpec::AuthenticationPolicy(spec) => {
            let audience = Audience::of_authentication(spec, &rule.namespace, root_namespace);
            Change::Scoped(key, Resource::Rule(rule.spec.clone()), Arc::new(audience))
        }
        RuleSpec::AuthorizationPolicy(spec) => {
            let audience = Audience::of_authorization(spec, &rule.namespace, root_namespace);
            let value = if spec.rules.is_empty() && rule.namespace != root_namespace {
                // As the reference: no rules becomes one rule `to` the policy's namespace, and
                // `to` is not sent.
                let mut sent = spec.clone();
                sent.rules = vec![AuthorizationRule::default()];
                RuleSpec::AuthorizationPolicy(sent)
            } else {
                rule.spec.clone()
            };
            Change::Scoped(key, Resource::Rule(value), Arc::new(audience))
        }
        // Two entries declaring one host are served oldest first.
        RuleSpec::ServiceEntry(_) => match rule.created {
            Some(created) => Change::Dated(key, Resource::Rule(rule.spec.clone()), created),
            None => Change::Upsert(key, Resource::Rule(rule.spec.clone())),
        },
        _ => Change::Upsert(key, Resource::Rule(rule.spec.clone())),
    }
}

pub fn delete_for(key: &RuleKey) -> Change {
    Change::Delete(client_key(&key.2, &key.1))
}

/// An object a watch skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Invalid {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub error: String,
}

#[derive(Debug, Default)]
pub struct Catalog {
    rules: RwLock<BTreeMap<RuleKey, Rule>>,
    invalid: RwLock<BTreeMap<RuleKey, String>>,
    /// `--rules-dir` files that failed to parse, with why.
    files: RwLock<BTreeMap<String, String>>,
}

impl Catalog {
    pub fn set_file_errors(&self, errors: BTreeMap<String, String>) {
        *self.files.write().unwrap_or_else(|e| e.into_inner()) = errors;
    }

    pub fn file_errors(&self) -> BTreeMap<String, String> {
        self.files.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn upsert(&self, rule: Rule) {
        let key = key_of(&rule);
        self.invalid_mut().remove(&key);
        self.rules_mut().insert(key, rule);
    }

    pub fn remove(&self, key: &RuleKey) {
        self.rules_mut().remove(key);
        self.invalid_mut().remove(key);
    }

    /// Replaces every rule of `kind` (after a list).
    pub fn reset(&self, kind: Kind, rules: impl IntoIterator<Item = Rule>) {
        let mut all = self.rules_mut();
        all.retain(|key, _| key.0 != kind);
        for rule in rules {
            all.insert(key_of(&rule), rule);
        }
    }

    /// Records that the object `key` was skipped (it leaves the served rules).
    pub fn skip(&self, key: RuleKey, error: String) {
        self.rules_mut().remove(&key);
        self.invalid_mut().insert(key, error);
    }

    /// Forgets every skipped object of `kind` (a new list reports them again).
    pub fn clear_invalid(&self, kind: Kind) {
        self.invalid_mut().retain(|key, _| key.0 != kind);
    }

    /// The rules of `kind`, in `namespace` when given, sorted by namespace and name.
    pub fn list(&self, kind: Kind, namespace: Option<&str>) -> Vec<Rule> {
        self.rules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(key, _)| key.0 == kind && namespace.is_none_or(|ns| key.1 == ns))
            .map(|(_, rule)| rule.clone())
            .collect()
    }

    pub fn invalid(&self) -> Vec<Invalid> {
        self.invalid
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(key, error)| Invalid {
                kind: key.0.name(),
                namespace: key.1.clone(),
                name: key.2.clone(),
                error: error.clone(),
            })
            .collect()
    }

    fn rules_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<RuleKey, Rule>> {
        self.rules.write().unwrap_or_else(|e| e.into_inner())
    }

    fn invalid_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<RuleKey, String>> {
        self.invalid.write().unwrap_or_else(|e| e.into_inner())
    }
}
