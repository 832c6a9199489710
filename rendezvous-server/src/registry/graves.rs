//! Finished jobs' tombstones ([`crate::tombstone`]), bounded in count and
//! in time: a join of a finished job is answered from its tombstone, so a
//! late or restarted node never starts it again.
//!
//! They are kept in the order they were laid, so the oldest go first when
//! there are more than [`Limits::max_tombstones`] and when they outlive
//! [`Limits::tombstone_ttl`]. Every change goes through the [`Commit`] path,
//! so a replicated server's store holds the same tombstones. Times are wall
//! clock milliseconds, passed in: tombstones are shared by replicas.

use std::collections::{HashMap, VecDeque};

use super::commit::Commit;
use crate::limits::Limits;
use crate::tombstone::Tombstone;

/// The tombstones held.
#[derive(Debug, Default)]
pub(super) struct Graves {
    by_job: HashMap<String, Tombstone>,
    /// Job ids, oldest first.
    order: VecDeque<String>,
}

impl Graves {
    /// Keeps `t` (and writes it with the next flush), dropping the oldest
    /// beyond [`Limits::max_tombstones`]; nothing when tombstones are off.
    pub(super) fn lay(&mut self, t: Tombstone, limits: &Limits, commit: &mut Commit) {
        if limits.tombstone_ttl.is_zero() || limits.max_tombstones == 0 {
            return;
        }
        commit.put_tombstone(&t);
        let id = t.job_id.clone();
        // A later run of the same id replaces the earlier run's tombstone,
        // and is the newest now.
        if self.by_job.insert(id.clone(), t).is_some() {
            self.order.retain(|o| *o != id);
        }
        self.order.push_back(id);
        self.trim(limits, commit);
    }

    /// Takes in a store's tombstones (a server that starts), oldest first;
    /// expired ones are deleted from the store.
    pub(super) fn lay_loaded(
        &mut self,
        mut stones: Vec<Tombstone>,
        now_ms: u64,
        limits: &Limits,
        commit: &mut Commit,
    ) {
        stones.sort_by_key(|t| t.finished_ms);
        for t in stones {
            if t.expired(now_ms, limits.tombstone_ttl) {
                commit.delete_tombstone(t.job_id);
            } else if !self.by_job.contains_key(&t.job_id) {
                let id = t.job_id.clone();
                self.by_job.insert(id.clone(), t);
                self.order.push_back(id);
            }
        }
        self.trim(limits, commit);
    }

    /// Drops the tombstones that outlived their TTL, the oldest first.
    pub(super) fn expire(&mut self, now_ms: u64, limits: &Limits, commit: &mut Commit) {
        while let Some(id) = self.order.front() {
            let live = self
                .by_job
                .get(id)
                .is_some_and(|t| !t.expired(now_ms, limits.tombstone_ttl));
            if live {
                break;
            }
            if let Some(id) = self.order.pop_front() {
                self.unlay(&id, commit);
            }
        }
    }

    /// `job_id`'s tombstone, unless it expired.
    pub(super) fn live(&self, job_id: &str, now_ms: u64, limits: &Limits) -> Option<&Tombstone> {
        self.by_job
            .get(job_id)
            .filter(|t| !t.expired(now_ms, limits.tombstone_ttl))
    }

    /// Tombstones held.
    pub(super) fn len(&self) -> usize {
        self.by_job.len()
    }

    fn trim(&mut self, limits: &Limits, commit: &mut Commit) {
        while self.by_job.len() > limits.max_tombstones {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.unlay(&old, commit);
        }
    }

    fn unlay(&mut self, id: &str, commit: &mut Commit) {
        if self.by_job.remove(id).is_some() {
            commit.remove_tombstone(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn stone(id: &str, finished_ms: u64) -> Tombstone {
        Tombstone {
            job_id: id.into(),
            succeeded: true,
            exit_code: 0,
            reason: String::new(),
            round: 0,
            finished_ms,
            nodes: Vec::new(),
            hosts: Vec::new(),
        }
    }

    fn limits(max: usize, ttl_s: u64) -> Limits {
        Limits {
            max_tombstones: max,
            tombstone_ttl: Duration::from_secs(ttl_s),
            ..Limits::default()
        }
    }

    #[test]
    fn beyond_the_count_the_oldest_go_first() {
        let (l, mut c, mut g) = (limits(2, 60), Commit::new(false), Graves::default());
        for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
            g.lay(stone(id, i as u64), &l, &mut c);
        }
        assert_eq!(g.len(), 2);
        assert!(g.live("a", 0, &l).is_none(), "the oldest went");
        assert!(g.live("b", 0, &l).is_some() && g.live("c", 0, &l).is_some());
        // Laying a job's tombstone again keeps one, in its first place.
        g.lay(stone("b", 5), &l, &mut c);
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn they_expire_by_age_on_the_wall_clock_and_none_are_kept_when_off() {
        let (l, mut c, mut g) = (limits(10, 60), Commit::new(false), Graves::default());
        g.lay(stone("old", 0), &l, &mut c);
        g.lay(stone("new", 50_000), &l, &mut c);
        assert!(g.live("old", 59_999, &l).is_some());
        assert!(
            g.live("old", 60_001, &l).is_none(),
            "expired: answers nothing"
        );
        g.expire(60_001, &l, &mut c);
        assert_eq!(g.len(), 1, "and is dropped by the next expiry");
        g.expire(200_000, &l, &mut c);
        assert_eq!(g.len(), 0);
        let off = limits(10, 0);
        g.lay(stone("x", 0), &off, &mut c);
        assert_eq!(g.len(), 0, "a zero TTL keeps none");
    }

    #[test]
    fn loaded_ones_are_taken_oldest_first_and_expired_ones_deleted_from_the_store() {
        let (l, mut c, mut g) = (limits(2, 60), Commit::new(true), Graves::default());
        let stones = vec![
            stone("c", 30_000),
            stone("gone", 0),
            stone("a", 10_000),
            stone("b", 20_000),
        ];
        g.lay_loaded(stones, 61_000, &l, &mut c);
        assert_eq!(g.len(), 2);
        assert!(
            g.live("a", 61_000, &l).is_none(),
            "the oldest beyond the count"
        );
        assert!(g.live("c", 61_000, &l).is_some());
        let pending = c.take().expect("a write");
        assert!(
            format!("{pending:?}").contains("\"gone\""),
            "the expired one is deleted"
        );
    }
}
