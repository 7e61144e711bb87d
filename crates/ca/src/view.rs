//! The CA as operators read it: `dubbo-cp ca show` and the admin API's `/api/v1/ca`.

use std::time::SystemTime;

use super::{Authority, store};

/// A trusted root as `dubbo-cp ca show` prints it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RootView {
    /// `active` (issues) or `retiring` (trusted until what it issued has expired).
    pub state: &'static str,
    pub fingerprint: String,
    pub subject: String,
    pub not_before: String,
    pub not_after: String,
    /// Retiring roots: when they stop being trusted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop_after: Option<String>,
}

/// The CA as the admin API shows it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaView {
    /// Generated (and rotated) by the control plane; `false`: the operator's root.
    pub managed: bool,
    /// When the active root is replaced automatically, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotation_due: Option<String>,
    pub cert_validity: String,
    pub roots: Vec<RootView>,
    /// The trust domain certificates are issued in.
    pub trust_domain: String,
    /// PEM of every root a client should trust (`dubbo-cp ca root`), the active one first.
    pub trust_pems: Vec<String>,
}

impl Authority {
    /// `None` while the roots are not loaded.
    pub fn view(&self) -> Option<CaView> {
        let bundle = self.current()?;
        let time = |at: SystemTime| humantime::format_rfc3339_seconds(at).to_string();
        let active = bundle.signer.root();
        let drop_after = time(store::drop_time(active, self.settings.cert_validity));
        Some(CaView {
            managed: bundle.managed,
            rotation_due: (bundle.managed && self.settings.auto_rotate)
                .then(|| time(store::rotation_time(active))),
            cert_validity: humantime::format_duration(self.settings.cert_validity).to_string(),
            roots: bundle
                .trusted()
                .enumerate()
                .map(|(i, root)| RootView {
                    state: if i == 0 { "active" } else { "retiring" },
                    fingerprint: root.fingerprint.clone(),
                    subject: root.subject.clone(),
                    not_before: time(root.not_before),
                    not_after: time(root.not_after),
                    drop_after: (i > 0).then(|| drop_after.clone()),
                })
                .collect(),
            trust_domain: self.trust_domain.to_string(),
            trust_pems: bundle.trust_pems(),
        })
    }
}
