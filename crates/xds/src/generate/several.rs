//! The routes of a name that means several services (an interface served by several
//! applications, an application with several services): calls split over their clusters, each
//! weighted by the sum of its endpoints' weights, as Dubbo balances over every provider of an
//! interface.
//!
//! Tag routing across them keeps Dubbo's `TagStateRouter` semantics over all the providers at
//! once: a tagged call goes to the endpoints of its tag in any of the services; only when none
//! has one does it fall back, to the endpoints in no tag of every service, and not at all when
//! the call or a rule forces the tag. Each application's TagRoute selects among its own
//! endpoints (Dubbo's consumer reads the rule of one provider application, the first it meets,
//! for all of them; docs/xds.md says why this differs). ConditionRoutes apply to a name that
//! means one service only.

use std::collections::BTreeSet;

use super::*;

/// What a call asks of each service.
#[derive(Clone, Copy)]
enum Want<'t> {
    /// Every endpoint (no service has tags).
    All,
    /// The endpoints of a tag, without fallback.
    Forced(&'t str),
    /// What a call tagged with a tag no service has endpoints of gets: the endpoints in no tag.
    Fallback(&'t str),
    /// What a call without a tag gets.
    Untagged,
}

/// One service's part of what a call wants: its (subset) cluster and the sum of its endpoints'
/// weights. None when it has no endpoint that takes calls.
fn share(target: Target<'_>, tagging: &Tagging<'_>, want: Want<'_>) -> Option<(String, u64)> {
    let subset = match want {
        Want::All => None,
        // Without a rule or a static tag, every endpoint is in no tag.
        Want::Forced(_) if !tagging.applies() => return None,
        _ if !tagging.applies() => None,
        Want::Forced(tag) if !tagging.tags().contains(tag) => return None,
        Want::Forced(tag) => Some(Subset::Forced(tag.to_owned())),
        // Only called when no service has endpoints of the tag, so the subset is the fallback;
        // a tag this service does not know routes as any other tag (the empty one).
        Want::Fallback(tag) => {
            let known = tagging.tags().contains(tag);
            Some(Subset::Tagged(if known { tag } else { "" }.to_owned()))
        }
        Want::Untagged => Some(Subset::Untagged),
    };
    let endpoints = match &subset {
        Some(subset) => tagging.endpoints_of(subset),
        None => target.service.endpoints.iter().collect(),
    };
    let total: u64 = endpoints.iter().map(|e| u64::from(e.weight)).sum();
    (total > 0).then(|| (subset_cluster_name(target, subset.as_ref()), total))
}

type Part<'a> = (Target<'a>, Tagging<'a>);

fn split(parts: &[Part<'_>], want: Want<'_>) -> Vec<(String, u64)> {
    parts
        .iter()
        .filter_map(|(target, tagging)| share(*target, tagging, want))
        .collect()
}

/// Where a call tagged `tag` goes: the tag's endpoints in every service; if no service has
/// any, the fallback, unless a rule forces the tag.
fn tagged(parts: &[Part<'_>], tag: &str) -> Vec<(String, u64)> {
    let found = split(parts, Want::Forced(tag));
    if !found.is_empty() || parts.iter().any(|(_, t)| t.forbids_fallback(tag)) {
        return found;
    }
    split(parts, Want::Fallback(tag))
}

/// A route over `shares` by weight; to `nowhere` (a cluster without endpoints: the call fails
/// `UNAVAILABLE`, where Dubbo says "no provider") when there is none.
fn route_over(shares: &[(String, u64)], nowhere: &str, headers: Vec<HeaderMatcher>) -> Route {
    match shares {
        [] => route_to(nowhere.to_owned(), headers),
        [(only, _)] => route_to(only.clone(), headers),
        several => {
            // Scaled together if the sum would not fit a u32.
            let divisor = several
                .iter()
                .map(|(_, total)| total)
                .sum::<u64>()
                .div_ceil(u64::from(u32::MAX))
                .max(1);
            let clusters = several
                .iter()
                .map(|(name, total)| ClusterWeight {
                    name: name.clone(),
                    weight: Some(UInt32Value {
                        value: u32::try_from((total / divisor).max(1)).unwrap_or(u32::MAX),
                    }),
                    ..Default::default()
                })
                .collect();
            let mut route = route_to(String::new(), headers);
            if let Some(route::Action::Route(action)) = route.action.as_mut() {
                action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
                    WeightedCluster {
                        clusters,
                        ..Default::default()
                    },
                ));
            }
            route
        }
    }
}

/// The route configuration of a name that means the services of `parts`, each with its tag
/// routing.
pub fn weighted_route_configuration(requested: &str, parts: &[Part<'_>]) -> RouteConfiguration {
    let Some((first, _)) = parts.first() else {
        return virtual_host_config(requested, Vec::new());
    };
    let Some((tagged_target, _)) = parts.iter().find(|(_, tagging)| tagging.applies()) else {
        let all = split(parts, Want::All);
        return virtual_host_config(
            requested,
            vec![route_over(&all, &cluster_name(*first), Vec::new())],
        );
    };
    // The forced subset of the empty tag has no endpoint, and its service's CDS answers it.
    let nowhere = subset_cluster_name(*tagged_target, Some(&Subset::Forced(String::new())));
    let tags: BTreeSet<&str> = parts.iter().flat_map(|(_, t)| t.tags()).collect();
    let mut routes = Vec::new();
    // As for one service: a tag forced, a tag, any other tag forced, any other tag, no tag.
    for tag in tags.into_iter().chain([""]) {
        let forced = split(parts, Want::Forced(tag));
        let reached = tagged(parts, tag);
        for header in TAG_HEADERS {
            let is_tagged = || match tag {
                "" => header_present(header),
                tag => header_is(header, tag, false),
            };
            for force in FORCE_HEADERS {
                let headers = vec![is_tagged(), header_is(force, "true", true)];
                routes.push(route_over(&forced, &nowhere, headers));
            }
            routes.push(route_over(&reached, &nowhere, vec![is_tagged()]));
        }
    }
    let untagged = split(parts, Want::Untagged);
    routes.push(route_over(&untagged, &nowhere, Vec::new()));
    virtual_host_config(requested, routes)
}
