//! Which endpoint a join tries next, and when: a pure machine.
//!
//! # Why
//! A join walks a list of replicas (or asks its own replica of an
//! agent-run rendezvous who leads), follows a named leader, backs off once
//! every endpoint failed, tries a published leader that does not serve less
//! often than the local replica is asked, and gives up at the deadline with
//! a message that says what to check. Written as one async loop, those
//! rules had eight mutable variables and could only be tested against real
//! servers. Here they are a [`Walk`]: the caller reports what an attempt
//! did ([`Walk::failed`]) and does what the walk says ([`Step`]); the
//! connection, the timer and the log line stay in `client.rs`.

use std::time::{Duration, Instant};

use crate::client::{retry_delays, split_host_port, JoinError, Leaders};

/// How long a connection to a published leader may take (a dead node's
/// address answers nothing), and to any other endpoint at most.
pub(crate) const PUBLISHED_CONNECT: Duration = Duration::from_secs(2);
const ENDPOINT_CONNECT: Duration = Duration::from_secs(10);
/// How often a named leader that does not serve is tried again, at first.
pub(crate) const LEADER_RETRY: Duration = Duration::from_millis(250);
/// How often "waiting for the rendezvous" is said while it lasts.
const NOTICE_EVERY: Duration = Duration::from_secs(10);

/// What to do next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Try to join at this endpoint, connecting within `connect`; report
    /// a failure with [`Walk::failed`].
    Try {
        /// The endpoint.
        host: String,
        /// Its port.
        port: u16,
        /// Its index among the endpoints (a published leader: the first's).
        at: usize,
        /// The connect timeout.
        connect: Duration,
    },
    /// Wait this long, then ask [`Walk::next`].
    Wait(Duration),
    /// Give up.
    Fail(JoinError),
}

/// A walk over the endpoints of one join (see `RdzvClient::join`).
pub(crate) struct Walk {
    endpoints: Vec<(String, u16)>,
    avoid: Option<(String, u16)>,
    leaders: Leaders,
    read_timeout: Duration,
    deadline: Instant,
    started: Instant,
    /// Backoff once every endpoint failed.
    delays: Box<dyn Iterator<Item = Duration> + Send>,
    /// Backoff between tries of a published leader that does not serve.
    leader_delays: Box<dyn Iterator<Item = Duration> + Send>,
    /// The published leader that failed last.
    failed_leader: Option<(String, u16)>,
    /// The endpoint tried next (when no leader is followed).
    at: usize,
    /// Endpoints that are not avoided.
    walked: usize,
    /// Failures since the last backoff.
    tried: usize,
    /// A leader this agent's own replica named, tried next.
    published: Option<(String, u16)>,
    /// The endpoint being tried, and whether it is a followed leader.
    trying: Option<((String, u16), bool)>,
    /// When "waiting for the rendezvous" was last said.
    last_notice: Option<Instant>,
    /// What to say now, if anything: the endpoint and the error.
    notice: Option<(String, String)>,
}

