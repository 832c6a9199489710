//! The agents: a thin model of the driver around each real
//! `NodeMachine`, and their fake workers.

use super::*;

impl World {
    /// Node `i`'s workers' progress now, as its agent would report it
    /// (`accel_agent::progress`): its live workers, and `dying`, the one
    /// whose failure it reports. A worker steps every [`STEP`] from
    /// [`FIRST_STEP`] after its start, and saves a checkpoint every
    /// [`CHECKPOINT_EVERY`] steps.
    pub(super) fn progress(&mut self, i: usize, dying: Option<u32>) -> Option<pb::Progress> {
        let now = self.now;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut ranks = Vec::new();
        for w in &self.nodes[i].workers {
            if !(w.alive || Some(w.pid) == dying) {
                continue;
            }
            let Some(stepping) = now.checked_sub(w.started + FIRST_STEP) else {
                continue;
            };
            let steps = ms(stepping) / ms(STEP);
            let step = w.resumed + steps + 1;
            let first = w.started + FIRST_STEP;
            let last = first + STEP * u32::try_from(steps).unwrap_or(u32::MAX);
            let saved = step / CHECKPOINT_EVERY * CHECKPOINT_EVERY;
            ranks.push((
                w.round,
                step,
                (saved > w.resumed).then_some(saved),
                first,
                last,
            ));
        }
        let (round, ..) = *ranks.first()?;
        let least = ranks.iter().min_by_key(|r| r.1)?;
        let checkpoint = ranks.iter().map(|r| r.2).collect::<Option<Vec<u64>>>();
        let checkpoint = checkpoint.and_then(|c| c.into_iter().min());
        self.saved = self.saved.max(checkpoint.unwrap_or(0));
        let first = ranks.iter().map(|r| r.3).min()?;
        let step_us = match self.spec.slow == Some(i) {
            true => ms(STEP) * 1500,
            false => ms(STEP) * 1000,
        };
        let rank_times = (0..ranks.len() as u32)
            .map(|local_rank| pb::RankTime {
                local_rank,
                step_us,
            })
            .collect();
        Some(pb::Progress {
            round,
            ranks: ranks.len() as u32,
            min_step: least.1,
            max_step: ranks.iter().map(|r| r.1).max().unwrap_or(0),
            checkpoint_step: checkpoint,
            first_step_ms_ago: ms(now.saturating_sub(first)),
            min_step_ms_ago: ms(now.saturating_sub(least.4)),
            hang_timeout_ms: 0,
            failing_step: None,
            rank_times,
        })
    }

    pub(super) fn settings(&self, i: usize) -> Settings {
        let settings = Settings {
            nproc_per_node: self.nodes[i].nproc,
            ..self.spec.settings()
        };
        match self.nodes[i].broken_fence {
            true => settings.without_fencing(),
            false => settings,
        }
    }

    pub(super) fn join_request(&self, i: usize, resume: Option<pb::Resume>) -> pb::JoinRequest {
        let s = &self.spec;
        let n = &self.nodes[i];
        pb::JoinRequest {
            job_id: JOB.into(),
            node_id: n.node_id.clone(),
            hostname: n.name.clone(),
            min_nodes: s.min_nodes,
            max_nodes: s.max_nodes,
            last_call_ms: s.last_call.as_millis() as u64,
            nproc_per_node: n.nproc,
            max_restarts: s.max_restarts,
            node_rank: n.rank,
            dead_after_ms: s.drop_limit().as_millis() as u64,
            resume,
            session: n.session.clone(),
            silent_replica: String::new(),
            topology: n.topology.clone(),
            no_restart_exit_code: 0,
            agent_version: String::new(),
            // As the agent says them (`agent::run`): zero, agents without a
            // peer hub.
            outage_ms: s.outage.as_millis() as u64,
            keep_alive_ms: s.keep_alive.as_millis() as u64,
            // Every simulated agent starts with its job: none is a new run
            // of a finished one (unknown reads as "started before the end").
            started_unix_ms: 0,
            max_no_progress_restarts: 0,
            nnodes_multiple_of: s.multiple_of,
            scale_up_settle_ms: s.settle.as_millis() as u64,
        }
    }

    pub(super) fn start_join(&mut self, i: usize, resume: Option<pb::Resume>, first: bool) {
        let limit = match first {
            true => self.spec.join_timeout,
            false => self.spec.grace,
        };
        let n = &mut self.nodes[i];
        n.keep_alive_at = None;
        n.joining = Some(Joining {
            resume,
            first,
            deadline: self.now + limit,
            attempt: None,
            retry_at: self.now,
        });
    }

