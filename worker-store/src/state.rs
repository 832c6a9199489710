//! The store's data and the meaning of each command, without any I/O.
//!
//! [`State::apply`] appends a command's reply to a [`Replies`] buffer and
//! returns its [`Effects`]: whether the calling connection is now parked
//! (a WAIT or BARRIER that cannot complete yet) and which parked connections
//! the command woke. The server delivers the wake-ups; each carries the
//! generation of the wait it ends, so a wake-up that crosses a CANCEL_WAIT is
//! recognised as stale.
//!
//! # Bounds
//! * **Byte budget.** Keys and values held (plain keys and queued values)
//!   are counted; a write that would take the total past the budget
//!   ([`DEFAULT_MAX_BYTES`] unless configured) is refused with
//!   [`ApplyError::OverBudget`]. TCPStore's protocol has no error reply, so
//!   the server closes the writer's connection (the PyTorch client raises a
//!   connection error); everyone else is served as before, and writes that
//!   shrink the store (DELETE, a shorter SET) always pass.
//! * **APPEND** may not make a value longer than [`MAX_VALUE_LEN`], the
//!   limit a SET has ([`ApplyError::ValueTooLarge`]); before, 13 APPENDs of
//!   8 MiB built a 104 MiB value.
//! * **Waiters are forgotten** when their wait ends in any way: woken,
//!   cancelled, or the connection closed ([`State::disconnect`]). A wait
//!   remembers its keys so that its entries in the per-key index can be
//!   removed; before, every abandoned WAIT left one entry per key behind
//!   (about 20 MB for a WAIT on 20,000 keys).

use std::collections::{HashMap, VecDeque};

use bytes::{Bytes, BytesMut};

use super::reply::Replies;
use super::wire::{Command, MAX_VALUE_LEN, NOT_READY, READY, STOP_WAITING, WAIT_CANCELED};
use waits::Wait;

/// A connection's id within one store.
pub type ConnId = u64;

/// Default budget of a store's keys and values: 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

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
    /// APPEND past the value limit.
    #[error("APPEND to key {key:?} would make its value {len} bytes, over the limit of {limit} bytes a value may have")]
    ValueTooLarge {
        /// The key, lossily decoded.
        key: String,
        /// The value's length after the APPEND.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// A write past the store's byte budget.
    #[error("the worker store is full: this write would bring its keys and values to {would} bytes, over its budget of {budget} bytes (raise it with --rdzv-conf store_max_bytes=BYTES)")]
    OverBudget {
        /// The total the write would make.
        would: u64,
        /// The budget.
        budget: u64,
    },
}

/// The store's keys, queues and parked waiters.
#[derive(Debug)]
pub struct State {
    kv: HashMap<Bytes, Bytes>,
    /// Never holds an empty queue.
    queues: HashMap<Bytes, VecDeque<Bytes>>,
    /// key → connections waiting for a write to it.
    waiters: HashMap<Bytes, Vec<(ConnId, u64)>>,
    waits: HashMap<ConnId, Wait>,
    next_generation: u64,
    /// Bytes of keys and values held in `kv` and `queues`.
    bytes: u64,
    max_bytes: u64,
}

impl Default for State {
    fn default() -> Self {
        Self::with_budget(DEFAULT_MAX_BYTES)
    }
}