impl Walk {
    /// A walk over `endpoints` that never tries `avoid`, from `now` until
    /// `deadline`. `None`: every endpoint is avoided (only the silent one is
    /// left, which the caller tries on its own). `retry_max`: the longest
    /// backoff of a walk over listed replicas.
    pub(crate) fn new(
        endpoints: &[(String, u16)],
        leaders: Leaders,
        avoid: Option<&(String, u16)>,
        read_timeout: Duration,
        retry_max: Duration,
        now: Instant,
        deadline: Instant,
    ) -> Result<Option<Self>, JoinError> {
        if endpoints.is_empty() {
            return Err(JoinError::Config("no rendezvous endpoint".into()));
        }
        let avoided = |e: &(String, u16)| avoid == Some(e);
        let walked = endpoints.iter().filter(|e| !avoided(e)).count();
        let Some(at) = endpoints.iter().position(|e| !avoided(e)) else {
            return Ok(None);
        };
        // Asking this agent's own replica who leads costs a loopback call:
        // ask often, so a new leader is found as soon as it is elected.
        // Leaving a silent leader, a new one is found as soon as the
        // others name it.
        let delays = retry_delays(match (leaders, avoid) {
            (Leaders::Listed, None) => retry_max,
            (Leaders::Listed, Some(_)) => LEADER_RETRY,
            (Leaders::Published, _) => Duration::from_millis(100),
        });
        Ok(Some(Self {
            endpoints: endpoints.to_vec(),
            avoid: avoid.cloned(),
            leaders,
            read_timeout,
            deadline,
            started: now,
            delays: Box::new(delays),
            // A named leader that does not serve (dead, still loading) is
            // tried again less often than the local replica is asked (a
            // thousand nodes must not open thousands of connections a
            // second to it), but often enough that its successor is found
            // within half a second of being named; a newly named one at once.
            leader_delays: Box::new(retry_delays(LEADER_RETRY)),
            failed_leader: None,
            at,
            walked,
            tried: 0,
            published: None,
            trying: None,
            // Agents on etcd elect the host as they start: say nothing of a
            // wait that short.
            last_notice: match leaders {
                Leaders::Listed => None,
                Leaders::Published => now.checked_sub(Duration::from_secs(7)),
            },
            notice: None,
        }))
    }

    /// The next endpoint to try: a published leader if one was just named,
    /// else the walk's current one.
    pub(crate) fn next(&mut self) -> Step {
        let following = self.published.take();
        let is_leader = following.is_some();
        let (target, connect) = match following {
            // A dead node's address answers nothing: a published leader
            // gets a short connect, so a new one is asked for soon.
            Some(l) => (l, self.read_timeout.min(PUBLISHED_CONNECT)),
            None => (
                self.endpoints[self.at].clone(),
                self.read_timeout.min(ENDPOINT_CONNECT),
            ),
        };
        let step = Step::Try {
            host: target.0.clone(),
            port: target.1,
            at: self.at,
            connect,
        };
        self.trying = Some((target, is_leader));
        step
    }

    /// The attempt [`Walk::next`] asked for failed at `now` with `error`;
    /// `leader`: the leader the endpoint named, if it named one.
    pub(crate) fn failed(&mut self, now: Instant, error: &str, leader: Option<&str>) -> Step {
        let Some((current, following)) = self.trying.take() else {
            return self.next();
        };
        if now >= self.deadline {
            return Step::Fail(self.timeout(now, error));
        }
        if self
            .last_notice
            .is_none_or(|t| now.saturating_duration_since(t) >= NOTICE_EVERY)
        {
            self.notice = Some((format!("{}:{}", current.0, current.1), error.to_owned()));
            self.last_notice = Some(now);
        }
        let left = self.deadline.saturating_duration_since(now);
        if self.leaders == Leaders::Published && !following && self.at == 0 {
            // This agent's replica named the leader: go there (at once,
            // unless it is the one that just failed). The silent leader,
            // named until its lease runs out, is tried beside this walk,
            // not by it.
            if let Some(l) = leader.and_then(split_host_port) {
                if l != current && !self.avoided(&l) {
                    if self.failed_leader.as_ref() != Some(&l) {
                        self.leader_delays = Box::new(retry_delays(LEADER_RETRY));
                    }
                    self.published = Some(l);
                    return self.next();
                }
            }
        }
        if following {
            let delay = self.leader_delays.next().unwrap_or(Duration::from_secs(2));
            self.failed_leader = Some(current);
            return Step::Wait(delay.min(left));
        }
        let named_leader = leader.and_then(|l| {
            self.endpoints.iter().position(|(h, p)| {
                (l == format!("{h}:{p}") || l == format!("[{h}]:{p}"))
                    && !self.avoided(&(h.clone(), *p))
            })
        });
        self.at = match named_leader {
            // A follower named the leader: go there next.
            Some(i) if i != self.at => i,
            _ => {
                let mut next = (self.at + 1) % self.endpoints.len();
                while self.avoided(&self.endpoints[next]) {
                    next = (next + 1) % self.endpoints.len();
                }
                next
            }
        };
        // Back off once as many attempts as there are endpoints failed,
        // however they were chosen (two replicas naming each other while a
        // new leader loads must not become a busy loop).
        self.tried += 1;
        if self.tried >= self.walked {
            self.tried = 0;
            let delay = self.delays.next().unwrap_or(Duration::from_secs(2));
            return Step::Wait(delay.min(left));
        }
        self.next()
    }

