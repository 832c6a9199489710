//! The server: the real `Registry` behind a thin model of the gRPC
//! service, its store, its periodic work.

use super::*;

impl World {
    pub(super) fn reply(&mut self, to: usize, id: u64, ok: Result<(), Refusal>) {
        self.send(to, false, Msg::Reply { to, id, ok });
    }

    /// The server's clock now.
    pub(super) fn server_now(&self) -> std::time::Instant {
        self.server.clock.now().at
    }

    pub(super) fn serve(
        &mut self,
        from: usize,
        node_id: &str,
        session: &[u8],
        id: u64,
        body: Call,
    ) {
        if let Call::Join(req, attempt) = body {
            return self.serve_join(from, *req, attempt);
        }
        let Some(registry) = self.server.registry.clone() else {
            return;
        };
        let now = self.server_now();
        let closed = match body {
            Call::Closed(stream) => Some(stream),
            Call::Abandon(attempt) => self
                .server
                .attempts
                .remove(&attempt)
                .filter(|(id, _)| id == node_id)
                .map(|(_, stream)| stream),
            _ => None,
        };
        if matches!(body, Call::Closed(_) | Call::Abandon(_)) {
            let Some(stream) = closed else { return };
            if self.server.answers.remove(&stream).is_some() {
                self.say(|| format!("server: {node_id}'s join was cancelled"));
                self.after(&registry);
            } else if self.server.streams.get(node_id).map(|s| s.0) == Some(stream) {
                // Its end tells the registry (`NodeStream`'s drop): the
                // node departs, if that stream is still its current one.
                self.server.streams.remove(node_id);
                self.say(|| format!("server: {node_id}'s connection ended"));
                self.after(&registry);
            }
            return;
        }
        use rendezvous_server::error::Error;
        let member = |r: Result<(), Error>| -> Result<(), Refusal> {
            match r {
                Err(Error::WrongSession(..)) => Err(Refusal::Denied),
                Err(Error::UnknownJob(_) | Error::UnknownNode(..)) => Err(Refusal::NotFound),
                _ => Ok(()),
            }
        };
        let result: Result<(), Refusal> = match &body {
            Call::KeepAlive(vouch, progress) => {
                let req = pb::KeepAliveRequest {
                    job_id: JOB.into(),
                    node_id: node_id.into(),
                    session: session.to_vec(),
                    round: vouch.as_ref().map_or(0, |v| v.0),
                    vouch: vouch.as_ref().map(|v| v.1.clone()).unwrap_or_default(),
                    vouch_all: vouch.as_ref().is_some_and(|v| v.2),
                    progress: progress.clone(),
                };
                let with = (vouch.is_some() || progress.is_some()).then_some(&req);
                member(
                    registry
                        .keep_alive_vouching(now, JOB, node_id, session, with)
                        .map(|_| ()),
                )
            }
            Call::Ready(round) => member(registry.for_node(now, JOB, node_id, session, |job| {
                let out = job.ready(
                    now,
                    node_id,
                    *round,
                    (format!("{node_id}.host"), 29500),
                    None,
                );
                ((), out)
            })),
            Call::Failure {
                round,
                reason,
                detail,
                progress,
            } => member(registry.for_node(now, JOB, node_id, session, |job| {
                // `service.rs` `report_failure`.
                let mut out = match progress {
                    Some(p) => job.report_progress(now, node_id, p),
                    None => Vec::new(),
                };
                let host = job
                    .members()
                    .get(node_id)
                    .map(|m| m.hostname.clone())
                    .unwrap_or_default();
                let reason = format!(
                    "worker rank {} (local rank {}) on host '{host}' {reason}",
                    detail.rank, detail.local_rank
                );
                out.extend(job.failure(now, node_id, *round, reason, Some(detail.clone())));
                ((), out)
            })),
            Call::Fenced(round, reason) => {
                member(registry.for_node(now, JOB, node_id, session, |job| {
                    let out = job.fenced(now, node_id, *round, reason);
                    ((), out)
                }))
            }
            Call::Success(round) => member(registry.for_node(now, JOB, node_id, session, |job| {
                let out = job.success(now, node_id, *round);
                ((), out)
            })),
            Call::Leave(reason, unhealthy) => {
                let r = registry.leave(now, JOB, node_id, session, reason, *unhealthy);
                // A node that left has no stream to end: its own leaving
                // closed it.
                if r.is_ok() {
                    self.server.streams.remove(node_id);
                }
                match member(r) {
                    Err(Refusal::NotFound) => Ok(()),
                    other => other,
                }
            }
            Call::Join(..) | Call::Closed(_) | Call::Abandon(_) => Ok(()),
        };
        let what = body.name();
        if result.is_ok() {
            self.say(|| format!("server: {what} from {node_id}"));
        }
        self.reply(from, id, result);
        self.after(&registry);
    }