    pub(super) fn replied(&mut self, to: usize, id: u64, ok: Result<(), Refusal>) {
        let n = &mut self.nodes[to];
        let Some(at) = n.outstanding.iter().position(|c| c.0 == id) else {
            return; // answered after it timed out
        };
        let (_, sent, call, stream) = n.outstanding.remove(at);
        match ok {
            Ok(()) => {
                n.answered = Some(n.answered.map_or(sent, |a| a.max(sent)));
                // The driver's `perform`: an answered report is an event.
                if let Call::Failure { round, .. } = call {
                    n.queue.push_back(Event::FailureTaken(round));
                }
            }
            Err(Refusal::NotFound) if matches!(call, Call::KeepAlive(..)) => {
                if n.stream == stream && n.lost.is_none() {
                    n.lost = Some((
                        "the rendezvous no longer knows this node: keep-alive refused".into(),
                        false,
                    ));
                }
                n.keep_alive_at = None;
            }
            Err(Refusal::NotFound) if matches!(call, Call::Ready(_)) => {
                // Not the server's silence: the driver fails the agent.
                self.end_node(
                    to,
                    End::Error(1, "the rendezvous did not accept this node as ready".into()),
                );
            }
            Err(_) => {}
        }
    }

    pub(super) fn joined(
        &mut self,
        to: usize,
        attempt: u64,
        result: Result<(u64, pb::Joined), String>,
    ) {
        let n = &mut self.nodes[to];
        let Some(j) = &n.joining else { return };
        if j.attempt.map(|a| a.0) != Some(attempt) || n.end.is_some() {
            return;
        }
        let first = j.first;
        let Some(j) = n.joining.take() else { return };
        // `join_step` sets `retry_at` to the attempt's send time.
        let sent = j.retry_at;
        match result {
            Err(why) => {
                let e = AgentError::Rejected {
                    code: tonic::Code::FailedPrecondition,
                    message: why,
                };
                match first {
                    true => {
                        // Refused before it took part: not one of the job's agents.
                        self.checker.excused.insert(to);
                        self.end_node(to, End::Error(e.exit_code(), e.to_string()));
                    }
                    false => n.rejoined = Some(Err(e)),
                }
            }
            Ok((stream, joined)) => {
                if let Some(over) = joined.over.clone() {
                    n.stream = None;
                    match first {
                        true => {
                            let outcome = match over.succeeded {
                                true => Outcome::Succeeded,
                                false => Outcome::Failed(over.reason),
                            };
                            self.say(|| format!("{to}: the job was over when it joined"));
                            self.end_node(to, End::Outcome(outcome));
                        }
                        false => n.rejoined = Some(Ok(joined)),
                    }
                    return;
                }
                n.stream = Some(stream);
                n.session.clone_from(&joined.session);
                n.inbox.clear();
                n.lost = None;
                n.tripped = None;
                n.outstanding.clear();
                n.answered = Some(n.answered.map_or(sent, |a| a.max(sent)));
                n.keep_alive_at = Some(self.now + self.spec.keep_alive);
                match first {
                    true => {
                        let settings = self.settings(to);
                        let (machine, actions) =
                            NodeMachine::new(settings, self.std(self.now), joined.round);
                        self.nodes[to].machine = Some(machine);
                        self.perform(to, actions);
                    }
                    false => n.rejoined = Some(Ok(joined)),
                }
            }
        }
    }

    pub(super) fn end_node(&mut self, i: usize, end: End) {
        let n = &mut self.nodes[i];
        if n.end.is_some() {
            return;
        }
        let stream = n.stream.take();
        let name = n.name.clone();
        let e = end.clone();
        self.say(|| format!("{name} ends: {e:?}"));
        self.decided(format!("{name} ends: {}", end_words(&end)));
        if end == End::Crashed {
            // Its guard kills its workers.
            let pids: Vec<u32> = self.nodes[i]
                .workers
                .iter()
                .filter(|w| w.alive)
                .map(|w| w.pid)
                .collect();
            for w in &mut self.nodes[i].workers {
                w.alive = false;
            }
            for pid in pids {
                self.checker.died(pid);
            }
        }
        self.checker.ended_in.insert(i, self.checker.generation);
        self.end_peers(i);
        let n = &mut self.nodes[i];
        n.machine = None;
        n.joining = None;
        n.keep_alive_at = None;
        n.outstanding.clear();
        n.stopping = None;
        n.queue.clear();
        n.end = Some(end);
        let node_id = n.node_id.clone();
        if let Some(stream) = stream {
            // Its connection ends with the process.
            let msg = Msg::Call {
                from: i,
                node_id,
                session: Vec::new(),
                id: 0,
                body: Call::Closed(stream),
            };
            self.send(i, true, msg);
        }
    }

