//! Feature unification for the workspace; this crate has no code.
//!
//! Cargo resolves each dependency's features over the packages being built.
//! A plain `cargo test` builds the default members; the test command also
//! builds `worker-runtime`, whose `tch` turns on `getrandom` 0.2's `std`
//! (through `rand`) and, for build scripts, `cc`'s `parallel` (through
//! `zstd-sys`). Those crates sit under `ring`, `rustls`, `tonic` and every
//! daemon, so without this crate the two builds would compile that whole
//! tree twice. Depending on them here, with the same features, makes both
//! builds resolve the same set (the pattern cargo-hakari automates).
//! `accel-proto`, which every daemon depends on, depends on this crate.