    pub(super) fn serve_join(&mut self, from: usize, req: pb::JoinRequest, attempt: u64) {
        let Some(registry) = self.server.registry.clone() else {
            return;
        };
        let now = self.server_now();
        let node_id = req.node_id.clone();
        let held = registry
            .with_job(JOB, |j| !j.phase().is_terminal())
            .unwrap_or(false);
        let fresh = Session::from_bytes(session_bytes(&mut self.rng));
        match registry.join(now, &req, None, fresh) {
            Err(e) => {
                let why = e.to_string();
                self.say(|| format!("server: refused {node_id}: {why}"));
                self.send(
                    from,
                    false,
                    Msg::Joined {
                        to: from,
                        attempt,
                        result: Err(why),
                    },
                );
            }
            Ok(stream) => {
                // A job this join created (or relearned from its node).
                let created =
                    !held && registry.with_job(JOB, |j| !j.phase().is_terminal()) == Some(true);
                if created {
                    if let Some(resume) = &req.resume {
                        self.say(|| format!("server: relearns the job from {node_id}"));
                        self.checker.new_job(Some(resume.round));
                    } else {
                        self.checker.new_job(None);
                    }
                    self.server.job_epoch += 1;
                }
                // Its first event is the join's answer, sent once the store
                // holds the join (with one).
                self.seq += 1;
                let number = self.seq;
                self.server
                    .attempts
                    .insert(attempt, (node_id.clone(), number));
                self.server
                    .answers
                    .insert(number, (from, attempt, node_id, stream));
                self.after(&registry);
            }
        }
    }

    /// What follows every call: the store takes the changes (the events
    /// they caused are released only then), the streams' events go out, the
    /// checker hears of benches, and the planted quarantine bug acts.
    pub(super) fn after(&mut self, registry: &Registry) {
        match self.spec.store_latency.is_zero() || !self.server.durable {
            true => self.flush(registry),
            false if self.server.flush_at.is_none() => {
                self.server.flush_at = Some(self.now + self.spec.store_latency);
            }
            false => {}
        }
        if self.spec.broken_quarantine {
            // The planted bug: every bench ends as soon as it begins.
            let now = self.server_now();
            let hosts: Vec<String> = registry
                .with_job(JOB, |j| {
                    j.quarantine().benched().map(|(h, _)| h.clone()).collect()
                })
                .unwrap_or_default();
            for h in hosts {
                let _ = registry.quarantine(now, JOB, &h);
            }
            if self.spec.failover {
                self.flush(registry);
            }
        }
        self.pump(registry);
    }

    /// The server's flusher: with a store, every change is written (the
    /// store answers at once) and the events it held are released.
    /// The checker hears of the benches then: a bench a crash loses
    /// before it is written was never one (nobody heard of it).
    pub(super) fn flush(&mut self, registry: &Registry) {
        self.server.flush_at = None;
        if self.server.durable {
            if let Err(e) = ready(registry.flush()) {
                self.say(|| format!("server: the store refused a write: {e}"));
            }
        }
        self.note_benches(registry);
    }

    /// Tells the checker the hosts the job benched, and until when.
    pub(super) fn note_benches(&mut self, registry: &Registry) {
        let base = self.base;
        let benches: Vec<(String, Duration)> = registry
            .with_job(JOB, |job| {
                job.quarantine()
                    .benched()
                    .map(|(h, b)| (h.clone(), b.until.saturating_duration_since(base)))
                    .collect()
            })
            .unwrap_or_default();
        for (host, until) in benches {
            self.checker.benched(host, until);
        }
    }

