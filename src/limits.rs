//! Every bound ctxlog enforces, in one place, with the relations between them checked at compile time,
//! and `check_room`, the check of a count against its bound.

use crate::error::{Error, Result};

/// Bytes of an id, a session id or a snapshot name, at the most.
pub const ID_BYTES_MAX: usize = 128;
/// Bytes of a version string, at the most.
pub const VERSION_BYTES_MAX: usize = 64;
/// Bytes of a source string, at the most.
pub const SOURCE_BYTES_MAX: usize = 256;
/// Bytes of a type's id pattern, at the most.
pub const ID_PATTERN_BYTES_MAX: usize = 1024;
/// The latest timestamp accepted: 9999-12-31T23:59:59Z.
pub const TIMESTAMP_MAX: i64 = 253_402_300_799;
/// Default bound on an item's canonical content, in bytes (1 MiB).
pub const CONTENT_BYTES_DEFAULT: usize = 1 << 20;
/// The largest `Options::max_content_bytes` accepted (64 MiB).
pub const CONTENT_BYTES_MAX: usize = 64 << 20;
/// Bytes of one frame's payload (one batch), at the most (1 GiB).
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 1 << 30;
/// Items in one batch, at the most.
pub const BATCH_ITEMS_MAX: usize = 1 << 20;
/// The largest `Options::add_threads` accepted.
pub const ADD_THREADS_MAX: usize = 64;
/// The default `Options::add_threads` is the machine's available parallelism, at most this.
pub const ADD_THREADS_DEFAULT_MAX: usize = 4;
/// The fewest items each thread validating one `Store::add` batch takes (a batch uses a second
/// thread from twice this many on): for fewer, starting a helper costs more than it saves.
pub const PARALLEL_ADD_ITEMS_MIN: usize = 256;
/// The largest `Options::read_threads` accepted.
pub const READ_THREADS_MAX: usize = 64;
/// The default `Options::read_threads` is the machine's available parallelism, at most this.
pub const READ_THREADS_DEFAULT_MAX: usize = 4;
/// The fewest items each thread of a split query or resolve takes (a read uses a second thread
/// from twice this many on): for fewer, starting a helper costs more than it saves.
pub const PARALLEL_READ_ITEMS_MIN: usize = 128;
/// Default size at which a segment is sealed and a new one started (64 MiB).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 << 20;
/// The smallest `Options::segment_size` accepted (4 KiB).
pub const SEGMENT_BYTES_MIN: u64 = 4 << 10;
/// The largest `Options::segment_size` accepted (2 GiB), so that an offset in a segment fits in a u32.
pub const SEGMENT_BYTES_MAX: u64 = 2 << 30;

/// Versions the index holds at most: stored, retired, or forgotten by compaction (a forgotten
/// version keeps its slot until the next checkpoint load). A version's slot number is 32 bits, and
/// the index tells a slot from an id number by the top bit (below `1 << 31`).
pub const VERSIONS_MAX: usize = (1 << 31) - 1;
/// Ids the index knows at most, deleted or not (an id stays known after all its versions are gone).
/// Its number is 32 bits, below `1 << 31` as a slot's is.
pub const IDS_MAX: usize = (1 << 31) - 1;
/// Types at most, the built-in ones included: a type's number in the index is 16 bits.
pub const TYPES_MAX: usize = u16::MAX as usize;
/// Distinct scopes at most over a store's life (each session id that wrote is one; the index keeps
/// every one it has seen): a scope's number is 32 bits.
pub const SCOPES_MAX: usize = (1 << 31) - 1;
/// Distinct sources at most over a store's life (the index keeps every one it has seen): a source's
/// number is 32 bits.
pub const SOURCES_MAX: usize = (1 << 31) - 1;

/// Default bytes of log after which the background thread writes a new checkpoint (64 MiB).
pub const CHECKPOINT_EVERY_BYTES_DEFAULT: u64 = 64 << 20;
/// The smallest `Options::checkpoint_every` accepted (64 KiB).
pub const CHECKPOINT_EVERY_BYTES_MIN: u64 = 64 << 10;
/// The largest `Options::checkpoint_every` accepted (1 TiB).
pub const CHECKPOINT_EVERY_BYTES_MAX: u64 = 1 << 40;

const _: () = assert!(CONTENT_BYTES_DEFAULT <= CONTENT_BYTES_MAX);
const _: () = assert!(CONTENT_BYTES_MAX < FRAME_PAYLOAD_BYTES_MAX);
const _: () = assert!(SEGMENT_BYTES_MIN <= SEGMENT_BYTES_DEFAULT && SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX);
// A segment is sealed once it reaches SEGMENT_BYTES_MAX, and may then hold one more frame: every offset
// in a segment must still fit in a u32.
const _: () = assert!(SEGMENT_BYTES_MAX + FRAME_PAYLOAD_BYTES_MAX as u64 + 64 <= u32::MAX as u64);
const _: () = assert!(ADD_THREADS_DEFAULT_MAX <= ADD_THREADS_MAX);
// Slot and id numbers (0..VERSIONS_MAX, 0..IDS_MAX) stay below the index's tag bit, and so below
// its "no version" number, u32::MAX; type numbers fit in 16 bits, scope and source numbers in 32.
const _: () = assert!(VERSIONS_MAX < 1 << 31 && IDS_MAX < 1 << 31);
const _: () = assert!(TYPES_MAX <= u16::MAX as usize + 1);
const _: () = assert!(SCOPES_MAX <= u32::MAX as usize && SOURCES_MAX <= u32::MAX as usize);
const _: () = assert!(
    CHECKPOINT_EVERY_BYTES_MIN <= CHECKPOINT_EVERY_BYTES_DEFAULT
        && CHECKPOINT_EVERY_BYTES_DEFAULT <= CHECKPOINT_EVERY_BYTES_MAX
);

/// Refuses to add `adding` of `what` (`"versions"`, `"types"`, ...) to the `held` a store already
/// holds when together they would pass `limit`: [`Error::Full`], before anything is written.
pub(crate) fn check_room(held: usize, adding: usize, limit: usize, what: &str) -> Result<()> {
    if held.checked_add(adding).is_some_and(|total| total <= limit) {
        return Ok(());
    }
    Err(Error::Full {
        what: what.to_owned(),
        limit: crate::num::u64_from_usize(limit),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_refused_past_the_limit_only() {
        assert!(check_room(0, 0, 0, "versions").is_ok());
        assert!(check_room(6, 4, 10, "versions").is_ok());
        assert!(check_room(10, 0, 10, "versions").is_ok());
        for (held, adding) in [(7, 4), (10, 1), (11, 0), (usize::MAX, 1)] {
            let refused = check_room(held, adding, 10, "versions");
            assert!(
                matches!(&refused, Err(Error::Full { what, limit: 10 }) if what == "versions"),
                "{held} + {adding}: {refused:?}"
            );
        }
        let message = check_room(1, 1, 1, "types").unwrap_err().to_string();
        assert!(message.contains("types") && message.contains('1'), "{message}");
    }
}
