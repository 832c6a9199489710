//! Faults and commands injected into the world.

use super::*;

impl World {
    /// Applies a fault or command now.
    pub fn inject(&mut self, f: Fault) {
        let desc = format!("{f:?}");
        self.say(|| format!("== {desc}"));
        match f {
            Fault::FailWorker { node, local, code } => {
                let Some(w) = self.nodes[node]
                    .workers
                    .iter_mut()
                    .find(|w| w.alive && w.local_rank == local)
                else {
                    return;
                };
                w.alive = false;
                let pid = w.pid;
                self.checker.failures += 1;
                self.worker_exit(node, pid, Ended::Exited(code));
            }
            Fault::Finish(which) => {
                for i in 0..self.nodes.len() {
                    if which.is_some_and(|w| w != i) {
                        continue;
                    }
                    let pids: Vec<u32> = self.nodes[i]
                        .workers
                        .iter_mut()
                        .filter(|w| w.alive)
                        .map(|w| {
                            w.alive = false;
                            w.pid
                        })
                        .collect();
                    for pid in pids {
                        self.worker_exit(i, pid, Ended::Exited(0));
                    }
                }
            }
            Fault::CrashNode(i) => {
                if self.nodes[i].end.is_none() {
                    self.checker.excused.insert(i);
                    self.end_node(i, End::Crashed);
                }
            }
            Fault::RestartNode(i) => {
                let n = &mut self.nodes[i];
                if !matches!(n.end, Some(End::Crashed | End::Departed)) {
                    return;
                }
                n.incarnation += 1;
                n.node_id = format!("{}-{}", n.name, n.incarnation);
                n.end = None;
                n.session.clear();
                n.answered = None;
                n.tripped = None;
                n.lost = None;
                n.inbox.clear();
                n.rejoined = None;
                n.hold = None;
                n.peers_moved = false;
                n.workers.clear();
                n.exits.clear();
                n.group = false;
                n.timer_for = None;
                n.summary = None;
                self.start_join(i, None, true);
            }
            Fault::Unhealthy(i) => {
                if self.nodes[i].end.is_none() && self.nodes[i].machine.is_some() {
                    // It may leave, and come back after the job is over.
                    self.checker.excused.insert(i);
                    self.nodes[i].queue.push_back(Event::Unhealthy(
                        "nic eth0: operstate down (simulated)".into(),
                    ));
                }
            }
            Fault::Signal(i, sig) => {
                if self.nodes[i].machine.is_some() {
                    self.nodes[i].queue.push_back(Event::Signal(sig));
                }
            }
            Fault::Partition(i) => {
                self.inject(Fault::CutServer(i));
                self.inject(Fault::CutPeers(i));
            }
            Fault::CutServer(i) => {
                self.checker.excused.insert(i);
                if self.nodes[i].cut.is_none() {
                    self.nodes[i].cut = Some(self.now);
                }
            }
            Fault::CutPeers(i) => {
                self.checker.excused.insert(i);
                if self.nodes[i].peer_cut.is_none() {
                    self.nodes[i].peer_cut = Some(self.now);
                }
            }
            Fault::Heal(i) => {
                self.inject(Fault::HealServer(i));
                self.inject(Fault::HealPeers(i));
            }
            Fault::HealServer(i) => {
                let n = &mut self.nodes[i];
                n.cut = None;
                let held = std::mem::take(&mut n.held);
                for msg in held {
                    self.send(i, false, msg);
                }
            }
            Fault::HealPeers(i) => self.nodes[i].peer_cut = None,
            Fault::PauseServer => {
                if self.server.up && self.server.paused.is_none() {
                    self.server.paused = Some(self.now);
                    for i in 0..self.nodes.len() {
                        self.checker.excused.insert(i);
                    }
                }
            }
            Fault::ResumeServer => {
                let Some(since) = self.server.paused.take() else {
                    return;
                };
                // The registry's own `lock` takes a gap longer than
                // `PAUSED` for a pause: nobody's silence in it counts
                // (`woke`). Its ticker runs first.
                if self.now.saturating_sub(since) > rendezvous_server::registry::PAUSED {
                    self.say(|| {
                        "server: woke from a pause: every node has the whole drop limit".into()
                    });
                }
                self.server_tick();
                for msg in std::mem::take(&mut self.server.unread) {
                    if let Msg::Call {
                        from,
                        node_id,
                        session,
                        id,
                        body,
                    } = msg
                    {
                        if !self.server.up || self.server.paused.is_some() {
                            break;
                        }
                        // A join attempt its node gives up (or gave up)
                        // before the answer can reach it is read with its
                        // cancellation, as above. Were it taken, the
                        // cancellation would drop the node at once: the
                        // open issue of `known_abandoned_rejoin.sim`, which
                        // a pause ending as the nodes' attempts time out
                        // would otherwise hit (all of them at once, their
                        // rejoins being in step).
                        if let Call::Join(_, attempt) = &body {
                            let n = &self.nodes[from];
                            // The answer waits for the store's write too.
                            let answer =
                                (self.spec.latency + n.delay) * 2 + self.spec.store_latency;
                            let live = n.joining.as_ref().and_then(|j| j.attempt).is_some_and(
                                |(a, until)| a == *attempt && until > self.now + answer,
                            );
                            if !live {
                                continue;
                            }
                        }
                        self.serve(from, &node_id, &session, id, body);
                    }
                }
            }
            Fault::CrashServer => {
                if !self.server.up {
                    return;
                }
                // What the store holds is what the last flush wrote; the
                // registry and its streams die with the process (no node
                // departs: nobody is left to tell).
                if let Some(registry) = self.server.registry.take() {
                    registry.close_all("crashed", true);
                    drop(registry);
                }
                self.server.up = false;
                self.server.paused = None;
                self.server.unread.clear();
                self.server.epoch += 1;
                self.server.attempts.clear();
                // A write under way is lost with the process, and so are
                // the events that waited for it.
                self.server.flush_at = None;
                self.server.answers.clear();
                let streams = std::mem::take(&mut self.server.streams);
                for (id, (stream, node_stream)) in streams {
                    drop(node_stream);
                    if let Some(to) = self.index_of(&id) {
                        self.send(
                            to,
                            false,
                            Msg::StreamEnd {
                                to,
                                stream,
                                silent: true,
                            },
                        );
                    }
                }
                for i in 0..self.nodes.len() {
                    self.checker.excused.insert(i);
                }
            }
            Fault::RestartServer(failover) => {
                if self.server.up {
                    return;
                }
                self.server.up = true;
                self.server.ticked = self.now;
                self.server.job_epoch += 1;
                // A replica that takes over loads the store; a store-less
                // server restarted in the dead one's place starts empty and
                // holds back the jobs it creates (`--state-dir`).
                // The store is the crashed incarnation's only if it wrote it.
                let continues = failover && self.server.durable;
                self.server.durable = failover;
                let registry = match failover {
                    true => registry_for(&self.spec, &self.server),
                    false => registry_for(&self.spec, &self.server).holding_fresh_jobs(),
                };
                if failover {
                    // A replica that takes over: the jobs and tombstones
                    // the store holds, their nodes given the whole drop
                    // limit from now.
                    if let Err(e) = ready(registry.load()) {
                        self.say(|| format!("server: loading the store failed: {e}"));
                    }
                    // (i) What a node was told, the store held: the job
                    // that continues is at least at the round any node heard.
                    let round = registry.with_job(JOB, |j| j.round());
                    let told = self.server.announced;
                    let lost = round.is_some_and(|r| r < told) || (round.is_none() && told > 0);
                    if continues && lost {
                        let what = format!(
                            "durability: nodes were told of round {told}, but the server that took over holds {}",
                            round.map_or("no job".into(), |r| format!("round {r}"))
                        );
                        let at = self.now;
                        self.checker.note('i', &what, at);
                    }
                }
                self.server.registry = Some(registry);
                let registry = self.server.registry.clone();
                if let Some(r) = registry {
                    self.after(&r);
                }
            }
            Fault::Delay(i, d) => {
                self.checker.excused.insert(i);
                self.nodes[i].delay = d;
            }
            Fault::Drop(i, p) => {
                self.checker.excused.insert(i);
                self.nodes[i].drop = p;
                self.nodes[i].drop_answers = false;
            }
            Fault::DropAnswers(i, p) => {
                self.checker.excused.insert(i);
                self.nodes[i].drop = p;
                self.nodes[i].drop_answers = true;
            }
            Fault::Flaky(i, rounds) => self.nodes[i].flaky = rounds,
            Fault::CrashOnRoundChange(after) => self.server.crash_armed = Some(after),
            Fault::Release(i) => {
                let host = self.nodes[i].name.clone();
                self.checker.released(&host);
                let now = self.server_now();
                let registry = self
                    .server
                    .registry
                    .clone()
                    .filter(|_| self.server.up && self.server.paused.is_none());
                if let Some(registry) = registry {
                    if registry.quarantine(now, JOB, &host).is_ok() {
                        self.say(|| format!("server: released {host}"));
                    }
                    self.after(&registry);
                }
            }
        }
        self.settle();
        self.check();
    }
}
