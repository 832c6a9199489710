//! Process control for accel's agent: starting, watching, signalling and
//! stopping processes, with no knowledge of rounds, ranks or log policy.
//!
//! # Why its own crate
//! The agent's driver decides *when* workers start and stop; this crate is
//! *how*: the hooks a spawned worker runs before its program (die with the
//! agent, let the agent trace it, take an inherited descriptor), signalling
//! a process group, seeing an exit without reaping it ([`sys`]); the guard
//! that kills the workers if the agent dies or freezes ([`guard`]); the fork
//! server protocol that starts workers as forks of a prepared Python process
//! ([`fork_server`]), and the zygote that keeps one such process ready for
//! `--preload` ([`zygote`]); reaping orphans as a container's PID 1
//! ([`init`]); the agent's own hardening (non-dumpable, its
//! token blanked from its environment block). As a crate of its own it is
//! compiled without the agent's node, configuration, rendezvous and logs
//! modules, so none of that can leak in.
//!
//! # One direction
//! `accel-agent` depends on this crate; this crate depends on no accel
//! crate. How a process ended ([`Ended`]) is defined here, and the agent
//! re-exports it for its node machine.
#![deny(unsafe_code)]

pub mod fork_server;
pub mod guard;
pub mod init;
pub mod sys;
pub mod zygote;

pub use sys::Ended;
