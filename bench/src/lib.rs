//! ctxlog's benchmarks: `benches/compare.rs` (the comparison harness against sled, redb, SQLite and
//! fjall), `benches/hot_paths.rs` (criterion, internal hot paths) and the profiling drivers in
//! `examples/`. This library holds what they share: workload W1. See docs/BENCHMARKS.md.

pub mod charts;
pub mod w1;
