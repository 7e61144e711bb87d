//! Acknowledged pairs from the outbox into mapping nodes, as Dubbo Java's
//! `MetadataServiceNameMapping` writes them: read the node and its version, append the missing
//! applications, and set it with that version as the compare-and-swap ticket (create it, with
//! its parents, when missing). A lost ticket (another replica or an SDK wrote meanwhile) is read
//! again at once; other failures wait a growing, jittered time. This is ZooKeeper mode's [`Sink`]
//! behind the outbox's per-key queue ([`crate::store::drain`]): pairs leave the outbox only once
//! their node lists them, so nothing acknowledged is lost, whatever the ensemble does.
//!
//! A node whose value cannot be read is never overwritten: its key is *parked* with the reason
//! (`/debug/outbox`, a log line) and tried again every `zookeeper.parkedRetryInterval`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Client, CreateOptions, Error};

use crate::mapping::MappingKey;
use crate::mapping::registrants::Pending;
use crate::session::Session;
use crate::stats::ZkStats;
use crate::store::drain::{Drain, Failure, Sink, jittered_backoff};

/// Tickets one attempt may lose in a row before it waits like any failure (Java's
/// `cas-retry-times` default).
const CAS_TRIES: u32 = 10;
/// The longest wait before a key is tried again after an error.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// ZooKeeper mode's writes of one key.
pub struct ZkWriter {
    session: Arc<Session>,
    stats: Arc<ZkStats>,
}

/// The queue of acknowledged pairs in front of the ensemble.
pub type ZkDrain = Drain<ZkWriter>;

/// The gauge of keys waiting in ZooKeeper mode's queue.
pub const QUEUE_GAUGE: (&str, &str) = (
    "zookeeper_write_queue_keys",
    "Keys with applications waiting to be written to ZooKeeper",
);

impl ZkWriter {
    /// The writer behind its queue.
    pub fn drain(
        session: Arc<Session>,
        max_parallel: usize,
        parked_retry: Duration,
    ) -> Arc<ZkDrain> {
        let writer = ZkWriter {
            stats: session.stats().clone(),
            session,
        };
        Arc::new(Drain::new(Arc::new(writer), max_parallel, parked_retry))
    }

    /// One attempt at a key (`failures` failed ones before it): up to [`CAS_TRIES`]
    /// read-append-write rounds.
    async fn attempt(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
        failures: u32,
    ) -> Result<(), Failure> {
        let path =
            crate::layout::mapping_path(key).map_err(|err| Failure::Permanent(err.to_string()))?;
        let Some(client) = self.session.client() else {
            return Err(Failure::Transient(backoff(failures)));
        };
        for _ in 0..CAS_TRIES {
            let options = (self.session.create_options(), self.session.parent_options());
            match cas_once(&client, &path, applications, &options).await {
                Ok(true) => {
                    ZkStats::count(&self.stats.writes);
                    return Ok(());
                }
                Ok(false) => {
                    ZkStats::count(&self.stats.unchanged);
                    return Ok(());
                }
                Err(Round::Lost) => {
                    ZkStats::count(&self.stats.conflicts);
                    // Between 10 and 20 ms, so rivals do not meet again at once.
                    let wait = Duration::from_millis(20);
                    tokio::time::sleep(jittered_backoff(0, wait, wait)).await;
                }
                Err(Round::Unreadable(reason)) => return Err(Failure::Permanent(reason)),
                Err(Round::Failed(err)) => {
                    ZkStats::count(&self.stats.retries);
                    self.stats.error(format!("write {path}: {err}"));
                    return Err(match err {
                        Error::NoAuth | Error::InvalidAcl | Error::BadArguments(_) => {
                            Failure::Permanent(format!("{path}: {err}"))
                        }
                        _ => Failure::Transient(backoff(failures)),
                    });
                }
            }
        }
        Err(Failure::Transient(backoff(failures)))
    }
}

impl Sink for ZkWriter {
    fn write(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
        // ZooKeeper keeps no pods: a node that lists the application is all there is to write.
        _registrants: &Pending,
        failures: u32,
    ) -> impl std::future::Future<Output = Result<(), Failure>> + Send {
        self.attempt(key, applications, failures)
    }
}

/// How one read-append-write round ended, when it did not land.
enum Round {
    /// The ticket was lost: read again.
    Lost,
    Unreadable(String),
    Failed(Error),
}

/// One round; true when it wrote, false when every application was listed already.
async fn cas_once(
    client: &Client,
    path: &str,
    applications: &BTreeSet<String>,
    (options, parents): &(CreateOptions<'_>, CreateOptions<'_>),
) -> Result<bool, Round> {
    match client.get_data(path).await {
        Ok((data, stat)) => {
            if let Err(err) = crate::mapping_value::parse(&data) {
                return Err(Round::Unreadable(format!(
                    "{path}: the value {err}; it is not overwritten (fix or delete the node)"
                )));
            }
            let current = String::from_utf8_lossy(&data);
            let Some(next) = crate::mapping_value::append(&current, applications) else {
                return Ok(false);
            };
            if next.len() > crate::mapping_value::MAX_VALUE_BYTES {
                return Err(Round::Unreadable(format!(
                    "{path}: appending would make the value {} bytes, over the {}-byte limit \
                     its readers keep to",
                    next.len(),
                    crate::mapping_value::MAX_VALUE_BYTES
                )));
            }
            match client
                .set_data(path, next.as_bytes(), Some(stat.version))
                .await
            {
                Ok(_) => Ok(true),
                Err(Error::BadVersion | Error::NoNode) => Err(Round::Lost),
                Err(err) => Err(Round::Failed(err)),
            }
        }
        Err(Error::NoNode) => {
            let Some(value) = crate::mapping_value::append("", applications) else {
                return Ok(false);
            };
            if let Some((parent, _)) = path.rsplit_once('/')
                && let Err(err) = client.mkdir(parent, parents).await
            {
                return Err(Round::Failed(err));
            }
            match client.create(path, value.as_bytes(), options).await {
                Ok(_) => Ok(true),
                Err(Error::NodeExists) => Err(Round::Lost),
                Err(err) => Err(Round::Failed(err)),
            }
        }
        Err(err) => Err(Round::Failed(err)),
    }
}

/// 100 ms doubling per failure up to [`MAX_BACKOFF`], jittered.
fn backoff(failures: u32) -> Duration {
    jittered_backoff(failures, Duration::from_millis(100), MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(0) >= Duration::from_millis(50));
        assert!(backoff(0) <= Duration::from_millis(100));
        assert!(backoff(30) <= MAX_BACKOFF);
        assert!(backoff(30) >= MAX_BACKOFF / 2);
    }
}
