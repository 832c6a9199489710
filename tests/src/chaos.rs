//! The chaos run (`scripts/chaos.sh`): a multi-node job under a seeded
//! schedule of faults, checked against invariants on what its workers
//! recorded.
//!
//! Why: every fault tried by hand found a bug, and one scenario at a time
//! does not cover the interleavings that break fencing or liveness. The
//! run is split so that everything but the I/O is a pure, unit-tested
//! function:
//!
//! * [`schedule`]: (seed, seconds, mode) → the faults and their heals;
//! * [`history`]: the workers' JSON lines → one record per worker process;
//! * [`invariants`]: records, injected faults, the end → violations, each
//!   with the slice of history that shows it;
//! * [`report`]: the table (faults by kind, recoveries, times);
//! * [`run`]: the run itself, on the topology `cluster.rs` builds (network
//!   namespaces, etcd, replicas, agents) with the faults `faults.rs`
//!   injects and heals.
//!
//! The user guide's "Fault testing" page says how to run it and what the
//! table means.

mod cluster;
mod faults;
pub mod history;
pub mod invariants;
pub mod report;
pub mod run;
pub mod schedule;