    /// Sends what every node's stream holds, and the end of the streams
    /// the registry ended.
    pub(super) fn pump(&mut self, registry: &Registry) {
        self.answer_joins();
        let mut sends = Vec::new();
        let mut ended = Vec::new();
        for (node, (number, stream)) in &mut self.server.streams {
            loop {
                match poll_stream(stream) {
                    Polled::Event(kind) => sends.push((node.clone(), *number, kind)),
                    Polled::Empty => break,
                    Polled::Ended => {
                        ended.push((node.clone(), *number));
                        break;
                    }
                }
            }
        }
        // The recorded output: a round once, with every node's place; a
        // restart and the end once each.
        let mut formed: BTreeMap<u64, Vec<(u32, String)>> = BTreeMap::new();
        let mut restarts = std::collections::BTreeSet::new();
        for (node, _, kind) in &sends {
            match kind {
                Kind::RoundComplete(r) => formed
                    .entry(r.round)
                    .or_default()
                    .push((r.node_rank, node.clone())),
                Kind::RestartRequested(r) if restarts.insert((r.round, r.next_round)) => {
                    let counted = if r.counted { "counted" } else { "not counted" };
                    self.decided(format!(
                        "restart {} -> {} ({counted})",
                        r.round, r.next_round
                    ));
                }
                Kind::JobSucceeded(_) | Kind::JobFailed(_) if !self.server.over_recorded => {
                    self.server.over_recorded = true;
                    let how = match kind {
                        Kind::JobSucceeded(_) => "succeeded".to_owned(),
                        _ => "failed".to_owned(),
                    };
                    self.decided(format!("job {how}"));
                    let over = registry.with_job(JOB, |j| format!("{:?}", j.phase()));
                    if let Some(phase) = over {
                        self.say(|| format!("server: the job is over: {phase}"));
                    }
                }
                _ => {}
            }
        }
        for (round, mut places) in formed {
            places.sort();
            let who: Vec<String> = places.iter().map(|(r, n)| format!("{n}={r}")).collect();
            self.decided(format!("round {round} formed: {}", who.join(" ")));
        }
        for (node, number, kind) in sends {
            self.checker.outbound(&kind);
            let told = match &kind {
                Kind::RoundComplete(r) => Some(r.round),
                Kind::RestartRequested(r) => Some(r.next_round),
                _ => None,
            };
            if let Some(told) = told {
                self.server.announced = self.server.announced.max(told);
                if let Some(after) = self.server.crash_armed.take() {
                    self.server.crash_due = Some(after);
                }
            }
            if let Kind::RoundComplete(r) = &kind {
                self.server.world = r.world_size;
                let (host, benched) = registry
                    .with_job(JOB, |job| {
                        let m = job.members().get(&node);
                        (
                            m.map_or(String::new(), |m| m.hostname.clone()),
                            m.is_some_and(|m| job.is_benched(m)),
                        )
                    })
                    .unwrap_or_default();
                let at = self.now;
                self.checker.placed(&host, &node, r, benched, at);
            }
            let Some(to) = self.index_of(&node) else {
                continue;
            };
            self.say(|| format!("server -> {node}: {}", kind_name(&kind)));
            self.send(
                to,
                false,
                Msg::Stream {
                    to,
                    stream: number,
                    kind,
                },
            );
        }
        for (node, number) in ended {
            self.server.streams.remove(&node);
            if let Some(to) = self.index_of(&node) {
                self.say(|| format!("server: ends {node}'s stream"));
                self.send(
                    to,
                    false,
                    Msg::StreamEnd {
                        to,
                        stream: number,
                        silent: false,
                    },
                );
            }
        }
    }

