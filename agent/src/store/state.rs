//! The store's data and the meaning of each command, without any I/O.
//!
//! [`State::apply`] appends a command's reply to an output buffer and
//! returns its [`Effects`]: whether the calling connection is now parked
//! (a WAIT or BARRIER that cannot complete yet) and which parked connections
//! the command woke. The server delivers the wake-ups; each carries the
//! generation of the wait it ends, so a wake-up that crosses a CANCEL_WAIT is
//! recognised as stale.

use std::collections::{HashMap, VecDeque};

use super::wire::{put_bytes, put_i64, Command, NOT_READY, READY, STOP_WAITING};

/// A connection's id within one store.
pub type ConnId = u64;

/// What a command did beyond its reply.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The caller is parked until woken with this generation.
    pub parked: Option<u64>,
    /// Parked connections to wake: (connection, generation).
    pub woken: Vec<(ConnId, u64)>,
}

/// A command that is well-formed but cannot be served; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// ADD or BARRIER on a value that is not a decimal integer.
    #[error("the value of key {key:?} is not an integer")]
    NotANumber {
        /// The key, lossily decoded.
        key: String,
    },
    /// ADD overflowed 64 bits.
    #[error("adding to key {key:?} overflows a 64-bit integer")]
    Overflow {
        /// The key, lossily decoded.
        key: String,
    },
    /// VALIDATE after the handshake.
    #[error("VALIDATE is only valid as the first command")]
    LateValidate,
}

#[derive(Debug)]
struct Wait {
    generation: u64,
    remaining: usize,
    /// BARRIER: woken when the counter at the key reaches this.
    barrier_target: Option<i64>,
}

/// The store's keys, queues and parked waiters.
#[derive(Debug, Default)]
pub struct State {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key → connections waiting for a write to it.
    waiters: HashMap<Vec<u8>, Vec<(ConnId, u64)>>,
    waits: HashMap<ConnId, Wait>,
    next_generation: u64,
}

