//! Parked connections: a WAIT or BARRIER that cannot complete yet, the
//! per-key index of who waits for what, and waking them.
//!
//! A wait remembers its keys so that ending it in any way (woken, cancelled,
//! its connection closed) removes its entries from the index: nothing of a
//! wait outlives it.

use bytes::Bytes;

use super::{ConnId, Effects, State};

#[derive(Debug)]
pub(super) struct Wait {
    generation: u64,
    remaining: usize,
    /// BARRIER: woken when the counter at the key reaches this.
    barrier_target: Option<i64>,
    /// Every key it is registered under, to unregister it.
    keys: Vec<Bytes>,
}

impl State {
    /// Entries in the per-key waiter index (each wait has one per key).
    pub fn waiter_entries(&self) -> usize {
        self.waiters.values().map(Vec::len).sum()
    }

    /// Drops `conn`'s wait; returns whether one was registered.
    pub fn cancel(&mut self, conn: ConnId) -> bool {
        self.unpark(conn).is_some()
    }

    /// Forgets a closed connection: its wait and every index entry of it.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.unpark(conn);
    }

    /// Parks `conn` until every key in `keys` is written (or, for a barrier,
    /// until the counter at its one key reaches `barrier_target`).
    pub(super) fn park(
        &mut self,
        conn: ConnId,
        keys: Vec<Bytes>,
        barrier_target: Option<i64>,
    ) -> u64 {
        self.unpark(conn);
        self.next_generation += 1;
        let generation = self.next_generation;
        for k in &keys {
            self.waiters
                .entry(k.clone())
                .or_default()
                .push((conn, generation));
        }
        self.waits.insert(
            conn,
            Wait {
                generation,
                remaining: keys.len(),
                barrier_target,
                keys,
            },
        );
        generation
    }

    /// Removes `conn`'s wait and its entries in the per-key index.
    fn unpark(&mut self, conn: ConnId) -> Option<Wait> {
        let w = self.waits.remove(&conn)?;
        for k in &w.keys {
            if let Some(list) = self.waiters.get_mut(k) {
                list.retain(|&(c, g)| (c, g) != (conn, w.generation));
                if list.is_empty() {
                    self.waiters.remove(k);
                }
            }
        }
        Some(w)
    }

    /// Whether the wait `(conn, generation)` is done after one write to `key`.
    fn satisfied(&mut self, key: &[u8], conn: ConnId, generation: u64) -> Option<bool> {
        let value = self
            .kv
            .get(key)
            .map(|v| String::from_utf8_lossy(v).trim().parse::<i64>().ok());
        let w = self
            .waits
            .get_mut(&conn)
            .filter(|w| w.generation == generation)?;
        Some(match w.barrier_target {
            Some(target) => value.flatten().is_some_and(|v| v >= target),
            None => {
                w.remaining -= 1;
                w.remaining == 0
            }
        })
    }

    /// A write to `key`: every wait on it counts it; barrier waits re-check the counter.
    pub(super) fn notify(&mut self, key: &[u8], fx: &mut Effects) {
        if self.waiters.is_empty() {
            return;
        }
        let Some((key, list)) = self.waiters.remove_entry(key) else {
            return;
        };
        let mut keep = Vec::new();
        for (conn, generation) in list {
            match self.satisfied(&key, conn, generation) {
                None => {} // stale: its wait ended already
                Some(true) => {
                    self.unpark(conn);
                    fx.woken.push((conn, generation));
                }
                // A barrier keeps watching its counter; a key wait has counted this key.
                Some(false)
                    if self
                        .waits
                        .get(&conn)
                        .is_some_and(|w| w.barrier_target.is_some()) =>
                {
                    keep.push((conn, generation));
                }
                Some(false) => {}
            }
        }
        if !keep.is_empty() {
            self.waiters.insert(key, keep);
        }
    }

    /// A queue push wakes one waiter of the key.
    pub(super) fn notify_one(&mut self, key: &[u8], fx: &mut Effects) {
        let Some((key, mut list)) = self.waiters.remove_entry(key) else {
            return;
        };
        let waits = &self.waits;
        list.retain(|(conn, generation)| {
            waits.get(conn).is_some_and(|w| w.generation == *generation)
        });
        // A barrier on the key keeps waiting: a push is not an arrival
        // (fuzz_regressions.rs).
        let first = list
            .iter()
            .position(|(conn, _)| waits.get(conn).is_some_and(|w| w.barrier_target.is_none()));
        if let Some((conn, generation)) = first.map(|i| list.remove(i)) {
            if let Some(w) = self.waits.get_mut(&conn) {
                w.remaining -= 1;
                if w.remaining == 0 {
                    self.unpark(conn);
                    list.retain(|&e| e != (conn, generation));
                    fx.woken.push((conn, generation));
                }
            }
        }
        if !list.is_empty() {
            self.waiters.insert(key, list);
        }
    }
}
