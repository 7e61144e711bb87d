//! The rule kinds as the discovery stream sends them: each spec's `<Kind>ToClient` message
//! (wire.md §2). Auth policies go without their selectors and their rules' `to`.

use prost::Message;
use prost_types::Any;

use crate::pb::rules as pb;
use dubbo_cp_domain::rules::*;

/// The `<Kind>ToClient` message of `spec` with `key`, packed as `Any` with [`crate::pb::type_url`].
pub fn to_any(spec: &RuleSpec, client_key: &str) -> Any {
    let value = match spec {
        RuleSpec::TagRoute(spec) => spec.to_client(client_key).encode_to_vec(),
        RuleSpec::ConditionRoute(spec) => spec.to_client(client_key).encode_to_vec(),
        RuleSpec::DynamicConfig(spec) => spec.to_client(client_key).encode_to_vec(),
        RuleSpec::AuthenticationPolicy(spec) => spec.to_client(client_key).encode_to_vec(),
        RuleSpec::AuthorizationPolicy(spec) => spec.to_client(client_key).encode_to_vec(),
        // The discovery stream has no message for it and never subscribes to it
        // (`Kind::DISCOVERY`); xDS serves it.
        RuleSpec::ServiceEntry(_) => Vec::new(),
    };
    Any {
        type_url: crate::pb::type_url(spec.kind()).to_owned(),
        value,
    }
}

/// A spec's message, with object key `key`.
pub trait ToClient {
    type Message;
    fn to_client(&self, key: &str) -> Self::Message;
}

/// A part of a spec as its message.
pub trait ToPb {
    type Message;
    fn to_pb(&self) -> Self::Message;
}

/// A policy selector as an authorization policy's source.
pub trait ToAuthorizationSource {
    type Message;
    fn to_authorization_source(&self) -> Self::Message;
}

impl ToClient for TagRouteSpec {
    type Message = pb::TagRouteToClient;

    /// The `TagRouteToClient` message a client receives, with object key `key`.
    fn to_client(&self, key: &str) -> pb::TagRouteToClient {
        pb::TagRouteToClient {
            key: key.to_owned(),
            spec: Some(pb::TagRoute {
                priority: self.priority,
                enabled: self.enabled,
                runtime: self.runtime,
                key: self.key.clone(),
                config_version: self.config_version.clone(),
                force: self.force,
                tags: self
                    .tags
                    .iter()
                    .map(|tag| pb::Tag {
                        name: tag.name.clone(),
                        addresses: tag.addresses.clone(),
                        r#match: tag.r#match.iter().map(ParamMatch::to_pb).collect(),
                    })
                    .collect(),
            }),
        }
    }
}

impl ToClient for ConditionRouteSpec {
    type Message = pb::ConditionRouteToClient;

    /// The `ConditionRouteToClient` message a client receives, with object key `key`.
    fn to_client(&self, key: &str) -> pb::ConditionRouteToClient {
        pb::ConditionRouteToClient {
            key: key.to_owned(),
            spec: Some(pb::ConditionRoute {
                priority: self.priority,
                enabled: self.enabled,
                force: self.force,
                runtime: self.runtime,
                key: self.key.clone(),
                scope: self.scope.clone(),
                conditions: self.conditions.clone(),
                config_version: self.config_version.clone(),
            }),
        }
    }
}

impl ToClient for DynamicConfigSpec {
    type Message = pb::DynamicConfigToClient;

    /// The `DynamicConfigToClient` message a client receives, with object key `key`.
    fn to_client(&self, key: &str) -> pb::DynamicConfigToClient {
        pb::DynamicConfigToClient {
            key: key.to_owned(),
            spec: Some(pb::DynamicConfig {
                key: self.key.clone(),
                scope: self.scope.clone(),
                config_version: self.config_version.clone(),
                enabled: self.enabled,
                configs: self.configs.iter().map(OverrideConfig::to_pb).collect(),
            }),
        }
    }
}

impl ToPb for OverrideConfig {
    type Message = pb::OverrideConfig;

    fn to_pb(&self) -> pb::OverrideConfig {
        pb::OverrideConfig {
            side: self.side.clone(),
            addresses: self.addresses.clone(),
            provider_addresses: self.provider_addresses.clone(),
            parameters: self.parameters.clone(),
            applications: self.applications.clone(),
            services: self.services.clone(),
            r#type: self.r#type.clone(),
            enabled: self.enabled,
            r#match: self.r#match.as_ref().map(ConditionMatch::to_pb),
        }
    }
}

impl ToClient for AuthenticationPolicySpec {
    type Message = pb::AuthenticationPolicyToClient;

