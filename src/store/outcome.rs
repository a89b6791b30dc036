//! [`AddOutcome`]: what one item of an `add` did, as the facade answers it.

/// What one item of an `add` did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddOutcome {
    /// A new version was stored and is now the id's latest.
    Added {
        /// The item's id.
        id: String,
        /// The version stored.
        version: String,
        /// The sequence number of the batch that stored it.
        seq: u64,
    },
    /// This (id, version) was already stored with the same content hash: nothing was written.
    Unchanged {
        /// The item's id.
        id: String,
        /// The version.
        version: String,
    },
}
