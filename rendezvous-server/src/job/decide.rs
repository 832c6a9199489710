//! The pure decisions: whether a forming round completes, who is lost, and
//! the node-rank order. Each reads a [`Job`] and the current instant and
//! changes nothing.

use std::time::{Duration, Instant};

use super::{Job, Phase, ABSENT};

/// What [`decide`] concluded for a job at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do.
    Idle,
    /// Still forming: `ready` of `needed` nodes are ready.
    Wait {
        /// Members ready for the round.
        ready: u32,
        /// Ready members the round needs before it may start (MIN).
        needed: u32,
        /// When the last call ends, once MIN are ready.
        last_call_ends: Option<Instant>,
    },
    /// Complete the round with these node ids, in node-rank order.
    Complete(Vec<String>),
}

/// Whether the forming round completes at `now`. O(1) unless it would
/// complete (then O(members)).
///
/// A round completes at MAX ready nodes, or at MIN once the last call (which
/// starts when MIN are ready) ends. A job re-forming after a round ran starts
/// as soon as every remaining member is ready: there is nobody to wait for.
/// With `--nnodes-multiple-of K`, MIN counts as the first multiple of K from
/// MIN, and the round takes the largest multiple of K of the ready nodes
/// ([`super::JobConfig::allowed`]); the others wait as spares.
///
/// # Never beside a node that may not have heard
/// Whichever way it would complete, a round waits while a node of the last
/// round that ran is still a member and not ready, for at most the drop
/// limit from the restart: it may not have heard the restart (cut off from
/// the server's events) and still run that round's workers, whose ranks
/// the new round would give to others. A node that hears nothing from the
/// server stops its workers itself (fencing) within the drop limit of the
/// last call it had answered, which is no later than the restart; one
/// that heard it is stopping them (or backing off, its workers gone), and
/// need not hold the others up longer. So no two live workers hold one
/// rank, whatever the last call says.
///
/// For the same while, it waits for a member not ready yet that would take
/// a departed node's place (a spare of that place's topology segment), so
/// that the place is filled rather than closed (see `replacement_pending`).
pub fn decide(now: Instant, job: &Job) -> Decision {
    if job.phase != Phase::Forming {
        return Decision::Idle;
    }
    let c = &job.config;
    let ready = job.ready;
    let needed = c.needed();
    let wait = |last_call_ends| Decision::Wait {
        ready,
        needed,
        last_call_ends,
    };
    if ready < needed || c.allowed(ready) == 0 {
        return wait(None);
    }
    // The most the job can use (MAX, or the largest multiple of K under it).
    if ready >= c.allowed(c.max_nodes) {
        return complete_unless_unheard(now, job, wait);
    }
    // Benched members (the `quarantine` module) are nobody to wait for as
    // places to fill; but one of the last round that has not offered itself
    // may still run that round's workers (its other workers stop after its
    // failure report), so it is waited for as below.
    if !job.participants.is_empty() && ready as usize + job.benched as usize == job.members.len() {
        // (A store-less server's held job waits all the same: a node of a
        // round it never saw may be running: `Job::hold_until`.)
        let held = job.held_until.is_some_and(|t| now < t);
        return match (job.benched, held) {
            (0, false) => Decision::Complete(rank_order(job)),
            _ => complete_unless_unheard(now, job, wait),
        };
    }
    let since = job.min_ready_since.unwrap_or(now);
    let ends = since.checked_add(c.last_call).unwrap_or(since);
    if now >= ends {
        return complete_unless_unheard(now, job, wait);
    }
    wait(Some(ends))
}

