//! A node's session secret: 128 random bits handed out in `Joined`, which
//! every later call for that node must present.
//!
//! The rendezvous token proves a caller belongs to the cluster; the session
//! secret proves it is the agent that joined as this node. Without it, anyone
//! holding the token could report failures for another node (spending the
//! job's restart budget), make it leave, or keep a dead node alive. The
//! secret is part of the job's state (a member carries it), so a state store
//! that persists jobs keeps it; it is generated outside the state machine so
//! the machine stays deterministic under test.

use std::fmt;

/// Length of a session secret in bytes.
pub const SESSION_BYTES: usize = 16;

/// One node's session secret. Its `Debug` output never shows the bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Session([u8; SESSION_BYTES]);

impl Session {
    /// A secret with these bytes (the service draws them from the OS's
    /// random source; tests pick them).
    pub const fn from_bytes(bytes: [u8; SESSION_BYTES]) -> Self {
        Self(bytes)
    }

    /// The bytes, for a job store's record.
    pub fn bytes(self) -> [u8; SESSION_BYTES] {
        self.0
    }

    /// The bytes to send to the node.
    pub fn to_vec(self) -> Vec<u8> {
        self.0.to_vec()
    }

    /// Whether `presented` is this secret, in time that does not depend on
    /// where the bytes differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(&self.0, presented)
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Session(..)")
    }
}

use accel_wire::auth::constant_time_eq;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_same_bytes() {
        let s = Session::from_bytes([7; SESSION_BYTES]);
        assert!(s.matches(&[7; SESSION_BYTES]));
        assert!(!s.matches(&[7; SESSION_BYTES - 1]));
        assert!(!s.matches(&[]));
        let mut other = [7; SESSION_BYTES];
        other[15] = 8;
        assert!(!s.matches(&other));
        assert_eq!(format!("{s:?}"), "Session(..)");
    }
}