    pub(super) fn perform(&mut self, i: usize, actions: Vec<Action>) {
        for action in actions {
            if self.nodes[i].end.is_some() {
                return;
            }
            let name = self.nodes[i].name.clone();
            self.say(|| format!("{name}: {}", action_name(&action)));
            match action {
                Action::Offer { round } => {
                    // The last round's peer hub ends with the round.
                    self.end_peers(i);
                    self.call(i, Call::Ready(round));
                }
                Action::Start { info, .. } => {
                    self.start_peers(i, &info);
                    let n = &mut self.nodes[i];
                    n.node_rank = Some(info.node_rank);
                    let mut started = Vec::new();
                    let flaky = n.flaky > 0;
                    n.flaky = n.flaky.saturating_sub(1);
                    for local in 0..self.nodes[i].nproc {
                        self.next_pid += 1;
                        let ends = match (flaky && local == 0, self.spec.run) {
                            (true, _) => Some((self.now + FLAKY_AFTER, Ended::Exited(1))),
                            (false, run) => run.map(|d| (self.now + d, Ended::Exited(0))),
                        };
                        let w = Worker {
                            local_rank: local,
                            rank: info.base_rank + local,
                            round: info.round,
                            pid: self.next_pid,
                            alive: true,
                            ends,
                            started: self.now,
                            resumed: self.saved,
                        };
                        started.push(w);
                    }
                    for w in &started {
                        self.checker.started(&self.nodes, i, w, &info, self.now);
                    }
                    let n = &mut self.nodes[i];
                    n.workers = started;
                    n.group = true;
                    n.exits.clear();
                }
                Action::Stop { signal, grace } => {
                    let n = &mut self.nodes[i];
                    if !n.group {
                        n.queue.push_back(Event::Stopped(Vec::new()));
                        continue;
                    }
                    n.group = false;
                    n.stop_answered = n
                        .machine
                        .as_ref()
                        .filter(|m| m.stop_reforms())
                        .map(|_| n.answered);
                    let mut exits: Vec<Exit> = n.exits.drain(..).collect();
                    let after = match signal {
                        Signal::SIGKILL => Duration::ZERO,
                        _ => self.spec.term.min(grace),
                    };
                    // A worker honours the stop signal within `term`; past
                    // the grace it is SIGKILLed.
                    let ended = match signal == Signal::SIGKILL || self.spec.term > grace {
                        true => Ended::Signaled(Signal::SIGKILL as i32),
                        false => Ended::Signaled(signal as i32),
                    };
                    for w in n.workers.iter().filter(|w| w.alive) {
                        exits.push(Exit {
                            local_rank: w.local_rank,
                            global_rank: w.rank,
                            pid: w.pid,
                            ended,
                        });
                    }
                    n.stopping = Some((self.now + after, exits));
                    if after.is_zero() {
                        self.finish_stop(i);
                    }
                }
                Action::Kill => {
                    if let Some((at, _)) = &mut self.nodes[i].stopping {
                        *at = self.now;
                        self.finish_stop(i);
                    }
                }
                Action::ReportFailure { round, exit } => {
                    let detail = pb::Failure {
                        host: name.clone(),
                        rank: exit.global_rank,
                        local_rank: exit.local_rank,
                        exitcode: exit.ended.code(),
                        pid: exit.pid,
                        error_file: "<N/A>".into(),
                        ..pb::Failure::default()
                    };
                    let reason = exit.ended.to_string();
                    let progress = self.progress(i, Some(exit.pid));
                    self.call(
                        i,
                        Call::Failure {
                            round,
                            reason,
                            detail,
                            progress,
                        },
                    );
                }
                Action::ReportStartFailure {
                    round,
                    local_rank,
                    global_rank,
                    message,
                } => {
                    let detail = pb::Failure {
                        host: name.clone(),
                        rank: global_rank,
                        local_rank,
                        exitcode: 127,
                        ..pb::Failure::default()
                    };
                    self.call(
                        i,
                        Call::Failure {
                            round,
                            reason: message,
                            detail,
                            progress: None,
                        },
                    );
                }
                Action::ReportFenced { round, reason } => self.call(i, Call::Fenced(round, reason)),
                Action::Note(_) => {}
                Action::ReportSuccess { round } => self.call(i, Call::Success(round)),
                Action::Rejoin { resume } => {
                    let n = &mut self.nodes[i];
                    n.inbox.clear();
                    n.lost = None;
                    n.tripped = None;
                    self.start_join(i, resume, false);
                }
                Action::Leave { reason } => self.call(i, Call::Leave(reason, false)),
                Action::Depart { why } => {
                    self.call(
                        i,
                        Call::Leave(format!("the node failed its health check: {why}"), true),
                    );
                    self.end_node(i, End::Departed);
                }
                Action::Summarize { root } => {
                    self.nodes[i].summary = Some(
                        root.map(|f| format!("rank {} on {}", f.rank, f.host))
                            .unwrap_or_default(),
                    );
                }
                Action::Exit(result) => {
                    let end = match result {
                        Ok(o) => End::Outcome(o),
                        Err(e) => End::Error(e.exit_code(), e.to_string()),
                    };
                    self.end_node(i, end);
                }
            }
        }
    }

