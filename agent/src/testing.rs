//! Test-only switches: compiled into debug builds only, for tests that must
//! show a safety check catching a broken agent. A release build has none of
//! them (each is a constant `false` there), whatever its environment says.
//!
//! * `ACCEL_TEST_BREAK_FENCE=1`: the node never fences. Its workers keep
//!   running however long the rendezvous is unreachable (the node machine's
//!   drop-limit stop is off), and the guard never kills the workers of a
//!   frozen agent. The rendezvous still drops the silent node after the
//!   drop limit, so the job re-forms beside the old workers: exactly what
//!   fencing prevents. The chaos run's test (`tests/tests/chaos.rs`) uses
//!   it to show that invariant (a) catches that.

/// Whether fencing is switched off (`ACCEL_TEST_BREAK_FENCE=1`, debug builds only).
#[cfg(debug_assertions)]
pub fn fence_broken() -> bool {
    std::env::var_os("ACCEL_TEST_BREAK_FENCE").is_some_and(|v| v == "1")
}

/// Whether fencing is switched off: never, in a release build.
#[cfg(not(debug_assertions))]
pub fn fence_broken() -> bool {
    false
}
