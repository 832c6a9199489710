//! Settings that are each valid but cannot work together, found once at
//! start: each gets one warning that names both values and says what will
//! happen, and where accel can make the pair work it says how it does.
//!
//! # Why here
//! The failover of an agent-only rendezvous (`--rdzv-backend etcd`) is
//! timed by two clocks the user sets apart: the etcd lease (`etcd_lease`,
//! how long a dead hosting agent keeps its place) and the keep-alive limit
//! (`keep_alive_interval × keep_alive_max_attempt`, how long a node keeps
//! its workers without a rendezvous before it stops them: fencing). A
//! fencing limit shorter than the lease plus an election stops every
//! survivor's workers before a new host can serve them; a
//! `reconnect_grace` that short ends the survivors' agents before it. Both
//! look like fast failure detection, and both turn a host's death into
//! something slower or fatal, so they are said at start rather than
//! discovered in a failover.

use std::time::Duration;

use super::{RdzvConf, Rendezvous};

/// How long, beyond its etcd lease, an agent-only rendezvous may take to be
/// served again after its hosting agent died: etcd elects the next
/// candidate as soon as the lease ends, the new host loads the job with a
/// few reads, and agents follow the election as it changes (or within 2 s
/// when etcd's stream is silent).
pub const ELECTION: Duration = Duration::from_secs(3);

/// How long a node that lost the rendezvous keeps trying to rejoin:
/// `reconnect_grace`, but in an agent-only rendezvous on etcd never less
/// than the lease plus [`ELECTION`] (a shorter grace would end every
/// survivor's agent before a new host can serve).
pub fn rejoin_grace(rendezvous: &Rendezvous, rdzv: &RdzvConf) -> Duration {
    match rendezvous {
        Rendezvous::Etcd { .. } => rdzv.reconnect_grace.max(failover(rdzv)),
        _ => rdzv.reconnect_grace,
    }
}

/// How long the guard lets a frozen agent's workers run (SIGSTOP, a hung
/// host; see `guard`): the drop limit, but in an agent-only rendezvous on
/// etcd at most half the lease. There the rendezvous also drops a node
/// once its presence lease ends, which a frozen agent cannot renew: the
/// lease was last renewed at most a third of it before the freeze (it is
/// renewed every third), so it ends at least two thirds of it after the
/// freeze, and the workers must be gone before then.
pub fn frozen_limit(rendezvous: &Rendezvous, rdzv: &RdzvConf) -> Duration {
    match rendezvous {
        Rendezvous::Etcd { .. } => rdzv.dead_after().min(rdzv.etcd.lease / 2),
        _ => rdzv.dead_after(),
    }
}

/// The longest a hosting agent's death leaves the job unserved.
fn failover(rdzv: &RdzvConf) -> Duration {
    rdzv.etcd.lease.saturating_add(ELECTION)
}

/// One warning for each pair of settings that cannot work together.
pub fn conflicts(rendezvous: &Rendezvous, rdzv: &RdzvConf) -> Vec<String> {
    let mut warnings = Vec::new();
    if !matches!(rendezvous, Rendezvous::Etcd { .. }) {
        return warnings;
    }
    let lease = rdzv.etcd.lease;
    let failover = failover(rdzv);
    let drop_limit = rdzv.dead_after();
    if drop_limit < failover {
        warnings.push(format!(
            "--rdzv-conf keep_alive_interval × keep_alive_max_attempt = {} (the drop limit) is shorter than \
             etcd_lease = {} plus an election ({}): if the agent hosting the rendezvous dies, the other nodes \
             stop their workers (fencing) before a new host can serve them, so the job re-forms on the new host \
             (no restart is counted) instead of running on; for workers to ride out a failover, make the drop \
             limit at least {}",
            secs(drop_limit),
            secs(lease),
            secs(ELECTION),
            secs(failover),
        ));
    }
    if rdzv.reconnect_grace < failover {
        warnings.push(format!(
            "--rdzv-conf reconnect_grace = {} is shorter than etcd_lease = {} plus an election ({}): a node \
             that loses the agent hosting the rendezvous could not reach the new host in time, so it keeps \
             trying to rejoin for {} instead",
            secs(rdzv.reconnect_grace),
            secs(lease),
            secs(ELECTION),
            secs(failover),
        ));
    }
    warnings
}

