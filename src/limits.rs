//! Every bound ctxlog enforces, in one place, with the relations between them checked at compile time.

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
const _: () = assert!(
    CHECKPOINT_EVERY_BYTES_MIN <= CHECKPOINT_EVERY_BYTES_DEFAULT
        && CHECKPOINT_EVERY_BYTES_DEFAULT <= CHECKPOINT_EVERY_BYTES_MAX
);