    /// Answers the joins whose `Joined` came out of the registry: the
    /// stream becomes the node's (a job that is over: the answer is all).
    pub(super) fn answer_joins(&mut self) {
        let numbers: Vec<u64> = self.server.answers.keys().copied().collect();
        for number in numbers {
            let Some((from, attempt, node, mut stream)) = self.server.answers.remove(&number)
            else {
                continue;
            };
            let joined = match poll_stream(&mut stream) {
                Polled::Event(Kind::Joined(j)) => j,
                Polled::Empty => {
                    self.server
                        .answers
                        .insert(number, (from, attempt, node, stream));
                    continue;
                }
                other => {
                    let what = match other {
                        Polled::Ended => "its stream ended",
                        _ => "another event came first",
                    };
                    self.say(|| format!("server: {node}'s join got no answer: {what}"));
                    continue;
                }
            };
            self.say(|| {
                format!(
                    "server: {node} joined (round {}, resumed {})",
                    joined.round, joined.resumed
                )
            });
            match &joined.over {
                None => {
                    self.server.streams.insert(node, (number, stream));
                }
                // The job's outcome, told to a node that joined late: the
                // checker hears it as the job's end (its streams may have
                // ended before the end went out on them).
                Some(o) => self.checker.outbound(&match o.succeeded {
                    true => Kind::JobSucceeded(pb::JobSucceeded::default()),
                    false => Kind::JobFailed(pb::JobFailed {
                        reason: o.reason.clone(),
                        ..Default::default()
                    }),
                }),
            }
            self.send(
                from,
                false,
                Msg::Joined {
                    to: from,
                    attempt,
                    result: Ok((number, joined)),
                },
            );
        }
    }

    pub(super) fn index_of(&self, node_id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.node_id == node_id)
    }

    /// When the server next runs its periodic work: the registry's next
    /// deadline, and at least every [`SERVER_TICK`] (as its ticker does, so
    /// that it never takes its own quiet for a pause of the process).
    pub(super) fn server_deadline(&self) -> Option<Duration> {
        if !self.server.up || self.server.paused.is_some() {
            return None;
        }
        let registry = self.server.registry.as_ref()?;
        let heartbeat = self.server.ticked + SERVER_TICK;
        let due = registry
            .next_deadline()
            .map(|t| t.saturating_duration_since(self.base).max(self.now));
        Some(due.map_or(heartbeat, |d| d.min(heartbeat)))
    }

    pub(super) fn server_tick(&mut self) {
        self.server.ticked = self.now;
        let Some(registry) = self.server.registry.clone() else {
            return;
        };
        let before = registry.with_job(JOB, |j| j.members().len()).unwrap_or(0);
        registry.tick(self.server_now());
        let after = registry.with_job(JOB, |j| j.members().len()).unwrap_or(0);
        let lost = before.saturating_sub(after);
        if lost > 0 {
            self.say(|| format!("server: dropped {lost} silent node(s)"));
        }
        self.after(&registry);
    }
}

/// How often the registry's periodic work runs at least (its ticker runs
/// every 100 ms; anything under `registry::PAUSED` keeps it from taking
/// its own quiet for a pause).
pub(super) const SERVER_TICK: Duration = Duration::from_millis(500);

/// What a node's stream holds now.
pub(super) enum Polled {
    Event(Kind),
    Empty,
    Ended,
}

/// The next event of `stream`, without waiting.
pub(super) fn poll_stream(stream: &mut NodeStream) -> Polled {
    use tokio_stream::Stream;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        match std::pin::Pin::new(&mut *stream).poll_next(&mut cx) {
            std::task::Poll::Ready(Some(Ok(pb::Event { kind: Some(kind) }))) => {
                return Polled::Event(kind)
            }
            std::task::Poll::Ready(Some(Ok(_))) => continue,
            std::task::Poll::Ready(Some(Err(_)) | None) => return Polled::Ended,
            std::task::Poll::Pending => return Polled::Empty,
        }
    }
}

/// The output of `f`, which must not wait: the registry's calls on the
/// in-memory store answer at once.
pub(super) fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("the in-memory store waited"),
    }
}

/// A registry as `rdzv-server` builds one for `spec`: jobs kept a day once
/// over (the checkers read their outcome), the quarantine policy, and, if
/// `server.durable`, the store replicas share (so every seed runs the
/// durable commit path and the tombstones).
pub(super) fn registry_for(spec: &Spec, server: &Server) -> Registry {
    use rendezvous_server::job::{QuarantineScope, QuarantineSettings};
    let limits = rendezvous_server::Limits {
        quarantine: spec.quarantine.map(|policy| QuarantineSettings {
            policy,
            scope: QuarantineScope::Job,
        }),
        ..rendezvous_server::Limits::default()
    };
    let day = Duration::from_secs(86_400);
    let registry = match server.durable {
        true => Registry::with_store(day, limits, server.store.clone()),
        false => Registry::new(day, limits),
    };
    let registry = registry.with_clock(Arc::new(server.clock.clone()));
    match spec.broken_commit {
        true => registry.delivering_before_durable(),
        false => registry,
    }
}
