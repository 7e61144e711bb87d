//! `dubbo-cp apply` and `delete` in ZooKeeper mode: each rule is written to its node (Dubbo's
//! config-center key for TagRoute, ConditionRoute and DynamicConfig, our own path for the rest),
//! every document of one call in one ZooKeeper transaction (`multi`), checked against the
//! versions it read. The watch brings the result into the index, as it brings anyone's edits.
//!
//! A node holding another object (two objects whose keys name one node), or a body dubbo-cp
//! cannot read, is refused with a message naming both: it is never overwritten.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Client, Error, MultiWriteError};

use crate::body::Origin;
use crate::index::catalog::{Catalog, RuleKey, describe, key_of};
use crate::layout;
use crate::rules::{ManifestError, Rule, parse_manifests};
use crate::session::Session;
use crate::stats::ZkStats;
use crate::store::rules::Report;

/// How long a rule write waits for a session.
const SESSION_WAIT: Duration = Duration::from_secs(5);
/// Transactions retried when a node changed between the read and the write.
const TRIES: usize = 3;

/// Why a rule write was refused.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// The manifests do not parse or validate; nothing was written.
    #[error(transparent)]
    Invalid(#[from] ManifestError),
    /// The rules cannot go where they must (a node holds another object, or cannot be read).
    #[error("{0}")]
    Refused(String),
    /// The ensemble did not answer; nothing was written.
    #[error("ZooKeeper: {0}")]
    Unavailable(String),
}

pub struct ZkRules {
    session: Arc<Session>,
    catalog: Arc<Catalog>,
    /// One write at a time, so a report's created/configured reflect that write alone.
    writing: tokio::sync::Mutex<()>,
    /// Objects the rules directory wrote while this process ran (the catalog may not serve a
    /// just-written one yet when the directory drops it again).
    dir_written: std::sync::Mutex<BTreeMap<RuleKey, String>>,
    /// The runtime a rules directory's blocking reload waits on.
    runtime: tokio::runtime::Handle,
}

/// The node of `rule`.
pub fn node_path(rule: &Rule) -> Result<String, String> {
    let refused = |err: layout::LayoutError| format!("{}: {err}", describe(&key_of(rule)));
    match layout::rule_key(&rule.spec) {
        Some(name) => {
            let name = name.map_err(refused)?;
            Ok(format!(
                "{}/{name}",
                layout::config_dir(&rule.namespace).map_err(refused)?
            ))
        }
        None => Ok(format!(
            "{}/{}",
            layout::ours_dir(&rule.namespace, rule.kind()).map_err(refused)?,
            rule.name
        )),
    }
}

/// What a node holds now, read for a write.
enum Held {
    Nothing,
    /// The object (if the body reads as one) and the version to check.
    Object(Option<RuleKey>, Vec<u8>, i32),
}

