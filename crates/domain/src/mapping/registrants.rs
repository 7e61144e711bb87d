//! Which pods registered each application of a mapping (Kubernetes mode), so an application
//! whose pods are all gone can leave it, and nothing else ever does.
//!
//! The record lives on the ServiceNameMapping object, in the annotation [`ANNOTATION`], written
//! by the same per-key writer as the applications (so replicas agree):
//! `{"app-a": ["pod-1/<uid>", "pod-2/<uid>"], "app-b": []}`. Per application:
//! - a list of pods: it may expire once none of them has existed for `mapping.expireAfter`;
//! - an empty list (*pinned*): it was registered without a pod identity (a static token, a
//!   certificate without a pod), or by more pods than one record holds; it never expires;
//! - absent: nothing is known (added by hand, or before this record existed); it never expires
//!   until a pod registers it.

use std::collections::{BTreeMap, BTreeSet};

/// The annotation on ServiceNameMapping objects that holds the record.
pub const ANNOTATION: &str = "dubbo.apache.org/registrants";
/// Pods one application's record holds; beyond it the application is pinned (never expires),
/// which keeps the annotation small and never drops a pod that may be the live one.
pub const MAX_PODS_PER_APPLICATION: usize = 100;
/// Bytes the whole record of one object may take (annotations share 256 KiB per object); past
/// it, the applications with the most pods are pinned until it fits.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// What a registration without a pod identity records (pod names are never empty).
pub const PODLESS: &str = "";

/// How a pod is recorded: `<name>/<uid>`, so a pod recreated under the same name (a
/// StatefulSet's `web-0`) is a different registrant that must be recorded, not a known one.
pub fn pod_entry(name: &str, uid: &str) -> String {
    if uid.is_empty() {
        // No UID known (a TokenReview that named only the pod): the name alone.
        name.to_owned()
    } else {
        format!("{name}/{uid}")
    }
}

/// A recorded pod's name and UID (`None` for an entry without one).
pub fn split_entry(entry: &str) -> (&str, Option<&str>) {
    match entry.split_once('/') {
        Some((name, uid)) if !uid.is_empty() => (name, Some(uid)),
        Some((name, _)) => (name, None),
        None => (entry, None),
    }
}

/// The pods of one application, as recorded on the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pods {
    /// Never expires on its own.
    Pinned,
    Tracked(BTreeSet<String>),
}

/// Per application its pods.
pub type Registrants = BTreeMap<String, Pods>;

/// Per key, what the watched objects record (the union over the objects holding the key).
pub type SharedRegistrants = dashmap::DashMap<crate::mapping::MappingKey, Registrants>;

/// What registrations asked to record per application, not yet on the object: pod names, or
/// [`PODLESS`].
pub type Pending = BTreeMap<String, BTreeSet<String>>;

/// The record in an annotation; `None` when it does not parse (then nothing expires).
pub fn parse(annotation: &str) -> Option<Registrants> {
    let raw: BTreeMap<String, Vec<String>> = serde_json::from_str(annotation).ok()?;
    Some(
        raw.into_iter()
            .map(|(app, pods)| {
                // A pod-less entry pins, as when it is merged.
                let podless = pods.iter().any(|p| p == PODLESS);
                let pods: BTreeSet<String> = pods.into_iter().collect();
                // A hand-edited record longer than any we write is pinned, not judged pod
                // by pod.
                let pods = if pods.is_empty() || podless || pods.len() > MAX_PODS_PER_APPLICATION {
                    Pods::Pinned
                } else {
                    Pods::Tracked(pods)
                };
                (app, pods)
            })
            .collect(),
    )
}

/// The annotation's value for `registrants`.
pub fn format(registrants: &Registrants) -> String {
    let raw: BTreeMap<&str, Vec<&str>> = registrants
        .iter()
        .map(|(app, pods)| {
            let pods = match pods {
                Pods::Pinned => Vec::new(),
                Pods::Tracked(pods) => pods.iter().map(String::as_str).collect(),
            };
            (app.as_str(), pods)
        })
        .collect();
    serde_json::to_string(&raw).unwrap_or_else(|_| "{}".into())
}

/// Whether `pod` registering `application` is already recorded (nothing to write): its pod is
/// listed, or the application is pinned.
pub fn is_recorded(registrants: Option<&Registrants>, application: &str, pod: &str) -> bool {
    match registrants.and_then(|r| r.get(application)) {
        Some(Pods::Pinned) => true,
        Some(Pods::Tracked(pods)) => pod != PODLESS && pods.contains(pod),
        None => false,
    }
}

/// Whether `pending` already records `pod` for `application`.
pub fn is_pending(pending: Option<&Pending>, application: &str, pod: &str) -> bool {
    pending
        .and_then(|p| p.get(application))
        .is_some_and(|pods| pods.contains(pod) || pods.contains(PODLESS))
}

