//! The size limits of rule specs, in one place. The CRD schemas take them (`maxLength`,
//! `maxItems`, `maxProperties`), so the API server enforces them and its CEL cost estimate stays
//! bounded; standalone `apply` enforces the same schema ([`super::schema`]), and docs/rules.md
//! lists the table generated from it (a test fails when the docs are stale).
//!
//! Chosen from what real Dubbo rules hold, with room: an interface name is at most 1,024 bytes
//! (registration's limit), so a service key or an address list entry fits in [`KEY`]; a tag or an
//! application name is a Kubernetes-style name ([`NAME`]); lists of instances are at most
//! [`INSTANCES`] (a canary writes one override per canary pod).

/// A rule's `key` (a service key `group/interface:version`, or an application), services,
/// principals, string-match values, parameter values.
pub const KEY: usize = 1024;
/// Tag names, application names, parameter and condition keys.
pub const NAME: usize = 253;
/// A `regex` string match (compiled by every client; see `common::regex`).
pub const REGEX: usize = 4096;
/// One condition of a ConditionRoute, in Dubbo's grammar.
pub const CONDITION: usize = 4096;
/// Addresses, applications, services of one entry; tags, conditions and configs of one rule.
pub const INSTANCES: usize = 1000;
/// Matchers in one list (tag `match`, `oneof`, `param`, condition values), selectors and rules of
/// a policy, per-port exceptions.
pub const MATCHERS: usize = 64;
/// Entries of a selector's list fields (namespaces, IP blocks, principals).
pub const SELECTOR_ENTRIES: usize = 256;
/// Parameters one DynamicConfig entry overrides.
pub const PARAMETERS: usize = 64;
/// `configVersion`, `scope`, `side`, `type`, actions: short enumerations.
pub const ENUM: usize = 16;
