//! Events on Canaries (`events.k8s.io/v1`). kube's `Recorder` folds every event of one reason
//! into the first one's note, so "failed check 1 of 5" would still read so at the fifth; here
//! the note is part of the key: a repeat of the same sentence becomes a series (count, last
//! seen), a new sentence a new Event. The cache of recent events is bounded.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};

/// Repeats within this window join the earlier Event's series (client-go uses six minutes).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Recent events remembered for series, across all Canaries.
const REMEMBERED: u64 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Normal => "Normal",
            Kind::Warning => "Warning",
        }
    }
}

/// (namespace, name, uid, reason, note).
type Key = (String, String, String, String, String);

#[derive(Clone)]
pub struct Events {
    client: kube::Client,
    instance: String,
    /// Event name and count of each recent (object, reason, note).
    recent: moka::sync::Cache<Key, (String, i32)>,
}

impl Events {
    pub fn new(client: kube::Client, instance: &str) -> Self {
        Events {
            client,
            instance: instance.to_owned(),
            recent: moka::sync::Cache::builder()
                .max_capacity(REMEMBERED)
                .time_to_live(SERIES_WINDOW)
                .build(),
        }
    }

    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        kind: Kind,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        // The API server refuses notes over 1 KiB.
        let note = &clip_to(note, 1000);
        let namespace = regarding.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let key = (
            namespace,
            regarding.name.clone().unwrap_or_default(),
            regarding.uid.clone().unwrap_or_default(),
            reason.to_owned(),
            note.to_owned(),
        );
        let now = Timestamp::now();
        if let Some((name, count)) = self.recent.get(&key) {
            let series = EventSeries {
                count: count + 1,
                last_observed_time: MicroTime(now),
            };
            let patch = serde_json::json!({"series": series});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.recent.insert(key, (name, count + 1));
                    return Ok(());
                }
                // Gone (expired by the API server): a new Event below.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or("canary"),
            now.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            action: Some("Reconcile".to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note.to_owned()),
            type_: Some(kind.as_str().to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some("dubbo.apache.org/canary".to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.recent.insert(key, (name, 1));
        Ok(())
    }
}

/// `text` cut to `bytes` on a character boundary, marked with an ellipsis.
pub fn clip_to(text: &str, bytes: usize) -> String {
    if text.len() <= bytes {
        return text.to_owned();
    }
    let mut end = bytes.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
