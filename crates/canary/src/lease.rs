//! Only one control plane drives Canaries: the holder of a `coordination.k8s.io/v1` Lease. The
//! others wait and take over when the holder releases it (on shutdown) or stops renewing it.
//! The mapping path stays leaderless; only the canary controller is behind this.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl Elector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// How often the holder renews, and how long one try may take: a quarter of the lease, so
    /// one try that times out (a renewal period of sleep and one of waiting) still leaves a
    /// period before the holder must stop, and a slow API server does not end its driving.
    pub fn renew_every(&self) -> Duration {
        self.duration / 4
    }

    /// Takes the lease if it is free, expired or already ours (renewing it); true when held.
    /// A lost race (409) is "not held", never an error.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let result = match self.api.get_opt(&self.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                let holder = spec.holder_identity.clone().unwrap_or_default();
                let ours = holder == self.identity;
                if !ours && !holder.is_empty() && !expired(spec) {
                    return Ok(false);
                }
                if !ours {
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(now);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up so another control plane takes over at once.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Whether the holder stopped renewing for longer than the lease lasts.
fn expired(spec: &LeaseSpec) -> bool {
    let Some(MicroTime(renewed)) = &spec.renew_time else {
        return true;
    };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    Timestamp::now().as_second() - renewed.as_second() > duration
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_after_its_duration_without_renewal() {
        let renewed = |seconds_ago: i64| LeaseSpec {
            renew_time: Some(MicroTime(
                Timestamp::from_second(Timestamp::now().as_second() - seconds_ago).unwrap(),
            )),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        };
        assert!(!expired(&renewed(5)));
        assert!(expired(&renewed(16)));
        assert!(expired(&LeaseSpec::default()));
    }
}
