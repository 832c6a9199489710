//! What operators see of the lighthouse: a snapshot ([`Report`]) that the
//! metrics ([`Gauges`]) and the status page's `/api/lighthouse` read.
//! Replica groups are counted, never listed one series each: a metric per
//! replica id (a new uuid each restart) would grow without end.

use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::service::Shared;
use super::Lighthouse;

/// The lighthouse at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The last quorum id handed out.
    pub quorum_id: i64,
    /// The last quorum's members: replica id, step, ranks in its group.
    pub members: Vec<(String, i64, u64)>,
    /// Seconds since the last quorum formed.
    pub since_quorum_s: Option<f64>,
    /// Replica groups heartbeating within the timeout.
    pub healthy: usize,
    /// Replica groups waiting for the next quorum.
    pub participants: usize,
    /// Why the next quorum has not formed (empty when nobody waits).
    pub waiting: String,
    /// Every group heard, with the seconds since its last heartbeat,
    /// most recent first, at most [`LISTED`].
    pub heartbeats: Vec<(String, f64)>,
}

/// How many groups the report lists by name.
pub const LISTED: usize = 64;

impl Report {
    /// The report of `l` at `now`.
    pub fn of(l: &Lighthouse, now: Instant) -> Self {
        let age = |at: Instant| now.saturating_duration_since(at).as_secs_f64();
        let timeout = l.config().heartbeat_timeout;
        let mut heartbeats: Vec<(String, f64)> = l
            .heartbeats()
            .map(|(id, at)| (id.to_owned(), age(at)))
            .collect();
        let healthy = heartbeats
            .iter()
            .filter(|(_, a)| *a < timeout.as_secs_f64())
            .count();
        heartbeats.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        heartbeats.truncate(LISTED);
        let (members, since) = match l.last_quorum() {
            Some((q, at)) => (
                q.participants
                    .iter()
                    .map(|p| (p.replica_id.clone(), p.step, p.world_size))
                    .collect(),
                Some(age(at)),
            ),
            None => (Vec::new(), None),
        };
        let participants = l.participants().count();
        Self {
            quorum_id: l.quorum_id(),
            members,
            since_quorum_s: since,
            healthy,
            participants,
            waiting: match (participants, l.compute(now)) {
                (0, _) | (_, Ok(_)) => String::new(),
                (_, Err(w)) => w.to_string(),
            },
            heartbeats,
        }
    }

    /// The report as `JobStatus` gives it (`rdzv-server status`).
    pub fn to_pb(&self) -> accel_proto::v1::LighthouseStatus {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        accel_proto::v1::LighthouseStatus {
            quorum_id: self.quorum_id,
            members: self
                .members
                .iter()
                .map(|(id, step, ws)| accel_proto::v1::LighthouseMember {
                    replica_id: id.clone(),
                    step: *step,
                    world_size: *ws,
                })
                .collect(),
            since_quorum_ms: self.since_quorum_s.map(|s| (s * 1000.0) as u64),
            healthy: count(self.healthy),
            waiting: count(self.participants),
            waiting_reason: self.waiting.clone(),
        }
    }

    /// The report as the status page's JSON: what `rdzv-server status
    /// --json` says of the lighthouse ([`crate::status::lighthouse_json`]),
    /// and the groups heard.
    pub fn json(&self) -> serde_json::Value {
        let mut doc = crate::status::lighthouse_json(&self.to_pb());
        doc["heartbeats"] = self
            .heartbeats
            .iter()
            .map(|(id, age)| serde_json::json!({"replica_id": id, "age_s": age}))
            .collect();
        doc
    }
}

/// The lighthouse's gauges, read at each scrape.
#[derive(Debug)]
pub struct Gauges(pub Shared);

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let r = self.0.read(|l| Report::of(l, Instant::now()));
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (name, help, value) in [
            (
                "accel_rdzv_lighthouse_quorum_id",
                "The last quorum id the lighthouse (torchft) handed out",
                r.quorum_id,
            ),
            (
                "accel_rdzv_lighthouse_quorum_members",
                "Replica groups in the lighthouse's last quorum",
                count(r.members.len()),
            ),
            (
                "accel_rdzv_lighthouse_healthy_groups",
                "Replica groups that heartbeat the lighthouse within its heartbeat timeout",
                count(r.healthy),
            ),
            (
                "accel_rdzv_lighthouse_waiting_groups",
                "Replica groups waiting for the lighthouse's next quorum",
                count(r.participants),
            ),
        ] {
            let e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(e)?;
        }
        if let Some(s) = r.since_quorum_s {
            let e = encoder.encode_descriptor(
                "accel_rdzv_lighthouse_quorum_age_seconds",
                "Seconds since the lighthouse's last quorum formed (training steps ask for one each)",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(s).encode(e)?;
        }
        Ok(())
    }
}
