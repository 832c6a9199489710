//! A small etcd v3 client: what accel's replicated rendezvous asks of etcd,
//! and nothing more.
//!
//! # Why this crate exists
//! The published etcd client crates generate their gRPC code with `protoc`
//! in their build scripts, so building accel needed a protobuf compiler
//! (and protobuf's well-known types) installed next to the Rust toolchain.
//! This crate carries its own `.proto` files (under `proto/`: the messages,
//! fields and services of etcd's wire API that accel uses, written for it)
//! and compiles them with `protox`, a protobuf compiler written in Rust, as
//! `accel-proto` does: the workspace builds with the Rust toolchain alone.
//!
//! # What it covers
//! - connecting to several members, one used at a time and the next one
//!   tried when it fails ([`Client::connect`], [`ConnectOptions`]): connect
//!   timeout, HTTP/2 keep-alive, `hasleader`, user and password (the token
//!   renewed when etcd stops accepting it), TLS from PEM;
//! - keys: [`Client::get`], [`Client::put`] (or [`Client::put_with_lease`]),
//!   [`Client::txn`] (compares on version, create and mod revision or value;
//!   put, delete and get);
//! - leases: grant, revoke, keep-alive (a stream);
//! - elections (etcd's v3election service): campaign, leader, observe,
//!   resign;
//! - watching one key, or every key under a prefix.
//!
//! Responses are the generated messages of [`pb`], read by their fields.
#![forbid(unsafe_code)]

mod client;
mod endpoints;
mod error;
mod options;

pub use client::{Client, LeaseKeeper, Messages, WatchStream};
pub use error::Error;
pub use options::{
    prefix_end, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, TlsOptions, Txn,
    TxnOp,
};
pub use pb::mvccpb::{event::EventType, Event, KeyValue};
pub use pb::v3electionpb::LeaderKey;

/// The messages and gRPC clients generated from `proto/` (etcd's names).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod pb {
    /// etcd's stored keys and their changes.
    pub mod mvccpb {
        include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    }
    /// etcd's KV, watch, lease and auth services.
    pub mod etcdserverpb {
        include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    }
    /// etcd's election service.
    pub mod v3electionpb {
        include!(concat!(env!("OUT_DIR"), "/v3electionpb.rs"));
    }
}
