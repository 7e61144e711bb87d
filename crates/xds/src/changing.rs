//! What the randomized tests of both stream kinds' quick answer share: load assignments that
//! change at random between versions, and the whole selection a stream would be answered from.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;

use crate::protocol::Selected;

/// Five names that exist at first and one that does not.
pub(crate) const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "missing"];

pub(crate) struct World {
    pub(crate) resources: BTreeMap<&'static str, Arc<Any>>,
    seed: u64,
}

fn any(value: &[u8]) -> Arc<Any> {
    Arc::new(Any {
        type_url: crate::ENDPOINT.into(),
        value: value.to_vec(),
    })
}

impl World {
    pub(crate) fn new(seed: u64) -> World {
        World {
            resources: NAMES[..5]
                .iter()
                .map(|name| (*name, any(format!("{name}0").as_bytes())))
                .collect(),
            seed,
        }
    }

    /// A number below `n` (xorshift: no crate for a test's randomness).
    pub(crate) fn next(&mut self, n: u64) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed % n
    }

    /// Every resource that exists, as a first answer selects them.
    pub(crate) fn all(&self) -> Selected {
        self.resources
            .iter()
            .map(|(name, any)| (name.to_string(), any.clone()))
            .collect()
    }

    /// Touches about a third of the names: new bytes, the same bytes anew, the very same
    /// encoding, gone, or back. Returns the names touched and whether each kept its encoding.
    pub(crate) fn change(&mut self, tag: &str) -> (Vec<&'static str>, bool) {
        let mut touched = Vec::new();
        let mut same_pointers = true;
        for name in NAMES {
            if self.next(3) != 0 {
                continue;
            }
            touched.push(name);
            match self.next(9) {
                0 => same_pointers &= self.resources.remove(name).is_none(),
                1..=2 => {
                    let same = self.resources.get(name).map(|a| a.value.clone());
                    self.resources.insert(name, any(&same.unwrap_or_default()));
                    same_pointers = false;
                }
                3..=4 => {}
                _ => {
                    self.resources
                        .insert(name, any(format!("{name}{tag}").as_bytes()));
                    same_pointers = false;
                }
            }
        }
        (touched, same_pointers)
    }

    /// The whole selection at a version following the last answer: the `touched` names looked
    /// up, the rest as the stream `held` them.
    pub(crate) fn selected(
        &self,
        touched: &[&str],
        held: impl Fn(&str) -> Option<Arc<Any>>,
    ) -> Selected {
        NAMES
            .iter()
            .filter_map(|name| {
                let any = match touched.contains(name) {
                    true => self.resources.get(name).cloned(),
                    false => held(name),
                }?;
                Some((name.to_string(), any))
            })
            .collect()
    }
}
