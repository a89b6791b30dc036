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
        let id = u32::try_from(self.values.len()).unwrap_or(u32::MAX);
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
        self.values.get(usize::try_from(id).ok()?)
    }

    /// Every value, in the order of their ids.
    pub(crate) fn values(&self) -> &[T] {
        &self.values
    }

    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }
}
