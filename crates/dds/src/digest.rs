//! Replicas prove they agree: a digest per kind of the state a replica serves, a SHA-256 over
//! the sorted `(key, encoded object)` pairs, so equal digests mean byte-identical state. Served
//! at `/debug/digest` (with the revision it was computed at) and as a metric label;
//! `dubbo-cp status --compare` reads several replicas and says where they differ.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::encode::Encoder;
use crate::index::{Index, Kind};

pub use crate::encode::{object_digest, state_digest};

/// One kind's digest, as `/debug/digest` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindDigest {
    pub kind: String,
    pub revision: i64,
    pub objects: usize,
    pub digest: String,
    /// Per object (`<name>/<namespace>`), when asked for with `?objects=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_digests: Option<BTreeMap<String, String>>,
}

/// What `/debug/digest` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DigestView {
    /// The pod (`POD_NAME`) or host this replica runs as.
    pub replica: String,
    /// RFC 3339.
    pub computed_at: String,
    pub kinds: Vec<KindDigest>,
    /// The kinds served over xDS only (ServiceEntry, Service): their objects, revision and a
    /// digest of their domain values (they have no discovery-stream encoding to hash).
    #[serde(default)]
    pub xds_kinds: Vec<KindCount>,
    /// The CA's trusted roots by fingerprint, the active one first (empty: no CA). Filled by
    /// the admin port, which knows the CA.
    #[serde(default)]
    pub ca_roots: Vec<String>,
}

/// A kind's objects and revision, as `/debug/digest` shows the kinds it does not digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindCount {
    pub kind: String,
    pub revision: i64,
    pub objects: usize,
    /// SHA-256 over the sorted keys and each object's domain value as Rust prints it (every
    /// field of a service or ServiceEntry is ordered, so equal values print alike); empty from
    /// a replica older than this field.
    #[serde(default)]
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_digests: Option<BTreeMap<String, String>>,
}

/// Each object's domain value as printed, the bytes an xDS-only kind's digest is taken over.
fn printed(snapshot: &crate::index::KindSnapshot) -> Vec<(&str, Vec<u8>)> {
    snapshot
        .objects
        .iter()
        .map(|(key, object)| (key.as_str(), format!("{:?}", object.value).into_bytes()))
        .collect()
}

/// Every kind's digest at its current revision.
pub fn view(index: &Index, encoder: &Encoder, with_objects: bool) -> DigestView {
    let kinds = Kind::DISCOVERY
        .iter()
        .map(|kind| {
            let state = index.current(*kind);
            KindDigest {
                kind: kind.name().to_owned(),
                revision: state.revision,
                objects: state.objects.len(),
                digest: encoder.digest(&state),
                object_digests: with_objects.then(|| encoder.object_digests(&state)),
            }
        })
        .collect();
    let xds_kinds = Kind::ALL
        .iter()
        .filter(|kind| !Kind::DISCOVERY.contains(kind))
        .map(|kind| {
            let state = index.current(*kind);
            let printed = printed(&state);
            KindCount {
                kind: kind.name().to_owned(),
                revision: state.revision,
                objects: state.objects.len(),
                digest: state_digest(printed.iter().map(|(k, v)| (*k, v.as_slice()))),
                object_digests: with_objects.then(|| {
                    printed
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), object_digest(v)))
                        .collect()
                }),
            }
        })
        .collect();
    DigestView {
        replica: replica_name(),
        computed_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        kinds,
        xds_kinds,
        ca_roots: Vec::new(),
    }
}

