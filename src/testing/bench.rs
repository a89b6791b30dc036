//! Internal hot paths, one at a time, for `bench/benches/hot_paths.rs`: a batch frame's encoding and
//! decoding, and the index insert a batch's publication makes, each without the rest of an `add`
//! around it; and a checkpoint on demand, for the profiling drivers in `bench/examples/` and
//! `tests/checkpoints.rs`. Not part of the API (hidden from the docs); the public paths are
//! benchmarked through `Store`.

use crate::engine::recovery::location_of;
use crate::error::{Error, Result};
use crate::index::{Index, Location};
use crate::item::{ContextItem, TypeRegistry};
use crate::limits::CONTENT_BYTES_DEFAULT;
use crate::log::put::validate_item;
use crate::log::record::{decode_batch, read_frame, BatchEncoder, PutView, RecordView};
use crate::store::Store;

/// Writes a checkpoint of `store` now, as its maintenance thread does once enough log has been
/// written: the index encoded under its read lock, the log synced, the file written and synced,
/// renamed. Returns the checkpoint's sequence number.
///
/// # Errors
/// As the maintenance thread's checkpoint: `Io`, or `Poisoned`.
pub fn checkpoint(store: &Store) -> Result<u64> {
    store.checkpoint_now()
}

/// Put records of items, encoded as the adding threads encode them: validated, hashed, content
/// canonical, and compressed when asked and that pays.
pub struct PutRecords {
    records: Vec<Vec<u8>>,
}

impl PutRecords {
    /// Validates and encodes `items` (of the built-in types), their content compressed if
    /// `compress` (as `Options::compress_content`).
    ///
    /// # Errors
    /// The first item that fails validation, as `Store::add` would refuse it.
    pub fn encode(items: impl IntoIterator<Item = ContextItem>, compress: bool) -> Result<PutRecords> {
        let registry = TypeRegistry::default();
        let records = items
            .into_iter()
            .enumerate()
            .map(|(position, item)| {
                validate_item(item, &registry, CONTENT_BYTES_DEFAULT, compress)
                    .map(|valid| valid.record)
                    .map_err(|e| e.at(position))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PutRecords { records })
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The batch frame of every record with sequence number `seq`: header, sync mark, the records
    /// copied in, and the frame's CRC, as the writer builds it.
    ///
    /// # Errors
    /// `TooLarge` when the records exceed a frame.
    pub fn frame(&self, seq: u64) -> Result<Vec<u8>> {
        let mut encoder = BatchEncoder::new();
        for record in &self.records {
            encoder.push_encoded(record);
        }
        encoder.finish(seq)
    }
}

/// Checks the frame at the start of `bytes` and decodes every record in it (views into the bytes,
/// no item built); returns the number of records, 0 when the frame is refused.
pub fn decode_frame_records(bytes: &[u8]) -> usize {
    read_frame(bytes)
        .ok()
        .and_then(|(_, payload)| decode_batch(payload).ok())
        .map_or(0, |records| records.len())
}

/// The puts of one frame, decoded once, ready to be inserted into an index again and again.
pub struct IndexInput<'a> {
    seq: u64,
    puts: Vec<(PutView<'a>, Location)>,
}

impl<'a> IndexInput<'a> {
    /// Decodes the puts of the frame at the start of `frame` (segment 1, the frame at offset 0).
    ///
    /// # Errors
    /// `Corrupt` when the frame or a record in it is refused.
    pub fn decode(frame: &'a [u8]) -> Result<IndexInput<'a>> {
        let corrupt = |reason: String| Error::Corrupt {
            file: "frame".into(),
            offset: 0,
            reason,
        };
        let (header, payload) = read_frame(frame).map_err(|e| corrupt(format!("{e:?}")))?;
        let mut puts = Vec::new();
        for (start, len, record) in decode_batch(payload).map_err(|e| corrupt(e.0))? {
            if let RecordView::Put(put) = record {
                puts.push((put, location_of(1, 0, payload, start, len).map_err(corrupt)?));
            }
        }
        Ok(IndexInput { seq: header.seq, puts })
    }

    /// How many puts there are.
    pub fn len(&self) -> usize {
        self.puts.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.puts.is_empty()
    }

    /// Inserts every put into a fresh index, as publishing the batch does (id lookup, version
    /// entry, the type, scope and time sets); returns the index's estimated bytes.
    pub fn insert_into_fresh_index(&self) -> u64 {
        let mut index = Index::default();
        for (put, location) in &self.puts {
            index.apply_put(self.seq, put, *location);
        }
        index.estimated_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::Scope;

    fn items(n: usize) -> Vec<ContextItem> {
        (0..n)
            .map(|k| {
                ContextItem::new(
                    format!("item-{k:08}"),
                    "message",
                    serde_json::json!({"k": k, "text": "words ".repeat(40)}),
                    "src",
                    1_700_000_000 + k as i64,
                    "1",
                    Scope::GlobalReadonly,
                )
            })
            .collect()
    }

    #[test]
    fn a_frame_of_records_decodes_back_and_inserts_every_put() {
        let records = PutRecords::encode(items(300), true).expect("valid items");
        assert_eq!(records.len(), 300);
        let frame = records.frame(7).expect("frame");
        // The sync mark, then the 300 puts.
        assert_eq!(decode_frame_records(&frame), 301);
        let input = IndexInput::decode(&frame).expect("decode");
        assert_eq!(input.len(), 300);
        assert!(input.insert_into_fresh_index() > 300 * 64);
        let mut damaged = frame.clone();
        if let Some(byte) = damaged.last_mut() {
            *byte ^= 1;
        }
        assert_eq!(decode_frame_records(&damaged), 0);
        assert!(IndexInput::decode(&damaged).is_err());
        let mut bad = items(2);
        bad[1].timestamp = -1;
        let refused = PutRecords::encode(bad, false).err().expect("a bad timestamp");
        assert!(refused.to_string().contains("item 1"), "{refused}");
    }
}