/// Completes the round unless a node of the last round may still run its
/// workers without having heard the restart (see [`decide`]): then waits
/// until that may no longer be (its readiness, departure or drop decides
/// sooner).
fn complete_unless_unheard(
    now: Instant,
    job: &Job,
    wait: impl Fn(Option<Instant>) -> Decision,
) -> Decision {
    if let Some(t) = job.held_until.filter(|t| now < *t) {
        return wait(Some(t));
    }
    let until = job.forming_since.map(|since| match job.config.dead_after {
        Some(d) => since.checked_add(d),
        None => None,
    });
    let blocking = match until {
        // Most of the last round is silent: they may run their workers on
        // their peers' word until the outage limit, so nothing forms
        // without them meanwhile.
        _ if job.held.is_some() => true,
        None => false,
        Some(Some(t)) => now < t,
        // No drop limit: a node never fences, so it is waited for.
        Some(None) => true,
    };
    // A spare is waited for only within a drop limit: without one, a spare
    // that never offers itself would hold the job forever.
    let bounded = matches!(until, Some(Some(_)));
    let unheard = blocking
        && (job
            .members
            .values()
            .any(|m| m.rank.is_some() && m.ready.is_none() && !m.succeeded)
            || (bounded && replacement_pending(job)));
    match unheard {
        // A hold ends at a liveness check, not at an instant known now.
        true if job.held.is_some() => wait(None),
        true => wait(until.flatten()),
        false => Decision::Complete(rank_order(job)),
    }
}

/// Whether a departed node's place would close for want of a spare of its
/// segment (see the `placement` module) that is a member but not ready yet:
/// the places of a segment whose nodes are gone outnumber that segment's
/// ready newcomers, and one of its newcomers is not ready. The round waits
/// for it as for the last round's nodes ([`decide`]), within the drop
/// limit: a spare offers itself as soon as it hears the restart, but a node
/// of the last round may be quicker, and completing without the spare would
/// close the place and move every node after it. O(members).
pub(super) fn replacement_pending(job: &Job) -> bool {
    if job.members.values().any(|m| m.requested_rank.is_some()) {
        return false;
    }
    let mut held = vec![false; job.slot_topologies.len()];
    for m in job.members.values().filter(|m| !job.is_benched(m)) {
        if let Some(h) = m.rank.and_then(|r| held.get_mut(r as usize)) {
            *h = true;
        }
    }
    // Per segment: its places whose node is gone, less its ready newcomers.
    let mut open: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for (t, held) in job.slot_topologies.iter().zip(&held) {
        if let (Some(t), false) = (t.as_deref(), *held) {
            *open.entry(t).or_default() += 1;
        }
    }
    if open.is_empty() {
        return false;
    }
    // A benched member takes no place, so it is not waited for.
    for m in job
        .members
        .values()
        .filter(|m| m.rank.is_none() && m.ready.is_some() && !job.is_benched(m))
    {
        if let Some(n) = open.get_mut(&*m.topology) {
            *n -= 1;
        }
    }
    job.members.values().any(|m| {
        m.rank.is_none()
            && m.ready.is_none()
            && !job.is_benched(m)
            && open.get(&*m.topology).is_some_and(|n| *n > 0)
    })
}