fn replica_name() -> String {
    ["POD_NAME", "HOSTNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// How several replicas compare on one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindComparison {
    pub kind: String,
    pub agree: bool,
    /// Per replica (in the order given): revision and digest; `None` where it lacks the kind.
    pub states: Vec<Option<(i64, String)>>,
    /// Objects whose versions differ: key, then per replica its digest (`None`: missing).
    pub differing: Vec<(String, Vec<Option<String>>)>,
}

/// Every kind of a view with its digest, the xDS-only kinds included.
fn digested(view: &DigestView) -> Vec<KindDigest> {
    let xds = view.xds_kinds.iter().map(|k| KindDigest {
        kind: k.kind.clone(),
        revision: k.revision,
        objects: k.objects,
        digest: k.digest.clone(),
        object_digests: k.object_digests.clone(),
    });
    view.kinds.iter().cloned().chain(xds).collect()
}

/// Compares the views of several replicas kind by kind (ServiceEntry and Service too), naming
/// the objects that differ.
pub fn compare(replicas: &[DigestView]) -> Vec<KindComparison> {
    let all: Vec<Vec<KindDigest>> = replicas.iter().map(digested).collect();
    let kinds: BTreeSet<&str> = all
        .iter()
        .flat_map(|r| r.iter().map(|k| k.kind.as_str()))
        .collect();
    kinds
        .into_iter()
        .map(|kind| {
            let per: Vec<Option<&KindDigest>> = all
                .iter()
                .map(|r| r.iter().find(|k| k.kind == kind))
                .collect();
            let states: Vec<Option<(i64, String)>> = per
                .iter()
                .map(|k| k.map(|k| (k.revision, k.digest.clone())))
                .collect();
            let agree = states
                .iter()
                .all(|s| s.as_ref().map(|s| &s.1) == states[0].as_ref().map(|s| &s.1));
            let mut differing = Vec::new();
            if !agree {
                let empty = BTreeMap::new();
                let objects: Vec<&BTreeMap<String, String>> = per
                    .iter()
                    .map(|k| k.and_then(|k| k.object_digests.as_ref()).unwrap_or(&empty))
                    .collect();
                let keys: BTreeSet<&String> = objects.iter().flat_map(|o| o.keys()).collect();
                for key in keys {
                    let versions: Vec<Option<String>> =
                        objects.iter().map(|o| o.get(key).cloned()).collect();
                    if versions.iter().any(|v| v != &versions[0]) {
                        differing.push((key.clone(), versions));
                    }
                }
            }
            KindComparison {
                kind: kind.to_owned(),
                agree,
                states,
                differing,
            }
        })
        .collect()
}

/// `index_state_digest_info{kind, digest} 1`, computed at scrape time (once per revision), so
/// a dashboard or alert can compare replicas without calling each one.
pub struct DigestMetric(pub Arc<Index>, pub Arc<Encoder>);

impl std::fmt::Debug for DigestMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestMetric")
    }
}

impl Collector for DigestMetric {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(
            "index_state_digest_info",
            "Digest of each kind's served state (SHA-256 over sorted key and encoded object)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for kind in Kind::DISCOVERY {
            let state = self.0.current(kind);
            // No revision label: each would be a new series per change.
            let labels = [
                ("kind", kind.name().to_owned()),
                ("digest", self.1.digest(&state)),
            ];
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Change;

    use crate::index::test_value as any;

    #[test]
    fn equal_states_have_equal_digests_whatever_the_order_and_revision() {
        let a = Index::new(1);
        let b = Index::new(50);
        a.apply(
            Kind::TagRoute,
            [
                Change::Upsert("x/ns".into(), any(b"x")),
                Change::Upsert("y/ns".into(), any(b"y")),
            ],
            0,
        );
        b.apply(
            Kind::TagRoute,
            [Change::Upsert("y/ns".into(), any(b"y"))],
            0,
        );
        b.apply(
            Kind::TagRoute,
            [Change::Upsert("x/ns".into(), any(b"x"))],
            0,
        );
        let (va, vb) = (
            view(&a, &Encoder::default(), true),
            view(&b, &Encoder::default(), true),
        );
        assert!(compare(&[va, vb]).iter().all(|k| k.agree));

        // One object changed on one replica: only that kind and that object differ.
        b.apply(
            Kind::TagRoute,
            [Change::Upsert("y/ns".into(), any(b"y2"))],
            0,
        );
        b.apply(
            Kind::TagRoute,
            [Change::Upsert("z/ns".into(), any(b"z"))],
            0,
        );
        let report = compare(&[
            view(&a, &Encoder::default(), true),
            view(&b, &Encoder::default(), true),
        ]);
        let disagreeing: Vec<&KindComparison> = report.iter().filter(|k| !k.agree).collect();
        assert_eq!(disagreeing.len(), 1);
        assert_eq!(disagreeing[0].kind, "TagRoute");
        let keys: Vec<&str> = disagreeing[0]
            .differing
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, vec!["y/ns", "z/ns"]);
        assert!(
            disagreeing[0].differing[1].1[0].is_none(),
            "z is missing on a"
        );
    }

    #[test]
    fn the_digest_covers_keys_and_bytes() {
        let one = state_digest([("ab", b"c".as_slice())].into_iter());
        let other = state_digest([("a", b"bc".as_slice())].into_iter());
        assert_ne!(one, other);
        assert_eq!(one.len(), 64);
        assert_eq!(
            state_digest(std::iter::empty()),
            state_digest([].into_iter())
        );
    }
}
