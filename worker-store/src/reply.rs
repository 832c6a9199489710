//! Replies waiting to be written to one connection.
//!
//! Small replies (integers, status bytes, short values) are copied into one
//! growing buffer; a larger value is not copied at all but shared with the
//! store ([`Bytes`] is reference-counted). Without that, one MULTI_GET naming
//! a maximal value 128 Ki times would build a 1 TiB reply, and every GET of
//! a large value a copy of it per reader. [`Replies::len`] counts both kinds,
//! so the connection's backpressure rule ("stop processing past ~1 MiB of
//! unwritten replies") bounds what a client that does not read can pin.
//!
//! [`Replies`] is a [`Buf`], so the connection writes it with one vectored
//! write where the socket allows.

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Values at most this long are copied into the reply; longer ones are shared.
const COPY_UP_TO: usize = 1024;

/// Replies in order, not yet written.
#[derive(Debug, Default)]
pub struct Replies {
    /// Complete pieces, oldest first.
    chunks: VecDeque<Bytes>,
    /// Small replies appended since the last shared value.
    tail: BytesMut,
    /// Bytes in `chunks` and `tail`.
    len: usize,
}

impl Replies {
    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One status byte.
    pub fn byte(&mut self, b: u8) {
        self.tail.put_u8(b);
        self.len += 1;
    }

    /// Raw bytes, copied (ping nonces and the like).
    pub fn raw(&mut self, b: &[u8]) {
        self.tail.extend_from_slice(b);
        self.len += b.len();
    }

    /// A little-endian `i64`.
    pub fn i64(&mut self, v: i64) {
        self.raw(&v.to_le_bytes());
    }

    /// A `u64` length and the value, shared with the store when it is large.
    pub fn value(&mut self, v: &Bytes) {
        self.raw(&(v.len() as u64).to_le_bytes());
        if v.len() <= COPY_UP_TO {
            self.raw(v);
            return;
        }
        self.seal();
        self.chunks.push_back(v.clone());
        self.len += v.len();
    }

    /// A `u64` length and bytes that are not shared (always copied).
    pub fn bytes(&mut self, v: &[u8]) {
        self.raw(&(v.len() as u64).to_le_bytes());
        self.raw(v);
    }

    /// Moves the small replies into `chunks`, so the whole is one sequence.
    fn seal(&mut self) {
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
    }

    /// Readies everything for writing: [`Buf`] sees only sealed chunks.
    pub fn flush_tail(&mut self) {
        self.seal();
    }

    /// Everything, concatenated (for tests and the fuzz target's model).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in &self.chunks {
            v.extend_from_slice(c);
        }
        v.extend_from_slice(&self.tail);
        v
    }
}

impl Buf for Replies {
    fn remaining(&self) -> usize {
        self.len - self.tail.len()
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |c| &c[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            let n = cnt.min(front.len());
            front.advance(n);
            self.len -= n;
            cnt -= n;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, c) in dst.iter_mut().zip(&self.chunks) {
            *slot = std::io::IoSlice::new(c);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_replies_are_copied_and_large_values_shared() {
        let mut r = Replies::default();
        r.byte(7);
        r.i64(-1);
        let small = Bytes::from_static(b"abc");
        r.value(&small);
        let big = Bytes::from(vec![9u8; COPY_UP_TO + 1]);
        r.value(&big);
        r.byte(1);
        let want_len = 1 + 8 + 8 + 3 + 8 + big.len() + 1;
        assert_eq!(r.len(), want_len);
        let flat = r.to_vec();
        assert_eq!(flat.len(), want_len);
        assert_eq!(&flat[..1], &[7]);
        assert_eq!(&flat[17..20], b"abc");
        assert_eq!(flat[flat.len() - 1], 1);
        r.flush_tail();
        // The large value is the store's own allocation, not a copy.
        assert!(r.chunks.iter().any(|c| c.as_ptr() == big.as_ptr()));
        let mut written = Vec::new();
        while r.has_remaining() {
            let c = r.chunk();
            let n = c.len().min(5); // partial writes
            written.extend_from_slice(&c[..n]);
            r.advance(n);
        }
        assert_eq!(written, flat);
        assert!(r.is_empty());
    }
}