fn lossy(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

fn len64(n: usize) -> u64 {
    n as u64
}

impl State {
    /// An empty store holding at most `max_bytes` of keys and values.
    pub fn with_budget(max_bytes: u64) -> Self {
        Self {
            kv: HashMap::new(),
            queues: HashMap::new(),
            waiters: HashMap::new(),
            waits: HashMap::new(),
            next_generation: 0,
            bytes: 0,
            max_bytes,
        }
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Serves `cmd` from connection `conn`, appending its reply to `out`.
    pub fn apply(
        &mut self,
        conn: ConnId,
        cmd: Command,
        out: &mut Replies,
    ) -> Result<Effects, ApplyError> {
        let mut fx = Effects::default();
        match cmd {
            Command::Validate(_) => return Err(ApplyError::LateValidate),
            Command::Ping(nonce) => out.raw(&nonce.to_le_bytes()),
            Command::Set(k, v) => {
                self.check_put(&k, v.len())?;
                self.put_and_notify(Bytes::from(k), Bytes::from(v), &mut fx);
            }
            Command::CompareSet {
                key,
                expected,
                desired,
            } => match self.kv.get(&key[..]) {
                // Missing key, non-empty expectation: it comes back, nothing is stored.
                None if !expected.is_empty() => out.bytes(&expected),
                Some(cur) if **cur != expected[..] => out.value(cur),
                _ => {
                    self.check_put(&key, desired.len())?;
                    let desired = Bytes::from(desired);
                    out.value(&desired);
                    self.put_and_notify(Bytes::from(key), desired, &mut fx);
                }
            },
            Command::Get(k) => match self.kv.get(&k[..]) {
                Some(v) => out.value(v),
                None => out.bytes(&[]),
            },
            Command::Add(k, delta) => {
                let v = self.add(&k, delta)?;
                out.i64(v);
                self.notify(&k, &mut fx);
            }
            Command::Check(keys) => out.byte(if keys.iter().all(|k| self.present(k)) {
                READY
            } else {
                NOT_READY
            }),
            Command::Wait(keys) => {
                let missing: Vec<Bytes> = keys
                    .into_iter()
                    .filter(|k| !self.present(k))
                    .map(Bytes::from)
                    .collect();
                if missing.is_empty() {
                    out.byte(STOP_WAITING);
                } else {
                    fx.parked = Some(self.park(conn, missing, None));
                }
            }
            Command::CancelWait => {
                // Handled by the connection, which knows whether a wake-up is in flight.
                self.cancel(conn);
                out.byte(WAIT_CANCELED);
            }
            Command::NumKeys => out.i64(self.kv.len() as i64),
            Command::DeleteKey(k) => {
                let removed = self.kv.remove_entry(&k[..]);
                if let Some((k, v)) = &removed {
                    self.bytes -= len64(k.len() + v.len());
                }
                out.i64(i64::from(removed.is_some()));
            }
            Command::Append(k, v) => {
                let old = self.kv.get(&k[..]).map_or(0, Bytes::len);
                let len = len64(old + v.len());
                if len > MAX_VALUE_LEN {
                    return Err(ApplyError::ValueTooLarge {
                        key: lossy(&k),
                        len,
                        limit: MAX_VALUE_LEN,
                    });
                }
                self.check_put(&k, old + v.len())?;
                let (k, old) = match self.kv.remove_entry(&k[..]) {
                    Some((k, old)) => {
                        self.bytes -= len64(k.len() + old.len());
                        (k, old)
                    }
                    None => (Bytes::from(k), Bytes::new()),
                };
                // Extends in place when no pending reply shares the old value.
                let mut value = BytesMut::from(old);
                value.extend_from_slice(&v);
                self.put_and_notify(k, value.freeze(), &mut fx);
            }
            Command::MultiGet(keys) => {
                for k in keys {
                    match self.kv.get(&k[..]) {
                        Some(v) => out.value(v),
                        None => out.bytes(&[]),
                    }
                }
            }
            Command::MultiSet(pairs) => {
                self.check_multi_set(&pairs)?;
                for (k, v) in pairs {
                    self.put_and_notify(Bytes::from(k), Bytes::from(v), &mut fx);
                }
            }
            Command::QueuePush(k, v) => {
                let key_cost = if self.queues.contains_key(&k[..]) {
                    0
                } else {
                    k.len()
                };
                self.charge(len64(key_cost + v.len()), 0)?;
                self.bytes += len64(key_cost + v.len());
                let k = Bytes::from(k);
                self.queues
                    .entry(k.clone())
                    .or_default()
                    .push_back(Bytes::from(v));
                self.notify_one(&k, &mut fx);
            }
            Command::QueuePop(k) => {
                let len = self.queues.get(&k[..]).map_or(0, VecDeque::len);
                out.i64(len as i64);
                if let Some(v) = self.pop(&k) {
                    out.value(&v);
                }
            }
            Command::QueueLen(k) => {
                out.i64(self.queues.get(&k[..]).map_or(0, VecDeque::len) as i64)
            }
            Command::ListKeys => {
                out.i64(self.kv.len() as i64);
                for k in self.kv.keys() {
                    out.value(k);
                }
            }
            Command::Barrier(k, world_size) => {
                let count = self.add(&k, 1)?;
                self.notify(&k, &mut fx);
                if count >= world_size {
                    out.byte(STOP_WAITING);
                } else {
                    fx.parked = Some(self.park(conn, vec![Bytes::from(k)], Some(world_size)));
                }
            }
        }
        Ok(fx)
    }

    fn present(&self, k: &[u8]) -> bool {
        self.kv.contains_key(k) || self.queues.contains_key(k)
    }

    /// Refuses a write that adds `add` bytes and frees `free` if it would
    /// take the store past its budget.
    fn charge(&self, add: u64, free: u64) -> Result<(), ApplyError> {
        let would = (self.bytes - free).saturating_add(add);
        if add > free && would > self.max_bytes {
            return Err(ApplyError::OverBudget {
                would,
                budget: self.max_bytes,
            });
        }
        Ok(())
    }

    /// The size of `k`'s current entry, if any.
    fn held(&self, k: &[u8]) -> u64 {
        self.kv.get(k).map_or(0, |v| len64(k.len() + v.len()))
    }

    /// Checks a write of a `value_len`-byte value at `k` against the budget.
    fn check_put(&self, k: &[u8], value_len: usize) -> Result<(), ApplyError> {
        self.charge(len64(k.len() + value_len), self.held(k))
    }

    /// Checks a MULTI_SET as a whole (a key named twice counts once, its last value).
    fn check_multi_set(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), ApplyError> {
        let mut last: HashMap<&[u8], usize> = HashMap::with_capacity(pairs.len());
        for (k, v) in pairs {
            last.insert(k, v.len());
        }
        let add = last.iter().map(|(k, v)| len64(k.len() + v)).sum();
        let free = last.keys().map(|k| self.held(k)).sum();
        self.charge(add, free)
    }

    /// Stores `v` at `k`, keeping the byte count.
    fn put(&mut self, k: Bytes, v: Bytes) {
        let (key_len, add) = (len64(k.len()), len64(k.len() + v.len()));
        if let Some(old) = self.kv.insert(k, v) {
            self.bytes -= key_len + len64(old.len());
        }
        self.bytes += add;
    }

    /// Stores `v` at `k` and wakes whoever waits for `k`.
    fn put_and_notify(&mut self, k: Bytes, v: Bytes, fx: &mut Effects) {
        if self.waiters.is_empty() {
            // The common case: no clone of the key (the first would allocate).
            self.put(k, v);
        } else {
            self.put(k.clone(), v);
            self.notify(&k, fx);
        }
    }

    fn pop(&mut self, k: &[u8]) -> Option<Bytes> {
        let q = self.queues.get_mut(k)?;
        let v = q.pop_front()?;
        self.bytes -= len64(v.len());
        if q.is_empty() {
            self.queues.remove(k);
            self.bytes -= len64(k.len());
        }
        Some(v)
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
        let text = next.to_string().into_bytes();
        self.check_put(k, text.len())?;
        let key = match self.kv.get_key_value(k) {
            Some((key, _)) => key.clone(),
            None => Bytes::copy_from_slice(k),
        };
        self.put(key, Bytes::from(text));
        Ok(next)
    }
}

mod waits;

#[cfg(test)]
mod fuzz_regressions;
#[cfg(test)]
mod tests;
