//! Traffic rules as the control plane understands them: TagRoute, ConditionRoute, DynamicConfig,
//! AuthenticationPolicy and AuthorizationPolicy (wire.md §2-3). No I/O here.

pub mod cidr;
pub mod condition;
