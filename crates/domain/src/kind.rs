//! The kinds of the discovery stream (wire.md §2): a leaf every stage names.

/// The kinds a discovery-stream client can subscribe to (wire.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ServiceNameMapping,
    TagRoute,
    ConditionRoute,
    DynamicConfig,
    AuthenticationPolicy,
    AuthorizationPolicy,
    /// Services and endpoints declared as a rule (Istio's ServiceEntry); served over xDS only.
    ServiceEntry,
    /// Services and endpoints a registry reports (Kubernetes Services with their EndpointSlices,
    /// providers registered in ZooKeeper): no rule, nothing to write, served over xDS only.
    Service,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::ServiceNameMapping,
        Kind::TagRoute,
        Kind::ConditionRoute,
        Kind::DynamicConfig,
        Kind::AuthenticationPolicy,
        Kind::AuthorizationPolicy,
        Kind::ServiceEntry,
        Kind::Service,
    ];

    /// The kinds the discovery stream serves (wire.md §2): every kind but ServiceEntry and
    /// Service, which no DDS client reads (xDS serves them as clusters and endpoints).
    pub const DISCOVERY: [Kind; 6] = [
        Kind::ServiceNameMapping,
        Kind::TagRoute,
        Kind::ConditionRoute,
        Kind::DynamicConfig,
        Kind::AuthenticationPolicy,
        Kind::AuthorizationPolicy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::ServiceNameMapping => "ServiceNameMapping",
            Kind::TagRoute => "TagRoute",
            Kind::ConditionRoute => "ConditionRoute",
            Kind::DynamicConfig => "DynamicConfig",
            Kind::AuthenticationPolicy => "AuthenticationPolicy",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::ServiceEntry => "ServiceEntry",
            Kind::Service => "Service",
        }
    }

    /// `<group>/<version>/<Kind>`, as clients put it in `ObserveRequest.type`.
    pub fn type_name(self) -> &'static str {
        match self {
            Kind::ServiceNameMapping => "dubbo.apache.org/v1alpha1/ServiceNameMapping",
            Kind::TagRoute => "dubbo.apache.org/v1alpha1/TagRoute",
            Kind::ConditionRoute => "dubbo.apache.org/v1alpha1/ConditionRoute",
            Kind::DynamicConfig => "dubbo.apache.org/v1alpha1/DynamicConfig",
            Kind::AuthenticationPolicy => "dubbo.apache.org/v1alpha1/AuthenticationPolicy",
            Kind::AuthorizationPolicy => "dubbo.apache.org/v1alpha1/AuthorizationPolicy",
            Kind::ServiceEntry => "dubbo.apache.org/v1alpha1/ServiceEntry",
            Kind::Service => "dubbo.apache.org/v1alpha1/Service",
        }
    }

    /// The discovery-stream kind `type_name` names (ServiceEntry is none).
    pub fn from_type_name(type_name: &str) -> Option<Kind> {
        Kind::DISCOVERY
            .into_iter()
            .find(|kind| kind.type_name() == type_name)
    }

    /// The kind named `name` exactly as in a manifest's `kind:` (`TagRoute`).
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The custom resource's plural (wire.md §3), as in `kubectl get tagroutes`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::ServiceNameMapping => "servicenamemappings",
            Kind::TagRoute => "tagroutes",
            Kind::ConditionRoute => "conditionroutes",
            Kind::DynamicConfig => "dynamicconfigs",
            Kind::AuthenticationPolicy => "authenticationpolicies",
            Kind::AuthorizationPolicy => "authorizationpolicies",
            Kind::ServiceEntry => "serviceentries",
            Kind::Service => "services",
        }
    }

    /// Position in [`Kind::ALL`].
    pub fn slot(self) -> usize {
        self as usize
    }
}