impl ZkRules {
    /// Called on the runtime (its handle is kept for the rules directory's reloads).
    pub fn new(session: Arc<Session>, catalog: Arc<Catalog>) -> Self {
        ZkRules {
            session,
            catalog,
            writing: tokio::sync::Mutex::new(()),
            dir_written: std::sync::Mutex::default(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    async fn client(&self) -> Result<Client, RuleError> {
        self.session
            .wait_client(SESSION_WAIT)
            .await
            .ok_or_else(|| RuleError::Unavailable("no session with the ensemble".to_owned()))
    }

    /// Reads what `path` holds, as the object it names.
    async fn held(client: &Client, path: &str) -> Result<Held, RuleError> {
        let (data, stat) = match client.get_data(path).await {
            Ok(read) => read,
            Err(Error::NoNode) => return Ok(Held::Nothing),
            Err(err) => return Err(RuleError::Unavailable(err.to_string())),
        };
        let key = match layout::classify(path) {
            layout::Node::Rule { namespace, name } => {
                crate::body::decode_rule(&namespace, &name, &data)
                    .map(|rule| rule.as_ref().map(key_of))
            }
            layout::Node::Ours {
                namespace,
                kind,
                name,
            } => crate::body::decode_ours(&namespace, kind, &name, &data)
                .map(|rule| Some(key_of(&rule))),
            _ => Ok(None),
        };
        match key {
            Ok(key) => Ok(Held::Object(key, data, stat.version)),
            Err(err) => Err(RuleError::Refused(format!(
                "{path} holds a body dubbo-cp cannot read ({err}); it is not overwritten: fix or \
                 delete the node first"
            ))),
        }
    }

    /// `dubbo-cp apply`: every document validated, then all written in one transaction.
    pub async fn apply(&self, manifests: &str) -> Result<Report, RuleError> {
        let rules = parse_manifests(manifests)?;
        let _writing = self.writing.lock().await;
        self.write(rules, Origin::Api).await
    }

    /// `--rules-dir`: writes `rules` (marked as the directory's), then, unless `keep_others`,
    /// deletes the objects the directory wrote before and no longer holds.
    pub async fn replace_dir(
        &self,
        rules: &[Rule],
        keep_others: bool,
    ) -> Result<Report, RuleError> {
        let _writing = self.writing.lock().await;
        let wanted: BTreeSet<RuleKey> = rules.iter().map(key_of).collect();
        let mut report = self.write(rules.to_vec(), Origin::Dir).await?;
        let written: BTreeMap<RuleKey, String> = {
            let mut written = self.dir_written.lock().unwrap_or_else(|e| e.into_inner());
            for rule in rules {
                if let Ok(path) = node_path(rule) {
                    written.insert(key_of(rule), path);
                }
            }
            written.clone()
        };
        if keep_others {
            return Ok(report);
        }
        // Candidates: what the directory wrote while this process ran, and every served object
        // (after a restart only their nodes' headers say which came from a directory).
        let mut candidates: BTreeSet<RuleKey> = written.keys().cloned().collect();
        for kind in crate::rules::RULE_KINDS {
            candidates.extend(self.catalog.list(kind, None).iter().map(key_of));
        }
        let client = self.client().await?;
        let mut doomed = Vec::new();
        for key in candidates.difference(&wanted) {
            let Some(path) = self
                .node_of(key, None)
                .or_else(|| written.get(key).cloned())
            else {
                continue;
            };
            match client.get_data(&path).await {
                Ok((data, _)) if crate::body::origin_of(&data) == Origin::Dir => {
                    doomed.push((key.clone(), path));
                }
                Ok(_) | Err(Error::NoNode) => {}
                Err(err) => return Err(RuleError::Unavailable(err.to_string())),
            }
        }
        let deleted = self.delete_at(&client, doomed.clone()).await?;
        let mut written = self.dir_written.lock().unwrap_or_else(|e| e.into_inner());
        for (key, _) in &doomed {
            written.remove(key);
        }
        report.deleted = deleted.deleted;
        Ok(report)
    }

    /// Writes `rules` in one transaction; the caller holds `writing`.
    async fn write(&self, rules: Vec<Rule>, origin: Origin) -> Result<Report, RuleError> {
        let mut nodes: BTreeMap<String, (Rule, Vec<u8>)> = BTreeMap::new();
        for rule in rules {
            let path = node_path(&rule).map_err(RuleError::Refused)?;
            let bytes = crate::body::encode(&rule, origin).map_err(RuleError::Refused)?;
            if let Some((other, _)) = nodes.get(&path) {
                return Err(RuleError::Refused(format!(
                    "{} and {} would both be stored at {path}: their keys name one node",
                    describe(&key_of(other)),
                    describe(&key_of(&rule))
                )));
            }
            nodes.insert(path, (rule, bytes));
        }
        let client = self.client().await?;
        for _ in 0..TRIES {
            let mut report = Report::default();
            let mut multi = client.new_multi_writer();
            let (options, parents) = (self.session.create_options(), self.session.parent_options());
            let mut checks = Vec::new();
            for (path, (rule, bytes)) in &nodes {
                let name = describe(&key_of(rule));
                // The object lives at another node (its key changed): that node goes in the
                // same transaction, or the SDKs would read both.
                let moved = self.moved_from(&client, rule, path, &nodes).await?;
                match Self::held(&client, path).await? {
                    Held::Nothing => {
                        if let Some(parent) = path.rsplit_once('/').map(|(parent, _)| parent) {
                            client
                                .mkdir(parent, &parents)
                                .await
                                .map_err(|err| RuleError::Unavailable(err.to_string()))?;
                        }
                        add(multi.add_create(path, bytes, &options))?;
                        match moved {
                            Some((old, version)) => {
                                add(multi.add_delete(&old, Some(version)))?;
                                report.configured.push(name);
                            }
                            None => report.created.push(name),
                        }
                    }
                    Held::Object(key, current, version) => {
                        if key.as_ref().is_some_and(|key| *key != key_of(rule)) {
                            let held = key.as_ref().map(describe).unwrap_or_default();
                            return Err(RuleError::Refused(format!(
                                "{path} holds {held}; {name} would replace it (their keys name \
                                 one node): delete {held} first or give {name} another key"
                            )));
                        }
                        if let Some((old, version)) = moved {
                            add(multi.add_delete(&old, Some(version)))?;
                        }
                        if current == *bytes {
                            report.unchanged.push(name);
                            // Checked all the same: the call is one state, read at one time.
                            checks.push((path.clone(), version));
                            continue;
                        }
                        add(multi.add_set_data(path, bytes, Some(version)))?;
                        report.configured.push(name);
                    }
                }
            }
            if report.created.is_empty() && report.configured.is_empty() {
                return Ok(report);
            }
            for (path, version) in &checks {
                add(multi.add_check_version(path, *version))?;
            }
            match multi.commit().await {
                Ok(_) => {
                    for _ in 0..report.created.len() + report.configured.len() {
                        ZkStats::count(&self.session.stats().rule_writes);
                    }
                    return Ok(report);
                }
                // A node changed (or appeared) since it was read: read everything again.
                Err(MultiWriteError::OperationFailed {
                    source: Error::BadVersion | Error::NodeExists | Error::NoNode,
                    ..
                }) => continue,
                Err(err) => return Err(RuleError::Unavailable(err.to_string())),
            }
        }
        Err(RuleError::Unavailable(
            "the rules' nodes kept changing while they were written; try again".to_owned(),
        ))
    }

    /// The node other than `path` that holds `rule`'s object now (the served rule's), with its
    /// version; None when there is none, or when this call writes that node too.
    async fn moved_from(
        &self,
        client: &Client,
        rule: &Rule,
        path: &str,
        nodes: &BTreeMap<String, (Rule, Vec<u8>)>,
    ) -> Result<Option<(String, i32)>, RuleError> {
        let key = key_of(rule);
        let Some(old) = self.node_of(&key, None) else {
            return Ok(None);
        };
        if old == path || nodes.contains_key(&old) {
            return Ok(None);
        }
        match Self::held(client, &old).await {
            Ok(Held::Object(Some(held), _, version)) if held == key => Ok(Some((old, version))),
            Ok(_) => Ok(None),
            // What cannot be read there is not this object.
            Err(RuleError::Refused(_)) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The node of the served object `key`, else of `given` (a manifest's, whose node is known
    /// before the watch has served it).
    fn node_of(&self, key: &RuleKey, given: Option<&Rule>) -> Option<String> {
        self.catalog
            .list(key.0, Some(&key.1))
            .into_iter()
            .find(|rule| rule.name == key.2)
            .as_ref()
            .or(given)
            .and_then(|rule| node_path(rule).ok())
    }

    /// `dubbo-cp delete -f`: the objects the manifests name.
    pub async fn delete_manifests(&self, manifests: &str) -> Result<Report, RuleError> {
        let rules = parse_manifests(manifests)?;
        self.delete_with(
            rules
                .iter()
                .map(|rule| (key_of(rule), Some(rule)))
                .collect(),
        )
        .await
    }

    /// Deletes the nodes holding `keys`, in one transaction.
    pub async fn delete(&self, keys: &[RuleKey]) -> Result<Report, RuleError> {
        self.delete_with(keys.iter().map(|key| (key.clone(), None)).collect())
            .await
    }

    async fn delete_with(&self, keys: Vec<(RuleKey, Option<&Rule>)>) -> Result<Report, RuleError> {
        let _writing = self.writing.lock().await;
        let client = self.client().await?;
        let mut report = Report::default();
        let mut found = Vec::new();
        for (key, given) in keys {
            // Where the served rule lives (a rule read from dubbo-admin's node has a derived
            // name, so the node is found from the rule, not from the name), else where the
            // manifest's would.
            match self.node_of(&key, given) {
                Some(path) => found.push((key, path)),
                None => report.not_found.push(describe(&key)),
            }
        }
        let deleted = self.delete_at(&client, found).await?;
        report.deleted = deleted.deleted;
        report.not_found.extend(deleted.not_found);
        Ok(report)
    }

    /// Deletes each node that holds its object, in one transaction; the caller holds `writing`.
    async fn delete_at(
        &self,
        client: &Client,
        found: Vec<(RuleKey, String)>,
    ) -> Result<Report, RuleError> {
        for _ in 0..TRIES {
            let mut report = Report::default();
            let mut multi = client.new_multi_writer();
            for (key, path) in &found {
                let name = describe(key);
                match Self::held(client, path).await {
                    Ok(Held::Object(Some(held), _, version)) if held == *key => {
                        add(multi.add_delete(path, Some(version)))?;
                        report.deleted.push(name);
                    }
                    Ok(_) => report.not_found.push(name),
                    Err(err) => return Err(err),
                }
            }
            if report.deleted.is_empty() {
                return Ok(report);
            }
            match multi.commit().await {
                Ok(_) => {
                    for _ in 0..report.deleted.len() {
                        ZkStats::count(&self.session.stats().rule_writes);
                    }
                    return Ok(report);
                }
                Err(MultiWriteError::OperationFailed {
                    source: Error::BadVersion | Error::NoNode,
                    ..
                }) => continue,
                Err(err) => return Err(RuleError::Unavailable(err.to_string())),
            }
        }
        Err(RuleError::Unavailable(
            "the rules' nodes kept changing while they were deleted; try again".to_owned(),
        ))
    }
}

impl crate::store::rules_dir::DirRules for ZkRules {
    fn replace_dir(&self, rules: &[Rule], keep_others: bool) -> Result<Report, String> {
        self.runtime
            .block_on(ZkRules::replace_dir(self, rules, keep_others))
            .map_err(|err| err.to_string())
    }
}

fn add(result: Result<(), Error>) -> Result<(), RuleError> {
    result.map_err(|err| RuleError::Refused(err.to_string()))
}
