//! Maps values (type names, scopes, sources: low-cardinality strings) to dense small integers and
//! back ([`Interner`]).

use std::hash::Hash;

use super::FastMap;

/// Maps values to dense small integers and back.
#[derive(Debug, Clone)]
pub(crate) struct Interner<T> {
    // Rebuilt from `values` when a checkpoint is loaded.
    ids: FastMap<T, u32>,
    values: Vec<T>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            ids: FastMap::default(),
            values: Vec::new(),
        }
    }
}

impl<T: Hash + Eq + Clone> Interner<T> {
    pub(crate) fn intern(&mut self, value: &T) -> u32 {
        self.intern_by(value, || value.clone())
    }

    /// The number of the value equal to `key`, interning `make()` when there is none: nothing is
    /// allocated for a value already interned.
    pub(crate) fn intern_by<Q>(&mut self, key: &Q, make: impl FnOnce() -> T) -> u32
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(id) = self.ids.get(key) {
            return *id;
        }
        let value = make();
        // Types, scopes and sources are counted against limits::TYPES_MAX, SCOPES_MAX and
        // SOURCES_MAX before they are interned (a checkpoint's tables: at most a u32 count).
        let id = crate::num::bounded(self.values.len(), "interned value number");
        self.ids.insert(value.clone(), id);
        self.values.push(value);
        id
    }

    pub(crate) fn get<Q>(&self, value: &Q) -> Option<u32>
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.ids.get(value).copied()
    }

    pub(crate) fn value(&self, id: u32) -> Option<&T> {
        self.values.get(crate::num::usize_from_u32(id))
    }

    /// Every value, in the order of their ids.
    pub(crate) fn values(&self) -> &[T] {
        &self.values
    }

    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }
}
