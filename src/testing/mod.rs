//! Scaffolding for ctxlog's own tests, fuzz targets and benchmarks, compiled only with the feature
//! `testing` (the crate's tests, `fuzz/` and `bench/` turn it on; a default build has none of it).
//! Not part of the API: hidden from the docs, free to change, never needed by an embedder. It stands
//! above every layer of the crate and may use any of them.
//!
//! - [`fuzz`]: the decoder fuzz targets' entry points, and the check of a store just opened.
//! - [`model`]: the reference model of the store's observable behaviour, and what a store shows
//!   of its state, driven by `tests/model.rs` (a property test) and by [`stateful`].
//! - [`stateful`]: the `stateful` fuzz target: operations decoded from fuzz bytes, run on a store on
//!   the simulated disk with power cuts, each answer checked against the model.
//! - [`bench`]: internal hot paths one at a time, and a checkpoint on demand, for `bench/`.

pub mod bench;
pub mod fuzz;
pub mod model;
pub mod stateful;
