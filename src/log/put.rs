//! A put record prepared on the adding thread: an item checked (see [`check_item`]) and encoded
//! whole, so that the writer thread only copies it into its batch's frame.

use crate::error::Result;
use crate::item::{check_item, ContextItem, TypeRegistry};
use crate::log::record::{encode_put, PutRef};

/// An item that passed validation, with its canonical content bytes and hash computed.
#[derive(Clone, Debug)]
pub(crate) struct ValidItem {
    /// The item as given (a missing `hash` is not filled in: `hash` below is the one stored, and
    /// the records and answers are built from it). Its content also lives, canonical and perhaps compressed,
    /// in `record`: for a small batch `Store::add` takes the tree out before the batch goes to the
    /// writer thread and frees it on the calling thread while the batch is written; a large batch
    /// keeps it here, and the store's free thread frees it with the rest once the batch is answered
    /// (see `store::Garbage`). (Freeing it on the validating
    /// threads, measured, slowed bulk loads by a third: the frees contend for the allocator's arena
    /// with the thread that allocated it.)
    pub(crate) item: ContextItem,
    /// The SHA-256 of the canonical content.
    pub(crate) hash: [u8; 32],
    /// The item's whole put record (content compressed when that pays), encoded on the adding
    /// thread so that the writer thread only copies it into the frame.
    pub(crate) record: Vec<u8>,
    /// `Some(n)` when the id was looked up once the item was checked, and the index, then holding
    /// `n` ids, did not know it: while the index still holds `n` ids (it never forgets an id's
    /// name), it knows no version of this id, and the writer thread need not look again. A large
    /// batch's ids are looked up on its validating threads, beside each other, rather than one
    /// after the other on the writer thread (`store::note_unknown_ids`).
    pub(crate) unknown_among: Option<usize>,
}

/// Checks every rule of an item (see [`check_item`]), computes its canonical content and hash, and
/// encodes its put record (content compressed when `compress` and that pays). Errors carry
/// `index: None`; the caller adds the batch position.
///
/// # Errors
///
/// As [`check_item`].
pub(crate) fn validate_item(
    item: ContextItem,
    registry: &TypeRegistry,
    max_content_bytes: usize,
    compress: bool,
) -> Result<ValidItem> {
    let (canonical, hash) = check_item(&item, registry, max_content_bytes)?;
    let record = encode_put(&PutRef {
        id: &item.id,
        kind: &item.kind,
        version: &item.version,
        scope: &item.scope,
        source: &item.source,
        timestamp: item.timestamp,
        ttl_seconds: item.ttl_seconds,
        confidence: item.confidence,
        hash: &hash,
        content: &canonical,
        compress,
    });
    Ok(ValidItem {
        item,
        hash,
        record,
        unknown_among: None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::item::content_hash;
    use crate::item::test_support::item;
    use crate::limits;

    fn validate(item: ContextItem) -> Result<ValidItem> {
        validate_item(item, &TypeRegistry::default(), limits::CONTENT_BYTES_DEFAULT, true)
    }

    #[test]
    fn valid_item_hashes_its_content() {
        let v = validate(item().with_ttl(5)).expect("valid");
        let canonical = br#"{"text":"hello"}"#;
        assert_eq!(v.hash, content_hash(canonical));
        // Too short to compress: the canonical bytes are in the record as they are.
        assert!(v.record.windows(canonical.len()).any(|w| w == canonical));
        // The record carries the hash computed for the item, which declared none.
        match crate::log::record::decode_record(&v.record) {
            Ok(crate::log::record::RecordView::Put(put)) => assert_eq!(put.hash, v.hash),
            _ => panic!("not a put record"),
        }
        assert_eq!(v.item.expires_at(), Some(1_715_299_205));
    }

    #[test]
    fn long_content_is_compressed_only_when_asked() {
        let text = "repeating words, ".repeat(20);
        let mut long = item();
        long.content = json!({ "text": text });
        let canonical = crate::canonical_json(&long.content);
        let plain = validate_item(
            long.clone(),
            &TypeRegistry::default(),
            limits::CONTENT_BYTES_DEFAULT,
            false,
        )
        .expect("valid");
        let packed = validate_item(long, &TypeRegistry::default(), limits::CONTENT_BYTES_DEFAULT, true).expect("valid");
        assert!(plain.record.windows(canonical.len()).any(|w| w == canonical));
        assert!(!packed.record.windows(canonical.len()).any(|w| w == canonical));
        assert!(
            packed.record.len() < plain.record.len() / 2,
            "{} bytes",
            packed.record.len()
        );
        assert_eq!(plain.hash, packed.hash);
        // Either record decodes to the same canonical content.
        for record in [&plain.record, &packed.record] {
            match crate::log::record::decode_record(record) {
                Ok(crate::log::record::RecordView::Put(put)) => {
                    let mut out = Vec::new();
                    put.append_content(&mut out).expect("content");
                    assert_eq!(out, canonical);
                }
                _ => panic!("not a put record"),
            }
        }
    }
}
