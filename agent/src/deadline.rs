//! Deadlines and wire values computed from durations a person chose.
//!
//! The parsers bound every duration to ten years
//! ([`accel_input::MAX_DURATION`]), so `now + timeout` fits in
//! the clock today. Before that bound, `--rdzv-conf join_timeout=1e19` made
//! `Instant + Duration` overflow and abort the agent, and
//! `--exit-barrier-timeout 1e19` aborted it after the job had succeeded.
//! These helpers saturate instead of panicking, so a derived duration (a
//! product such as `keep_alive_interval × keep_alive_max_attempt`) or a
//! future bound cannot bring that back.

use std::time::{Duration, Instant};

/// About thirty years: "never" for any deadline this agent waits on.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);

/// The instant `d` from now on the runtime's clock (for a timer), or a
/// far future one when that does not fit.
pub(crate) fn after(d: Duration) -> tokio::time::Instant {
    after_from(tokio::time::Instant::now().into_std(), d).into()
}

/// The instant `d` after `now`, or a far future one when that does not fit.
pub(crate) fn after_from(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// `d` in whole milliseconds for the wire, at most the ten years the
/// rendezvous accepts (`as u64` would wrap a huge value to a small one, and
/// the server refuses a longer one).
pub(crate) fn millis(d: Duration) -> u64 {
    let d = d.min(accel_input::MAX_DURATION);
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_saturate() {
        let now = tokio::time::Instant::now();
        let five = after(Duration::from_secs(5)) - now;
        assert!(five >= Duration::from_secs(5) && five < Duration::from_secs(6));
        let far = after(Duration::MAX);
        assert!(far - now >= FAR_FUTURE, "Duration::MAX saturates far away");
    }

    #[test]
    fn millis_saturate() {
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        let max = accel_input::MAX_DURATION.as_millis() as u64;
        assert_eq!(millis(Duration::MAX), max);
        assert_eq!(
            millis(Duration::from_secs(315_576_000).saturating_mul(u32::MAX)),
            max,
            "ten years times the largest keep_alive_max_attempt"
        );
    }
}
