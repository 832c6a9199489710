//! The lighthouse (torchft's protocol, `rdzv-server --lighthouse`): its
//! request decoding and bounds, and its state machine driven by arbitrary
//! calls from a handful of replica groups and steps of the clock. After
//! every step it checks:
//! - no panic, whatever the bytes (a request that decodes is checked by the
//!   same bounds the handlers apply);
//! - quorum ids never go back, and grow when the members change;
//! - a quorum's members are unique, in replica id order, healthy when it
//!   forms, and at least `min_replicas` unless every member of the previous
//!   quorum is in it again (torchft's fast quorum) or a participant asked
//!   `shrink_only` (torchft counts `min_replicas` before that filter);
//! - participants start afresh after each quorum; the tables stay within
//!   their bounds.
//!
//! # Input
//! The first byte picks the split: that many bytes (mod 64) are decoded as
//! a `LighthouseQuorumRequest`; the rest are operations, two bytes each:
//! an opcode (low two bits: 0 join, 1 rejoin, 2 heartbeat, 3 tick; bit 2
//! shrink-only, bit 3 a failed commit; the high nibble the replica group,
//! 0-7) and how many 50 ms pass first.
#![no_main]

use std::time::{Duration, Instant};

use accel_proto::prost::Message;
use accel_proto::torchft as pb;
use libfuzzer_sys::fuzz_target;
use rendezvous_server::lighthouse::{limits, Action, Event, Lighthouse, LighthouseConfig, MAX_GROUPS};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let split = usize::from(split % 64).min(rest.len());
    let (request, ops) = rest.split_at(split);
    if let Ok(r) = pb::LighthouseQuorumRequest::decode(request) {
        if let Some(m) = &r.requester {
            let _ = limits::check_member(m);
        }
    }
    let config = LighthouseConfig {
        min_replicas: 2,
        join_timeout: Duration::from_millis(300),
        quorum_tick: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(500),
    };
    let mut l = Lighthouse::resuming(config.clone(), 5);
    let mut now = Instant::now();
    let mut last_id = l.quorum_id();
    let mut prev: Option<Vec<String>> = None;
    let mut shrinking = false;
    for op in ops.chunks_exact(2) {
        now += Duration::from_millis(50) * u32::from(op[1] % 16);
        let group = op[0] >> 4 & 7;
        let id = format!("g{group}:u");
        let member = pb::QuorumMember {
            replica_id: id.clone(),
            step: i64::from(op[1]),
            world_size: 1,
            shrink_only: op[0] & 4 != 0,
            commit_failures: i64::from(op[0] >> 3 & 1),
            ..Default::default()
        };
        let healthy_before: Vec<String> = l
            .heartbeats()
            .filter(|(_, at)| now.saturating_duration_since(*at) < config.heartbeat_timeout)
            .map(|(id, _)| id.to_owned())
            .collect();
        let event = match op[0] & 3 {
            0 => Event::Join(member),
            1 => Event::Rejoin(member),
            2 => Event::Heartbeat(id.clone()),
            _ => Event::Tick,
        };
        let joining = matches!(event, Event::Join(_));
        shrinking |= matches!(&event, Event::Join(m) | Event::Rejoin(m) if m.shrink_only);
        let actions = match l.step(now, event) {
            Ok(a) => a,
            Err(e) => {
                let _ = e.to_string();
                continue;
            }
        };
        assert!(l.quorum_id() >= last_id, "quorum ids went back");
        for Action::Formed(q) in &actions {
            let ids: Vec<String> = q.participants.iter().map(|p| p.replica_id.clone()).collect();
            // Empty only when a shrink-only participant left no previous member.
            assert!(!ids.is_empty() || shrinking, "an empty quorum");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "members unique, in order: {ids:?}");
            for m in &ids {
                assert!(
                    healthy_before.contains(m) || (joining && *m == id),
                    "{m} was not healthy"
                );
            }
            let fast = prev.as_ref().is_some_and(|p| p.iter().all(|m| ids.contains(m)));
            assert!(
                fast || shrinking || ids.len() as u64 >= config.min_replicas,
                "{ids:?} below min"
            );
            shrinking = false;
            if prev.as_ref() != Some(&ids) {
                assert!(q.quorum_id > last_id, "new members, same id");
            }
            assert_eq!(l.participants().count(), 0, "participants start afresh");
            prev = Some(ids);
            last_id = q.quorum_id;
        }
        last_id = last_id.max(l.quorum_id());
        assert!(l.heartbeats().count() <= MAX_GROUPS && l.participants().count() <= MAX_GROUPS);
    }
});