    /// What to say of the wait, if it is time to: the endpoint tried last
    /// and why it failed.
    pub(crate) fn take_notice(&mut self) -> Option<(String, String)> {
        self.notice.take()
    }

    fn avoided(&self, e: &(String, u16)) -> bool {
        self.avoid.as_ref() == Some(e)
    }

    fn timeout(&self, now: Instant, error: &str) -> JoinError {
        let waited = now.saturating_duration_since(self.started).as_secs_f64();
        match self.leaders {
            Leaders::Published => JoinError::Timeout(format!(
                "no agent of the job was elected to host the rendezvous through etcd within {waited:.0} s ({error}); \
                 check that etcd answers at --rdzv-endpoint (and --rdzv-conf protocol, cacert, cert, key), \
                 and the other agents' logs"
            )),
            Leaders::Listed => JoinError::Timeout(format!(
                "could not reach the rendezvous at {} within {waited:.0} s ({error}); \
                 start rdzv-server there (or the node-rank-0 agent for static rendezvous), \
                 or fix --rdzv-endpoint / --master-addr",
                self.endpoints
                    .iter()
                    .map(|(h, p)| format!("{h}:{p}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eps(n: u16) -> Vec<(String, u16)> {
        (0..n).map(|i| (format!("10.0.0.{i}"), 29400)).collect()
    }

    fn tried(step: &Step) -> (String, usize, Duration) {
        match step {
            Step::Try {
                host, at, connect, ..
            } => (host.clone(), *at, *connect),
            other => panic!("not a try: {other:?}"),
        }
    }

    fn walk(n: u16, leaders: Leaders, avoid: Option<&(String, u16)>, t: Instant) -> Walk {
        let read = Duration::from_secs(60);
        Walk::new(
            &eps(n),
            leaders,
            avoid,
            read,
            Duration::from_secs(2),
            t,
            t + read,
        )
        .expect("endpoints")
        .expect("one not avoided")
    }

    #[test]
    fn listed_replicas_are_tried_in_turn_with_a_backoff_after_each_round() {
        let t = Instant::now();
        let mut w = walk(3, Leaders::Listed, None, t);
        assert_eq!(tried(&w.next()).0, "10.0.0.0");
        assert_eq!(tried(&w.failed(t, "refused", None)).0, "10.0.0.1");
        assert_eq!(tried(&w.failed(t, "refused", None)).0, "10.0.0.2");
        // Every endpoint failed once: back off, then start again.
        let Step::Wait(d) = w.failed(t, "refused", None) else {
            panic!("a backoff")
        };
        assert!(d <= Duration::from_secs(2), "{d:?}");
        assert_eq!(tried(&w.next()).0, "10.0.0.0");
        // The first failure is said at once, the next not within 10 s.
        assert!(w
            .take_notice()
            .is_some_and(|(e, why)| e == "10.0.0.0:29400" && why == "refused"));
        let _ = w.failed(t + Duration::from_secs(1), "refused", None);
        assert!(w.take_notice().is_none());
    }

    #[test]
    fn a_follower_naming_the_leader_sends_the_next_try_there_and_the_deadline_ends_it() {
        let t = Instant::now();
        let mut w = walk(3, Leaders::Listed, None, t);
        w.next();
        let next = w.failed(t, "not the leader", Some("10.0.0.2:29400"));
        assert_eq!(tried(&next).1, 2);
        // A name that is not an endpoint is not followed (the token goes
        // nowhere else).
        let next = w.failed(t, "not the leader", Some("192.168.1.1:29400"));
        assert_eq!(tried(&next).0, "10.0.0.0");
        let late = t + Duration::from_secs(61);
        let Step::Fail(JoinError::Timeout(why)) = w.failed(late, "refused", None) else {
            panic!("the deadline ends the walk")
        };
        assert!(
            why.contains("10.0.0.0:29400, 10.0.0.1:29400, 10.0.0.2:29400")
                && why.contains("refused"),
            "{why}"
        );
    }

    #[test]
    fn the_silent_replica_is_never_tried_and_alone_it_leaves_nothing_to_walk() {
        let t = Instant::now();
        let silent = ("10.0.0.1".to_owned(), 29400);
        let mut w = walk(3, Leaders::Listed, Some(&silent), t);
        let mut seen = Vec::new();
        let mut step = w.next();
        for _ in 0..8 {
            match step {
                Step::Try { ref host, .. } => {
                    seen.push(host.clone());
                    step = w.failed(t, "refused", Some("10.0.0.1:29400"));
                }
                Step::Wait(_) => step = w.next(),
                Step::Fail(e) => panic!("{e}"),
            }
        }
        assert!(
            !seen.is_empty() && seen.iter().all(|h| h != "10.0.0.1"),
            "{seen:?}"
        );
        let only = eps(1);
        let none = Walk::new(
            &only,
            Leaders::Listed,
            Some(&only[0]),
            Duration::ZERO,
            Duration::ZERO,
            t,
            t,
        )
        .expect("an endpoint");
        assert!(none.is_none());
        assert!(matches!(
            Walk::new(
                &[],
                Leaders::Listed,
                None,
                Duration::ZERO,
                Duration::ZERO,
                t,
                t
            ),
            Err(JoinError::Config(_))
        ));
    }

    #[test]
    fn a_published_leader_is_tried_at_once_with_a_short_connect_then_less_often() {
        let t = Instant::now();
        // Agent-run: endpoint 0 is this agent's own replica.
        let mut w = walk(1, Leaders::Published, None, t);
        assert_eq!(tried(&w.next()).2, ENDPOINT_CONNECT);
        let leader = w.failed(t, "a follower", Some("10.9.9.9:29400"));
        let (host, at, connect) = tried(&leader);
        assert_eq!(
            (host.as_str(), at, connect),
            ("10.9.9.9", 0, PUBLISHED_CONNECT)
        );
        // The named leader does not serve: wait before the local replica
        // is asked again.
        let Step::Wait(d) = w.failed(t, "connection refused", None) else {
            panic!("a pause before asking again")
        };
        assert!(d <= LEADER_RETRY, "{d:?}");
        assert_eq!(tried(&w.next()).0, "10.0.0.0");
        // Named again: tried again, still at once.
        assert_eq!(
            tried(&w.failed(t, "a follower", Some("10.9.9.9:29400"))).0,
            "10.9.9.9"
        );
        // Its own replica is not a leader to follow.
        let mut w = walk(1, Leaders::Published, None, t);
        w.next();
        assert!(matches!(
            w.failed(t, "loading", Some("10.0.0.0:29400")),
            Step::Wait(_)
        ));
        // Agents on etcd elect the host as they start: no word of a wait
        // shorter than 3 s.
        assert!(w.take_notice().is_none());
        w.next();
        let Step::Fail(JoinError::Timeout(why)) = w.failed(t + Duration::from_secs(61), "x", None)
        else {
            panic!("deadline")
        };
        assert!(
            why.contains("elected to host the rendezvous through etcd"),
            "{why}"
        );
    }
}
