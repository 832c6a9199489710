//! Inputs the `agent_flags` fuzz target (fuzz/fuzz_targets/agent_flags.rs)
//! found, with the rule they broke.

use super::*;
use rendezvous_server::config::MAX_DURATION;

/// `keep_alive_interval x keep_alive_max_attempt` is sent to the server as
/// u64 milliseconds: 100 days x 4e9 attempts wrapped around (`as u64`), so
/// the server could drop a live node after any time at all.
#[test]
fn a_keep_alive_limit_beyond_ten_years_is_refused() {
    let e = RdzvConf::parse("keep_alive_interval=2400h,keep_alive_max_attempt=4000000000")
        .expect_err("refused");
    assert!(
        e.0.contains("keep_alive_interval 8640000s x keep_alive_max_attempt 4000000000 is longer than 10 years"),
        "{e}"
    );
    let c = RdzvConf::parse("keep_alive_interval=1h,keep_alive_max_attempt=87600").expect("10 years");
    assert_eq!(c.keep_alive_interval * c.keep_alive_max_attempt, MAX_DURATION);
}
