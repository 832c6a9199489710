//! The accel rendezvous API (`accel.rendezvous.v1`) and its generated code.
//!
//! The `.proto` file under `proto/` is the contract between `rdzv-server` and
//! `accel-agent`; see its comments for what each call and event means. The
//! Rust code is generated at build time by `protox` + `tonic-prost-build`, so
//! no `protoc` is needed. `tonic` and `prost` are re-exported so users of this
//! crate name one version of each.
#![forbid(unsafe_code)]

pub use prost;
pub use tonic;

/// Version 1 of the rendezvous API.
pub mod v1 {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("accel.rendezvous.v1");
}
