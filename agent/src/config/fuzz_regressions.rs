//! Inputs the `agent_flags` fuzz target (fuzz/fuzz_targets/agent_flags.rs)
//! found, with the rule they broke.

use super::*;
use accel_input::MAX_DURATION;

/// `keep_alive_interval x keep_alive_max_attempt` is sent to the server as
/// u64 milliseconds: 100 days x 4e9 attempts wrapped around (`as u64`), so
/// the server could drop a live node after any time at all. The product now
/// saturates at the ten years the server accepts.
#[test]
fn a_keep_alive_limit_beyond_ten_years_is_sent_as_ten_years() {
    let c = RdzvConf::parse("keep_alive_interval=2400h,keep_alive_max_attempt=4000000000")
        .expect("each value is within its bound");
    assert_eq!(c.dead_after(), MAX_DURATION);
    let sent = crate::deadline::millis(c.dead_after());
    assert_eq!(u128::from(sent), MAX_DURATION.as_millis());
}