    /// What a client receives: the action and the ports, never the selectors (the control plane
    /// has already applied them).
    fn to_client(&self, key: &str) -> pb::AuthenticationPolicyToClient {
        pb::AuthenticationPolicyToClient {
            key: key.to_owned(),
            spec: Some(pb::AuthenticationSpecToClient {
                action: self.action.clone(),
                port_level: self
                    .port_level
                    .iter()
                    .map(|level| pb::AuthenticationPolicyPortLevel {
                        port: level.port,
                        action: level.action.clone(),
                    })
                    .collect(),
            }),
        }
    }
}

impl ToClient for AuthorizationPolicySpec {
    type Message = pb::AuthorizationPolicyToClient;

    /// What a client receives: every rule without its `to` (the control plane has already
    /// applied it).
    fn to_client(&self, key: &str) -> pb::AuthorizationPolicyToClient {
        pb::AuthorizationPolicyToClient {
            key: key.to_owned(),
            spec: Some(pb::AuthorizationPolicySpecToClient {
                action: self.action.clone(),
                rules: self
                    .rules
                    .iter()
                    .map(|rule| pb::AuthorizationPolicyRuleToClient {
                        from: rule
                            .from
                            .as_ref()
                            .map(PolicySelector::to_authorization_source),
                        when: rule.when.as_ref().map(Condition::to_pb),
                    })
                    .collect(),
                samples: self.samples,
                order: self.order,
                match_type: self.match_type.clone(),
            }),
        }
    }
}

impl ToPb for Condition {
    type Message = pb::AuthorizationPolicyCondition;

    fn to_pb(&self) -> pb::AuthorizationPolicyCondition {
        let to_pb = |m: &Match| pb::AuthorizationPolicyMatch {
            r#type: m.r#type.clone(),
            value: m.value.clone(),
        };
        pb::AuthorizationPolicyCondition {
            key: self.key.clone(),
            values: self.values.iter().map(to_pb).collect(),
            not_values: self.not_values.iter().map(to_pb).collect(),
        }
    }
}

impl ToPb for StringMatch {
    type Message = pb::StringMatch;

    fn to_pb(&self) -> pb::StringMatch {
        pb::StringMatch {
            exact: self.exact.clone(),
            prefix: self.prefix.clone(),
            regex: self.regex.clone(),
            noempty: self.noempty.clone(),
            empty: self.empty.clone(),
            wildcard: self.wildcard.clone(),
        }
    }
}

impl ToPb for ParamMatch {
    type Message = pb::ParamMatch;

    fn to_pb(&self) -> pb::ParamMatch {
        pb::ParamMatch {
            key: self.key.clone(),
            value: Some(self.value.to_pb()),
        }
    }
}

impl ToPb for AddressMatch {
    type Message = pb::AddressMatch;

    fn to_pb(&self) -> pb::AddressMatch {
        pb::AddressMatch {
            wildcard: self.wildcard.clone(),
            cird: self.cird.clone(),
            exact: self.exact.clone(),
        }
    }
}

impl ToPb for ListStringMatch {
    type Message = pb::ListStringMatch;

    fn to_pb(&self) -> pb::ListStringMatch {
        pb::ListStringMatch {
            oneof: self.oneof.iter().map(StringMatch::to_pb).collect(),
        }
    }
}

impl ToPb for ConditionMatch {
    type Message = pb::ConditionMatch;

    fn to_pb(&self) -> pb::ConditionMatch {
        pb::ConditionMatch {
            address: self.address.as_ref().map(AddressMatch::to_pb),
            service: self.service.as_ref().map(ListStringMatch::to_pb),
            application: self.application.as_ref().map(ListStringMatch::to_pb),
            param: self.param.iter().map(ParamMatch::to_pb).collect(),
        }
    }
}

impl ToAuthorizationSource for PolicySelector {
    type Message = pb::AuthorizationPolicySource;

    fn to_authorization_source(&self) -> pb::AuthorizationPolicySource {
        pb::AuthorizationPolicySource {
            namespaces: self.namespaces.clone(),
            not_namespaces: self.not_namespaces.clone(),
            ip_blocks: self.ip_blocks.clone(),
            not_ip_blocks: self.not_ip_blocks.clone(),
            principals: self.principals.clone(),
            not_principals: self.not_principals.clone(),
            extends: self.extends.iter().map(authorization_extend).collect(),
            not_extends: self.not_extends.iter().map(authorization_extend).collect(),
        }
    }
}

fn authorization_extend(e: &PolicyExtend) -> pb::AuthorizationPolicyExtend {
    pb::AuthorizationPolicyExtend {
        key: e.key.clone(),
        value: e.value.clone(),
    }
}