/// Merges `pending` into `registrants`; returns whether anything changed. A pod-less
/// registration pins its application, and so does a record that would grow past
/// [`MAX_PODS_PER_APPLICATION`].
pub fn merge(registrants: &mut Registrants, pending: &Pending) -> bool {
    let mut changed = false;
    for (application, pods) in pending {
        let entry = registrants.get(application);
        let next = match entry {
            Some(Pods::Pinned) => continue,
            _ if pods.contains(PODLESS) => Pods::Pinned,
            Some(Pods::Tracked(known)) => {
                let mut all = known.clone();
                all.extend(pods.iter().cloned());
                if all.len() > MAX_PODS_PER_APPLICATION {
                    tracing::info!(
                        application,
                        pods = all.len(),
                        "more registering pods than one record holds; the application is pinned"
                    );
                    Pods::Pinned
                } else {
                    Pods::Tracked(all)
                }
            }
            None if pods.len() > MAX_PODS_PER_APPLICATION => Pods::Pinned,
            None => Pods::Tracked(pods.clone()),
        };
        if entry != Some(&next) {
            registrants.insert(application.clone(), next);
            changed = true;
        }
    }
    changed
}

/// Pins the applications with the most pods until the record fits [`MAX_RECORD_BYTES`].
pub fn fit(registrants: &mut Registrants) {
    while format(registrants).len() > MAX_RECORD_BYTES {
        let largest = registrants
            .iter()
            .filter_map(|(app, pods)| match pods {
                Pods::Tracked(pods) => Some((pods.len(), app.clone())),
                Pods::Pinned => None,
            })
            .max();
        let Some((_, app)) = largest else { return };
        tracing::info!(application = %app, "the registrant record is too large; the application is pinned");
        registrants.insert(app, Pods::Pinned);
    }
}

/// Adds `pod` (or [`PODLESS`]) for `application` to a pending record.
pub fn add_pending(pending: &mut Pending, application: &str, pod: &str) {
    pending
        .entry(application.to_owned())
        .or_default()
        .insert(pod.to_owned());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(entries: &[(&str, &str)]) -> Pending {
        let mut p = Pending::new();
        for (app, pod) in entries {
            add_pending(&mut p, app, pod);
        }
        p
    }

    #[test]
    fn the_annotation_round_trips_and_bad_json_is_none() {
        let text = r#"{"a":["p1","p2"],"b":[]}"#;
        let parsed = parse(text).unwrap();
        assert_eq!(
            parsed.get("a"),
            Some(&Pods::Tracked(["p1".into(), "p2".into()].into()))
        );
        assert_eq!(parsed.get("b"), Some(&Pods::Pinned));
        assert_eq!(format(&parsed), text);
        assert_eq!(parse(r#"{"a":["", "p1"]}"#).unwrap()["a"], Pods::Pinned);
        assert_eq!(pod_entry("web-0", ""), "web-0");
        assert_eq!(split_entry("web-0/"), ("web-0", None));
        assert_eq!(split_entry("web-0/u1"), ("web-0", Some("u1")));
        assert!(parse("not json").is_none());
        assert!(parse(r#"{"a": "p1"}"#).is_none());
    }

    #[test]
    fn pods_accumulate_podless_pins_and_pinned_stays_pinned() {
        let mut r = Registrants::new();
        assert!(merge(&mut r, &pending(&[("a", "p1")])));
        assert!(merge(&mut r, &pending(&[("a", "p2")])));
        assert!(!merge(&mut r, &pending(&[("a", "p2")])), "nothing new");
        assert_eq!(r["a"], Pods::Tracked(["p1".into(), "p2".into()].into()));
        assert!(is_recorded(Some(&r), "a", "p1"));
        assert!(!is_recorded(Some(&r), "a", "p3"));
        assert!(
            !is_recorded(Some(&r), "a", PODLESS),
            "a pod-less caller must pin it"
        );
        assert!(merge(&mut r, &pending(&[("a", PODLESS)])));
        assert_eq!(r["a"], Pods::Pinned);
        assert!(is_recorded(Some(&r), "a", "p9"));
        assert!(!merge(&mut r, &pending(&[("a", "p3")])));
        assert!(!is_recorded(None, "a", "p1"));
    }

    #[test]
    fn a_record_that_would_not_fit_pins_its_largest_applications() {
        let mut r = Registrants::new();
        for app in 0..20 {
            let pods: BTreeSet<String> = (0..90)
                .map(|i| pod_entry(&format!("pod-{i}"), "0123456789abcdef0123456789abcdef0123"))
                .collect();
            r.insert(format!("app-{app}"), Pods::Tracked(pods));
        }
        r.insert("small".into(), Pods::Tracked(["p/u".to_string()].into()));
        fit(&mut r);
        assert!(format(&r).len() <= MAX_RECORD_BYTES);
        assert!(matches!(r["small"], Pods::Tracked(_)));
        assert!(r.values().any(|p| *p == Pods::Pinned));
    }

    #[test]
    fn a_record_never_grows_past_its_bound() {
        let mut r = Registrants::new();
        let many: Vec<(String, String)> = (0..=MAX_PODS_PER_APPLICATION)
            .map(|i| ("a".to_owned(), format!("p{i}")))
            .collect();
        let refs: Vec<(&str, &str)> = many[..MAX_PODS_PER_APPLICATION]
            .iter()
            .map(|(a, p)| (a.as_str(), p.as_str()))
            .collect();
        merge(&mut r, &pending(&refs));
        assert!(matches!(&r["a"], Pods::Tracked(p) if p.len() == MAX_PODS_PER_APPLICATION));
        merge(&mut r, &pending(&[("a", "one-more")]));
        assert_eq!(r["a"], Pods::Pinned);
    }
}
