//! ZooKeeper mode: the Dubbo fleet's own registry and config center as the source of truth,
//! shared by every replica started on the same ensemble.
//!
//! # Layout
//! - [`layout`]: where each object lives (Dubbo's paths) and what a znode path is.
//! - [`mapping_value`], [`body`]: the bytes of mapping nodes and rule nodes, as the SDKs read them.
//! - [`providers`]: provider URLs and application instances as the domain's services.
//! - [`session`]: the connection to the ensemble, re-established after a session expires.
//! - [`watch`]: one persistent recursive watch, re-listed after every reconnection, feeding the
//!   index, the [`view::ZkView`] (what the outbox need not write) and the services.
//! - [`writer`]: acknowledged pairs from the outbox, written with the znode version as the
//!   compare-and-swap ticket, as Dubbo Java's `MetadataServiceNameMapping` does.
//! - [`rules_writer`]: `dubbo-cp apply/delete` and the rules directory, written to their nodes.
//! - [`stats`]: what this crate counts, and the state `/debug/sources` shows.

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_debounce as debounce;
use dubbo_cp_domain::{mapping, rules, service};
use dubbo_cp_index as index;
use dubbo_cp_kit::{metrics, shutdown};
use dubbo_cp_store as store;

pub mod body;
pub mod config;
pub mod layout;
pub mod mapping_value;
pub mod providers;
pub mod rules_writer;
pub mod session;
mod state;
pub mod stats;
pub mod view;
pub mod watch;
pub mod writer;

pub use config::ZooKeeperConfig;
pub use rules_writer::ZkRules;
pub use session::Session;
pub use stats::ZkStats;
pub use view::ZkView;
pub use writer::ZkWriter;