/// Members silent for longer than the job's keep-alive limit, on the
/// server's clock, and the earliest instant another member could be lost
/// (`None`: none can). O(members); run only when a liveness check is due.
///
/// A relearned job's placeholders are lost after [`Job::placeholder_limit`]
/// even when the job has no keep-alive limit.
///
/// # Mass silence
/// When most of the last round that ran is silent at once ([`mass_silence`])
/// the rendezvous itself is the likely one cut off (or it just woke up), and
/// the round's nodes keep their workers while most of them see each other
/// (the agent's peer hub). Their places are then held for the job's outage
/// limit instead of the drop limit; when the silence ends, every node gets
/// the whole drop limit from then ([`Job::tick`]). Checks run again as each
/// member of the round would turn silent, so a mass silence is seen as it
/// begins.
pub fn liveness(now: Instant, job: &Job) -> (Vec<String>, Option<Instant>) {
    if job.phase.is_terminal() || (job.config.dead_after.is_none() && job.absent == 0) {
        return (Vec::new(), None);
    }
    let mass = job.held.is_some() || mass_silence(now, job);
    let mut lost = Vec::new();
    let mut next: Option<Instant> = None;
    let mut consider = |at: Instant| next = Some(next.map_or(at, |n: Instant| n.min(at)));
    for (id, m) in &job.members {
        let dead_after = if id.starts_with(ABSENT) {
            job.placeholder_limit()
        } else {
            match job.config.dead_after {
                Some(d) => d,
                None => continue,
            }
        };
        let dead_after = match (mass, job.config.outage, m.rank) {
            (true, Some(outage), Some(_)) => dead_after.max(outage),
            _ => dead_after,
        };
        if let (Some(silent), Some(_), Some(_)) =
            (job.config.silent_after(), job.config.outage, m.rank)
        {
            // When this member turns silent: a mass silence may begin.
            // Silent strictly after `silent` (as `mass_silence` counts),
            // so check just past it: a check at `heard + silent` exactly
            // neither counted it nor came again
            // (sim/scenarios/mass_silence_boundary.sim).
            let at = job
                .heard(m)
                .checked_add(silent + Duration::from_millis(1))
                .unwrap_or(now);
            if at > now {
                consider(at);
            }
        }
        let heard = job.heard(m);
        if now.saturating_duration_since(heard) > dead_after {
            lost.push(id.clone());
        } else {
            // Lost strictly after the limit: check again just past it.
            let at = heard
                .checked_add(dead_after + Duration::from_millis(1))
                .unwrap_or(now);
            consider(at);
        }
    }
    if mass {
        // Watch for its end.
        let every = job.config.silent_after().unwrap_or(MASS_RECHECK) / 2;
        consider(now.checked_add(every.max(MASS_RECHECK_MIN)).unwrap_or(now));
    }
    (lost, next)
}

/// How often a held job checks whether its silence ended, when its
/// keep-alive interval does not say.
const MASS_RECHECK: Duration = Duration::from_secs(2);
/// The least time between those checks.
const MASS_RECHECK_MIN: Duration = Duration::from_millis(50);

/// Whether most of the last round that ran (more than half of its node
/// ranks, placeholders of a relearned job included) is silent at `now`:
/// unheard for [`super::JobConfig::silent_after`]. Only for jobs whose
/// agents keep workers through an outage (`outage` set); a departed node
/// counts as heard (its workers are stopped). O(round).
pub fn mass_silence(now: Instant, job: &Job) -> bool {
    let (Some(silent), Some(_)) = (job.config.silent_after(), job.config.outage) else {
        return false;
    };
    if job.phase.is_terminal() || job.participants.is_empty() {
        return false;
    }
    let quiet = job
        .participants
        .iter()
        .filter_map(|id| job.members.get(id))
        .filter(|m| m.rank.is_some() && now.saturating_duration_since(job.heard(m)) > silent)
        .count();
    2 * quiet > job.participants.len()
}

/// Ready members in node-rank order, at most MAX and a count the job can
/// use ([`super::JobConfig::allowed`]; see the module docs of [`super`]):
/// requested ranks for static rendezvous; otherwise the topology-following
/// order of the `placement` module.
pub fn rank_order(job: &Job) -> Vec<String> {
    let mut order: Vec<String> = if job.members.values().any(|m| m.requested_rank.is_some()) {
        // A member without a rank of its own may be benched.
        let mut v: Vec<_> = job
            .members
            .iter()
            .filter(|(_, m)| m.ready.is_some() && !job.is_benched(m))
            .collect();
        v.sort_by_key(|(_, m)| m.requested_rank);
        v.into_iter().map(|(id, _)| id.clone()).collect()
    } else {
        super::placement::dynamic_order(job)
    };
    let n = u32::try_from(order.len()).unwrap_or(u32::MAX);
    order.truncate(job.config.allowed(n) as usize);
    order
}
