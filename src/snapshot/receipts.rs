//! What a snapshot can prove about its answers: [`Receipt`]s of its resolves, replayed later
//! through the pinned snapshot they came from, and the digest of everything it shows. Facade
//! layer, beside [`Snapshot`]: replay opens a pinned snapshot.

use std::sync::Arc;

use serde::Serialize;
use sha2::Digest;

use crate::engine::shared::Shared;
use crate::error::{Error, Result};
use crate::item::{canonical_json, format_hash};
use crate::read::answer::Resolution;
use crate::read::query::ContextQuery;
use crate::snapshot::Snapshot;

/// Proof of what a resolve answered: the snapshot and, for each reference, the (id, version, hash)
/// of the answer. [`crate::Store::replay`] turns it back into the identical answers while the
/// snapshot is pinned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Receipt {
    /// The snapshot's sequence number.
    pub seq: u64,
    /// The snapshot's clock time.
    pub taken_at: i64,
    /// The session the snapshot is restricted to, if any.
    pub session: Option<String>,
    /// One answer per reference, in order.
    pub answers: Vec<ReceiptAnswer>,
}

/// One answer of a [`Receipt`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ReceiptAnswer {
    /// The reference as given.
    pub reference: String,
    /// `found`, `not_found`, `expired`, `superseded` or `hash_mismatch`.
    pub status: String,
    /// The id answered (for `superseded`, the latest version's).
    pub id: Option<String>,
    /// The version answered.
    pub version: Option<String>,
    /// The hash of the content answered.
    pub hash: Option<String>,
}

impl ReceiptAnswer {
    /// The receipt's answer for `reference`, resolved as `resolution`.
    fn of(reference: &str, resolution: &Resolution) -> ReceiptAnswer {
        let (status, item, id) = match resolution {
            Resolution::Found(item) => ("found", Some(item), None),
            Resolution::NotFound { .. } => ("not_found", None, None),
            Resolution::Expired { id, .. } => ("expired", None, Some(id)),
            Resolution::Superseded { latest, .. } => ("superseded", Some(latest), None),
            Resolution::HashMismatch { id } => ("hash_mismatch", None, Some(id)),
        };
        ReceiptAnswer {
            reference: reference.to_owned(),
            status: status.to_owned(),
            id: item.map(|item| item.id.clone()).or_else(|| id.cloned()),
            version: item.map(|item| item.version.clone()),
            hash: item.and_then(|item| item.hash.clone()),
        }
    }
}

impl Snapshot {
    /// One SHA-256 over the canonical JSON of every item this snapshot shows, ordered by (id,
    /// version), each followed by a newline: `"sha256:" + 64 hex`. An auditor can check later that
    /// nothing the snapshot shows has changed.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn digest(&self) -> Result<String> {
        let mut items = self.get(&ContextQuery::new())?;
        items.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
        let mut hasher = sha2::Sha256::new();
        for item in &items {
            let value = serde_json::to_value(item).map_err(|e| Error::invalid("item", e.to_string()))?;
            hasher.update(canonical_json(&value));
            hasher.update(b"\n");
        }
        let digest: [u8; 32] = hasher.finalize().into();
        Ok(format_hash(&digest))
    }

    /// Resolves `refs` as [`Snapshot::resolve`] does, and returns a [`Receipt`] of the answers.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve_with_receipt<I, R>(&self, refs: I) -> Result<(Vec<Resolution>, Receipt)>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        let refs: Vec<String> = refs.into_iter().map(|r| r.as_ref().to_owned()).collect();
        let answers = self.resolve(&refs)?;
        let receipt = Receipt {
            seq: self.seq,
            taken_at: self.taken_at,
            session: self.session.as_deref().map(str::to_owned),
            answers: refs
                .iter()
                .zip(&answers)
                .map(|(r, a)| ReceiptAnswer::of(r, a))
                .collect(),
        };
        Ok((answers, receipt))
    }
}

/// Resolves a receipt's references again through the pinned snapshot it came from.
pub(crate) fn replay(shared: &Arc<Shared>, receipt: &Receipt) -> Result<Vec<Resolution>> {
    let name = shared
        .read_index()
        .pins
        .iter()
        .find(|(_, pin)| {
            pin.seq == receipt.seq
                && pin.taken_at == receipt.taken_at
                && pin.session.as_deref() == receipt.session.as_deref()
        })
        .map(|(name, _)| name.clone())
        .ok_or_else(|| Error::SnapshotNotFound {
            name: format!("(none pinned at seq {} taken at {})", receipt.seq, receipt.taken_at),
        })?;
    let snapshot = Snapshot::open_pinned(shared, &name)?;
    let answers = snapshot.resolve(receipt.answers.iter().map(|answer| answer.reference.as_str()))?;
    for (position, (expected, answer)) in receipt.answers.iter().zip(&answers).enumerate() {
        let found = ReceiptAnswer::of(&expected.reference, answer);
        if &found != expected {
            return Err(Error::ReceiptMismatch {
                position,
                expected: format!("{expected:?}"),
                found: format!("{found:?}"),
            });
        }
    }
    Ok(answers)
}
