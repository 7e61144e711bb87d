//! A small type-keyed cache attached to a value, so each reader of the index (a protocol edge)
//! can keep what it derived from a state or an object beside it, without the index knowing the
//! reader: computed once, dropped with the value.

use std::any::Any;
use std::sync::{Arc, Mutex};

/// At most one value per type; the number of types is fixed by the code, so it stays small.
#[derive(Default)]
pub struct Memo(Mutex<Vec<Arc<dyn Any + Send + Sync>>>);

impl Memo {
    /// The value of type `T`, computed by `init` on first use. Concurrent callers wait for the
    /// first: a derivation is computed once.
    pub fn get_or_init<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        let mut values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for value in values.iter() {
            if let Ok(found) = value.clone().downcast::<T>() {
                return found;
            }
        }
        let value = Arc::new(init());
        values.push(value.clone());
        value
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computes_once_per_type() {
        let memo = Memo::default();
        let mut calls = 0;
        assert_eq!(
            *memo.get_or_init(|| {
                calls += 1;
                7u32
            }),
            7
        );
        assert_eq!(
            *memo.get_or_init(|| {
                calls += 1;
                8u32
            }),
            7
        );
        assert_eq!(*memo.get_or_init(|| "other"), "other");
        assert_eq!(calls, 1);
    }
}
