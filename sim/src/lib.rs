//! A deterministic multi-node simulator of accel: the rendezvous's pure
//! `Job` state machine and N agents' pure `NodeMachine`s, composed in one
//! process on a virtual clock, with the network between them.
//!
//! # Why
//! Every decision of the server lives in `rendezvous_server::job::Job`,
//! and every decision of an agent about its round in
//! `accel_agent::agent::machine::NodeMachine`; both are pure and
//! clock-injected. Each is unit-tested alone, but elastic joins, restarts,
//! fencing, reconnects and failovers are properties of the two together,
//! which the end-to-end tests can check only with real processes, the wall
//! clock and sleeps. This crate composes the real machines (not copies)
//! in the style of deterministic simulation testing (FoundationDB,
//! TigerBeetle) and etcd raft's datadriven tests: one seed fixes every
//! choice (message delays, losses, which ready source the driver hears
//! first, fault schedules), so any run, and any failure, replays exactly.
//! A run takes milliseconds: thousands of seeds run in the test command.
//!
//! # What is modelled
//! The server's side of the gRPC service and registry that matters for
//! the job's logic (sessions, streams and their ends, dropping silent
//! nodes via `Job::tick`, tombstones, relearning a job from a resuming node
//! after a restart, restoring it from its `JobRecord` on a failover), the
//! agent's driver (which sources a phase listens to, the actions, the
//! keep-alives, the silence bound, the fence clock, rejoining within the
//! grace), the round's peer hub (the agent's `peers` module: the real
//! `Hub`, `View` and `Timing`, pings on their own links, the vouch in the
//! keep-alives, the evidence that keeps workers through an outage, and the
//! server's mass-silence hold), workers as records with scripted exits, and
//! the network (per link latency, extra delay, loss, partitions from the
//! server, the peers or both, crashes, a paused server). See [`world`] for
//! the details and simplifications.
//!
//! # What is not
//! No real processes, signals, torch, TCPStore, etcd, TLS, tokens or
//! sockets; no guard process (an agent's death kills its workers, as its
//! guard does), no health checks or presence leases. Those are the
//! end-to-end tests' (`tests/tests/*.rs`) and the chaos run's.
//!
//! # Use
//! - [`script`]: scenario scripts (`sim/scenarios/*.sim`), run by
//!   `cargo test -p accel-sim` and `accel-sim run FILE`.
//! - [`random`]: seeded fault schedules, run by the same tests
//!   (as many seeds as fit in a minute, at least 10,000) and
//!   `accel-sim seeds 0..1000000`; a failing seed prints
//!   its plan and replays with `accel-sim seed N --trace`.
//! - [`invariants`]: what every run must keep.
//!
//! Issues the simulator found in the real machines are reproduced by
//! `sim/scenarios/known_*.sim` and described in `sim/scenarios/README.md`;
//! a test checks that each still fails, so a fix shows up as a rename.

pub mod invariants;
pub mod random;
pub mod script;
pub mod world;

pub use invariants::Violation;
pub use world::{Fault, Spec, World};