    pub(super) fn finish_stop(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let Some((_, exits)) = n.stopping.take() else {
            return;
        };
        n.stop_answered = None;
        let mut dead = Vec::new();
        for w in &mut n.workers {
            if w.alive {
                w.alive = false;
                dead.push(w.pid);
            }
        }
        n.node_rank = None;
        n.queue.push_back(Event::Stopped(exits));
        if !dead.is_empty() {
            let (name, at) = (n.name.clone(), self.now);
            self.checker.stopped(&name, dead.len(), at);
        }
        for pid in dead {
            self.checker.died(pid);
        }
    }

    /// Feeds node `i`'s machine what its phase listens to, until nothing is
    /// ready.
    pub(super) fn drive(&mut self, i: usize) {
        for _ in 0..10_000 {
            let n = &mut self.nodes[i];
            if n.end.is_some() {
                return;
            }
            let Some(machine) = &n.machine else { return };
            let src = machine.sources();
            let deadline = machine.deadline();
            let now = self.now;
            let event = if let Some(e) = n.queue.pop_front() {
                e
            } else {
                let mut ready: [bool; 6] = [false; 6];
                // [0]: a stop's end comes through the queue (`finish_stop`).
                ready[1] = src.rejoin && n.rejoined.is_some();
                ready[2] = src.workers && !n.exits.is_empty();
                ready[3] =
                    src.stream && (!n.inbox.is_empty() || n.tripped.is_some() || n.lost.is_some());
                let due = deadline.filter(|d| {
                    d.saturating_duration_since(self.base) <= now && n.timer_for != Some(*d)
                });
                ready[4] = due.is_some();
                // [5]: the peers' evidence moved (the driver's watch).
                ready[5] = src.peers && n.peers_moved;
                let count = ready.iter().filter(|r| **r).count();
                if count == 0 {
                    return;
                }
                let mut pick = self.rng.usize(..count);
                let which = ready
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| **r)
                    .find(|_| {
                        let hit = pick == 0;
                        pick = pick.saturating_sub(1);
                        hit
                    })
                    .map(|(k, _)| k)
                    .unwrap_or(4);
                let n = &mut self.nodes[i];
                match which {
                    1 => match n.rejoined.take() {
                        Some(Ok(j)) => match j.over {
                            Some(over) => Event::Over(over),
                            None => Event::Rejoined {
                                round: j.round,
                                resumed: j.resumed,
                            },
                        },
                        Some(Err(e)) => Event::RejoinFailed(e),
                        None => continue,
                    },
                    2 => match n.exits.pop_front() {
                        Some(e) => Event::Exited(e),
                        None => continue,
                    },
                    3 => {
                        if let Some(why) = n.tripped.take() {
                            let since = n.answered.unwrap_or(now);
                            self.silent(i, since);
                            Event::Silent {
                                why,
                                since: self.std(since),
                            }
                        } else if let Some(kind) = n.inbox.pop_front() {
                            Event::Message(kind)
                        } else if let Some((why, silent)) = n.lost.take() {
                            match silent {
                                true => {
                                    let since = n.answered.unwrap_or(now);
                                    self.silent(i, since);
                                    Event::Silent {
                                        why,
                                        since: self.std(since),
                                    }
                                }
                                false => {
                                    // The stream is over; its connection closes with the link.
                                    if let Some(stream) = n.stream.take() {
                                        n.hold = Some((now, stream, false));
                                    }
                                    Event::Lost(why)
                                }
                            }
                        } else {
                            continue;
                        }
                    }
                    5 => {
                        n.peers_moved = false;
                        match n.peers_until {
                            Some(until) => Event::Vouched(self.std(until)),
                            None => continue,
                        }
                    }
                    _ => {
                        n.timer_for = due;
                        Event::Timer
                    }
                }
            };
            let name = self.nodes[i].name.clone();
            let base = self.base;
            self.say(|| format!("{name} <- {}", event_name(&event, base)));
            let now = self.std(self.now);
            let Some(machine) = &mut self.nodes[i].machine else {
                return;
            };
            let actions = machine.step(now, event);
            if machine.left_round() {
                // Fenced or dropped: out of the hub at once (the agent's
                // `quiet_peers` after each step).
                self.quiet_peers(i);
            }
            self.perform(i, actions);
        }
        self.checker.note(
            'c',
            "a node's driver did not settle (a busy loop)",
            self.now,
        );
    }

    /// When node `i`'s fence falls: the send time of the last call its
    /// server answered plus the fence (`None`: fencing off, or nothing
    /// answered yet).
    pub(super) fn stop_fence(&self, i: usize) -> Option<Duration> {
        let settings = self.settings(i);
        let n = &self.nodes[i];
        let a = n.stop_answered.unwrap_or(n.answered)?;
        settings.fence.then(|| a + settings.fence_in())
    }

    /// The node took its server for silent: the old connection stays open
    /// until the fence deadline, and keep-alives stop.
    pub(super) fn silent(&mut self, i: usize, since: Duration) {
        let drop_limit = self.spec.drop_limit();
        let n = &mut self.nodes[i];
        n.keep_alive_at = None;
        if let Some(stream) = n.stream.take() {
            n.hold = Some((since + drop_limit, stream, true));
        }
    }

    pub(super) fn join_step(&mut self, i: usize) {
        let now = self.now;
        // The probe gives a join up after the silence bound.
        let silence = self.spec.silence();
        let Some(j) = &mut self.nodes[i].joining else {
            return;
        };
        if let Some((attempt, until)) = j.attempt {
            if until > now {
                return;
            }
            j.attempt = None;
            j.retry_at = now + JOIN_RETRY;
            self.call(i, Call::Abandon(attempt));
        }
        let Some(j) = &mut self.nodes[i].joining else {
            return;
        };
        if j.retry_at > now {
            return;
        }
        if now >= j.deadline {
            let first = j.first;
            self.nodes[i].joining = None;
            let e = AgentError::JoinTimeout("no rendezvous answered in time".into());
            match first {
                true => self.end_node(i, End::Error(e.exit_code(), e.to_string())),
                false => self.nodes[i].rejoined = Some(Err(e)),
            }
            return;
        }
        self.seq += 1;
        let attempt = self.seq;
        j.attempt = Some((attempt, now + silence));
        j.retry_at = now;
        let resume = j.resume;
        let req = self.join_request(i, resume);
        self.call(i, Call::Join(Box::new(req), attempt));
    }

    pub(super) fn worker_exit(&mut self, i: usize, pid: u32, how: Ended) {
        self.checker.died(pid);
        let n = &mut self.nodes[i];
        let Some(w) = n.workers.iter().find(|w| w.pid == pid) else {
            return;
        };
        let exit = Exit {
            local_rank: w.local_rank,
            global_rank: w.rank,
            pid,
            ended: how,
        };
        match &mut n.stopping {
            Some((_, exits)) => exits.push(exit),
            None if n.group => n.exits.push_back(exit),
            None => {}
        }
    }
}

/// How a node ended, for the recorded output: its exit code and why.
fn end_words(end: &End) -> String {
    match end {
        End::Crashed => "crashed".into(),
        End::Departed => "departed (a health check failed)".into(),
        End::Outcome(o) => format!(
            "exit {} ({})",
            end.code().unwrap_or(0),
            short(&format!("{o:?}"))
        ),
        End::Error(code, why) => format!("exit {code} ({})", short(why)),
    }
}

/// The first 80 characters of `s`.
fn short(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}