/// `5 s`, `1.5 s`, `0.25 s`.
fn secs(d: Duration) -> String {
    let s = format!("{:.3}", d.as_secs_f64());
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} s")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd() -> Rendezvous {
        Rendezvous::Etcd {
            endpoints: vec!["http://127.0.0.1:2379".into()],
        }
    }

    fn conf(s: &str) -> RdzvConf {
        RdzvConf::parse(s).expect("valid --rdzv-conf")
    }

    #[test]
    fn a_frozen_agent_is_fenced_before_its_presence_lease_can_end() {
        let c = conf("keep_alive_interval=1,keep_alive_max_attempt=3,etcd_lease=2");
        assert_eq!(frozen_limit(&etcd(), &c), Duration::from_secs(1));
        // The drop limit when it is the shorter one.
        let c = conf("keep_alive_interval=0.5,keep_alive_max_attempt=2,etcd_lease=10");
        assert_eq!(frozen_limit(&etcd(), &c), Duration::from_secs(1));
        // No presence lease with a server: the drop limit alone.
        let c = conf("etcd_lease=2");
        assert_eq!(
            frozen_limit(&Rendezvous::Standalone, &c),
            Duration::from_secs(15)
        );
    }

    #[test]
    fn the_defaults_work_together() {
        assert_eq!(conflicts(&etcd(), &conf("")), Vec::<String>::new());
        assert_eq!(
            rejoin_grace(&etcd(), &conf("")),
            Duration::from_secs(60),
            "the default grace is long enough"
        );
    }

    #[test]
    fn a_drop_limit_shorter_than_the_lease_and_an_election_is_one_warning_naming_both() {
        let c = conf("keep_alive_interval=0.5,keep_alive_max_attempt=2");
        let w = conflicts(&etcd(), &c);
        assert_eq!(w.len(), 1, "{w:?}");
        for part in [
            "= 1 s (the drop limit)",
            "etcd_lease = 5 s",
            "fencing",
            "re-forms on the new host",
            "no restart is counted",
            "at least 8 s",
        ] {
            assert!(w[0].contains(part), "{part:?} missing in {}", w[0]);
        }
        // Just long enough: no warning.
        let c = conf("keep_alive_interval=4,keep_alive_max_attempt=2,etcd_lease=5");
        assert!(conflicts(&etcd(), &c).is_empty());
        // A longer lease needs a longer limit.
        let c = conf("etcd_lease=20");
        let w = conflicts(&etcd(), &c);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("= 15 s (the drop limit)") && w[0].contains("etcd_lease = 20 s"));
    }

    #[test]
    fn a_short_reconnect_grace_is_raised_to_the_lease_and_an_election_with_one_warning() {
        let c = conf("reconnect_grace=2,etcd_lease=4");
        let w = conflicts(&etcd(), &c);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("reconnect_grace = 2 s")
                && w[0].contains("etcd_lease = 4 s")
                && w[0].contains("for 7 s instead"),
            "{}",
            w[0]
        );
        assert_eq!(rejoin_grace(&etcd(), &c), Duration::from_secs(7));
        // Both at once: two warnings, one each.
        let c = conf("reconnect_grace=1.5,keep_alive_interval=0.25,keep_alive_max_attempt=2");
        let w = conflicts(&etcd(), &c);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("= 0.5 s (the drop limit)"), "{}", w[0]);
        assert!(w[1].contains("reconnect_grace = 1.5 s"), "{}", w[1]);
    }

    #[test]
    fn other_backends_have_no_lease_to_conflict_with() {
        let c = conf("reconnect_grace=1,keep_alive_interval=0.5,keep_alive_max_attempt=2");
        let c10d = Rendezvous::C10d {
            host: "head".into(),
            port: 29400,
            replicas: Vec::new(),
        };
        assert!(conflicts(&c10d, &c).is_empty());
        assert!(conflicts(&Rendezvous::Standalone, &c).is_empty());
        assert_eq!(rejoin_grace(&c10d, &c), Duration::from_secs(1), "as given");
    }
}
