//! What the worker store counts, for the agent's Prometheus endpoint.
//!
//! The store owns its counters and the agent registers them
//! ([`StoreMetrics::register`]): the counters outlive each round's store (the
//! agent keeps one [`StoreMetrics`] for the process and hands a clone to
//! every store it starts), and the store needs nothing of the agent to
//! count. The series keep their `accel_agent_store_` names: they are the
//! agent's endpoint's, whichever crate counts them.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::wire::Command;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Op {
    op: &'static str,
}

/// An admitted store connection, counted open while it lives.
#[derive(Debug)]
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The names of the store's commands, in [`op_index`]'s order.
const OPS: [&str; 19] = [
    "validate",
    "set",
    "compare_set",
    "get",
    "add",
    "check",
    "wait",
    "num_keys",
    "delete_key",
    "append",
    "multi_get",
    "multi_set",
    "cancel_wait",
    "ping",
    "queue_push",
    "queue_pop",
    "queue_len",
    "list_keys",
    "barrier",
];

/// Which of [`OPS`] a command is (exhaustive: a new command needs a name).
fn op_index(cmd: &Command) -> usize {
    match cmd {
        Command::Validate(_) => 0,
        Command::Set(..) => 1,
        Command::CompareSet { .. } => 2,
        Command::Get(_) => 3,
        Command::Add(..) => 4,
        Command::Check(_) => 5,
        Command::Wait(_) => 6,
        Command::NumKeys => 7,
        Command::DeleteKey(_) => 8,
        Command::Append(..) => 9,
        Command::MultiGet(_) => 10,
        Command::MultiSet(_) => 11,
        Command::CancelWait => 12,
        Command::Ping(_) => 13,
        Command::QueuePush(..) => 14,
        Command::QueuePop(_) => 15,
        Command::QueueLen(_) => 16,
        Command::ListKeys => 17,
        Command::Barrier(..) => 18,
    }
}

/// The worker store's counters, kept across rounds (each round's store is
/// new). An operation costs one atomic increment: the per-command counters
/// are looked up once, here, not per command.
#[derive(Debug, Clone)]
pub struct StoreMetrics(Arc<StoreInner>);

#[derive(Debug)]
struct StoreInner {
    connections: Counter,
    open: Gauge,
    refused: Counter,
    ops: Family<Op, Counter>,
    by_op: Vec<Counter>,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        let ops: Family<Op, Counter> = Family::default();
        let by_op = OPS
            .iter()
            .map(|op| ops.get_or_create(&Op { op }).clone())
            .collect();
        Self(Arc::new(StoreInner {
            connections: Counter::default(),
            open: Gauge::default(),
            refused: Counter::default(),
            ops,
            by_op,
        }))
    }
}

impl StoreMetrics {
    /// Registers the counters in `registry` (the agent's, once per process).
    pub fn register(&self, registry: &mut Registry) {
        let s = &self.0;
        registry.register(
            "accel_agent_store_connections",
            "Connections the worker store (node rank 0's TCPStore) accepted",
            s.connections.clone(),
        );
        registry.register(
            "accel_agent_store_open_connections",
            "Connections the worker store holds now",
            s.open.clone(),
        );
        registry.register(
            "accel_agent_store_refused_connections",
            "Connections the worker store refused (not from a member's address)",
            s.refused.clone(),
        );
        registry.register(
            "accel_agent_store_operations",
            "Commands the worker store received, by operation (refused ones included)",
            s.ops.clone(),
        );
    }

    /// A connection was admitted; it counts as open until the returned
    /// guard drops (however its task ends).
    pub fn connected(&self) -> OpenConnection {
        self.0.connections.inc();
        self.0.open.inc();
        OpenConnection(self.0.open.clone())
    }

    /// A connection was refused.
    pub fn refused(&self) {
        self.0.refused.inc();
    }

    /// A command was applied.
    pub fn op(&self, cmd: &Command) {
        if let Some(c) = self.0.by_op.get(op_index(cmd)) {
            c.inc();
        }
    }
}