fn lossy(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

impl State {
    /// Serves `cmd` from connection `conn`, appending its reply to `out`.
    pub fn apply(
        &mut self,
        conn: ConnId,
        cmd: Command,
        out: &mut Vec<u8>,
    ) -> Result<Effects, ApplyError> {
        let mut fx = Effects::default();
        match cmd {
            Command::Validate(_) => return Err(ApplyError::LateValidate),
            Command::Ping(nonce) => out.extend_from_slice(&nonce.to_le_bytes()),
            Command::Set(k, v) => {
                self.kv.insert(k.clone(), v);
                self.notify(&k, &mut fx);
            }
            Command::CompareSet {
                key,
                expected,
                desired,
            } => {
                let current = match self.kv.get(&key) {
                    None if expected.is_empty() => None,
                    None => Some(expected),
                    Some(cur) if *cur == expected => None,
                    Some(cur) => Some(cur.clone()),
                };
                match current {
                    // No write: report what is there (or the caller's expectation for a missing key).
                    Some(v) => put_bytes(out, &v),
                    None => {
                        put_bytes(out, &desired);
                        self.kv.insert(key.clone(), desired);
                        self.notify(&key, &mut fx);
                    }
                }
            }
            Command::Get(k) => put_bytes(out, self.kv.get(&k).map_or(&[][..], Vec::as_slice)),
            Command::Add(k, delta) => {
                let v = self.add(&k, delta)?;
                put_i64(out, v);
                self.notify(&k, &mut fx);
            }
            Command::Check(keys) => out.push(if keys.iter().all(|k| self.present(k)) {
                READY
            } else {
                NOT_READY
            }),
            Command::Wait(keys) => {
                let missing: Vec<Vec<u8>> = keys.into_iter().filter(|k| !self.present(k)).collect();
                if missing.is_empty() {
                    out.push(STOP_WAITING);
                } else {
                    fx.parked = Some(self.park(conn, missing, None));
                }
            }
            Command::CancelWait => {
                // Handled by the connection, which knows whether a wake-up is in flight.
                self.cancel(conn);
                out.push(super::wire::WAIT_CANCELED);
            }
            Command::NumKeys => put_i64(out, self.kv.len() as i64),
            Command::DeleteKey(k) => put_i64(out, i64::from(self.kv.remove(&k).is_some())),
            Command::Append(k, v) => {
                self.kv.entry(k.clone()).or_default().extend_from_slice(&v);
                self.notify(&k, &mut fx);
            }
            Command::MultiGet(keys) => {
                for k in keys {
                    put_bytes(out, self.kv.get(&k).map_or(&[][..], Vec::as_slice));
                }
            }
            Command::MultiSet(pairs) => {
                for (k, v) in pairs {
                    self.kv.insert(k.clone(), v);
                    self.notify(&k, &mut fx);
                }
            }
            Command::QueuePush(k, v) => {
                self.queues.entry(k.clone()).or_default().push_back(v);
                self.notify_one(&k, &mut fx);
            }
            Command::QueuePop(k) => {
                let q = self.queues.get_mut(&k);
                let len = q.as_ref().map_or(0, |q| q.len());
                put_i64(out, len as i64);
                if let Some(v) = q.and_then(VecDeque::pop_front) {
                    put_bytes(out, &v);
                }
            }
            Command::QueueLen(k) => {
                put_i64(out, self.queues.get(&k).map_or(0, VecDeque::len) as i64)
            }
            Command::ListKeys => {
                put_i64(out, self.kv.len() as i64);
                for k in self.kv.keys() {
                    put_bytes(out, k);
                }
            }
            Command::Barrier(k, world_size) => {
                let count = self.add(&k, 1)?;
                self.notify(&k, &mut fx);
                if count >= world_size {
                    out.push(STOP_WAITING);
                } else {
                    fx.parked = Some(self.park(conn, vec![k], Some(world_size)));
                }
            }
        }
        Ok(fx)
    }

    /// Drops `conn`'s wait; returns whether one was registered.
    pub fn cancel(&mut self, conn: ConnId) -> bool {
        self.waits.remove(&conn).is_some()
    }

    /// Forgets a closed connection.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.waits.remove(&conn);
    }

    fn present(&self, k: &[u8]) -> bool {
        self.kv.contains_key(k) || self.queues.get(k).is_some_and(|q| !q.is_empty())
    }

    fn add(&mut self, k: &[u8], delta: i64) -> Result<i64, ApplyError> {
        let current = match self.kv.get(k) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| ApplyError::NotANumber { key: lossy(k) })?,
        };
        let next = current
            .checked_add(delta)
            .ok_or_else(|| ApplyError::Overflow { key: lossy(k) })?;
        self.kv.insert(k.to_vec(), next.to_string().into_bytes());
        Ok(next)
    }

    fn park(&mut self, conn: ConnId, keys: Vec<Vec<u8>>, barrier_target: Option<i64>) -> u64 {
        self.next_generation += 1;
        let generation = self.next_generation;
        self.waits.insert(
            conn,
            Wait {
                generation,
                remaining: keys.len(),
                barrier_target,
            },
        );
        for k in keys {
            self.waiters.entry(k).or_default().push((conn, generation));
        }
        generation
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
    fn notify(&mut self, key: &[u8], fx: &mut Effects) {
        if self.waiters.is_empty() {
            return;
        }
        let Some(list) = self.waiters.remove(key) else {
            return;
        };
        let mut keep = Vec::new();
        for (conn, generation) in list {
            match self.satisfied(key, conn, generation) {
                None => {} // stale: cancelled, disconnected or re-parked
                Some(true) => {
                    self.waits.remove(&conn);
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
            self.waiters.insert(key.to_vec(), keep);
        }
    }

    /// A queue push wakes one key waiter of the key. A barrier on the key
    /// keeps waiting: a push is not an arrival (fuzz_regressions.rs).
    fn notify_one(&mut self, key: &[u8], fx: &mut Effects) {
        let waits = &mut self.waits;
        let Some(list) = self.waiters.get_mut(key) else {
            return;
        };
        list.retain(|(conn, generation)| waits.get(conn).is_some_and(|w| w.generation == *generation));
        let first = list
            .iter()
            .position(|(conn, _)| waits.get(conn).is_some_and(|w| w.barrier_target.is_none()));
        if let Some((conn, generation)) = first.map(|i| list.remove(i)) {
            if let Some(w) = waits.get_mut(&conn) {
                w.remaining -= 1;
                if w.remaining == 0 {
                    waits.remove(&conn);
                    fx.woken.push((conn, generation));
                }
            }
        }
        if list.is_empty() {
            self.waiters.remove(key);
        }
    }
}

#[cfg(test)]
mod fuzz_regressions;
#[cfg(test)]
mod tests;
