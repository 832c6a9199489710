//! One round on this node: get ready, wait for the round to form, run the
//! workers, follow the job's decision; and keep going through a lost
//! rendezvous (reconnect within `reconnect_grace`, resume or stop).

use std::time::Duration;

use accel_proto::v1 as pb;
use nix::sys::signal::Signal;
use pb::event::Kind;
use tokio::time::{sleep_until, Instant};
use tracing::{info, warn};

use super::store_bind::store_options;
use super::{
    closed, describe_waiting, gave_up, next_event, rejoin, round_info, stop, Formed, Recovery,
    RoundEnd, RoundExit, Session, Wake,
};
use crate::error::{AgentError, Outcome};
use crate::store::WorkerStore;
use crate::supervisor::{Exit, WorkerGroup, WorkerSpec};
use crate::worker_env::{full_env, worker_argv, RoundInfo};

impl Session<'_> {
    /// Gets ready for `round` and waits for it to form.
    pub(super) async fn form(&mut self, mut round: u64) -> Result<Formed, AgentError> {
        let deadline = crate::deadline::after(self.cfg.join_timeout());
        self.offer(round).await?;
        let mut waiting = String::from("no report from the rendezvous yet");
        loop {
            let kind = tokio::select! {
                ev = next_event(&mut self.events) => match ev {
                    Ok(kind) => kind,
                    Err(lost) => {
                        round = self.reconnect_idle(&lost.to_string()).await?;
                        self.offer(round).await?;
                        continue;
                    }
                },
                sig = self.signals.recv() => return Ok(Formed::Done(Outcome::Signaled(sig))),
                Some(why) = self.silent.recv() => {
                    round = self.reconnect_idle(&why).await?;
                    self.offer(round).await?;
                    continue;
                }
                _ = sleep_until(deadline) => return Err(AgentError::JoinTimeout(format!(
                    "round {round} of job '{}' did not form within {:.0} s: {waiting}; start the missing nodes with the same --rdzv-id, --nnodes and endpoint",
                    self.cfg.run_id, self.cfg.join_timeout().as_secs_f64()))),
            };
            match kind {
                Some(Kind::RoundComplete(r)) if r.round == round => {
                    return Ok(Formed::Round(round_info(&r), r.member_addrs));
                }
                Some(Kind::Waiting(w)) if w.round == round => {
                    waiting = describe_waiting(&w);
                    info!(round, "{waiting}");
                }
                Some(Kind::RestartRequested(r)) if r.next_round > round => {
                    round = r.next_round;
                    self.offer(round).await?;
                }
                Some(Kind::JobFailed(f)) => {
                    self.report_job_failure(f.root_cause.as_ref());
                    return Ok(Formed::Done(Outcome::Failed(f.reason)));
                }
                Some(Kind::JobSucceeded(_)) => return Ok(Formed::Done(Outcome::Succeeded)),
                Some(Kind::JobClosed(c)) if c.may_rejoin => {
                    round = self.reconnect_idle(&c.reason).await?;
                    self.offer(round).await?;
                }
                Some(Kind::JobClosed(c)) => return Err(closed(&c)),
                _ => {}
            }
        }
    }

    /// Rejoins with no workers running; returns the round to get ready for.
    async fn reconnect_idle(&mut self, why: &str) -> Result<u64, AgentError> {
        warn!(reason = %why, grace_s = self.cfg.rdzv.reconnect_grace.as_secs_f64(), "lost the rendezvous; reconnecting");
        let session = self.client.session().to_vec();
        let (client, events, joined) = rejoin(
            self.cfg,
            &self.endpoint,
            self.join_req.clone(),
            None,
            session,
        )
        .await
        .map_err(|e| gave_up(why, self.cfg, &e))?;
        self.adopt(client, events);
        Ok(joined.round)
    }

    /// The stream broke while workers run: keep them running, rejoin within
    /// the grace period, and resume if the round is still current. Otherwise
    /// (the job re-formed without this node, or the grace expired) stop them.
    async fn recover(
        &mut self,
        info: &RoundInfo,
        group: &mut Option<WorkerGroup>,
        failed: &mut bool,
        why: &str,
    ) -> Result<Recovery, AgentError> {
        let cfg = self.cfg;
        warn!(reason = %why, grace_s = cfg.rdzv.reconnect_grace.as_secs_f64(), "lost the rendezvous; workers keep running while this node reconnects");
        let resume = pb::Resume {
            round: info.round,
            restart_count: info.restart_count,
            node_rank: info.node_rank,
            nnodes: info.nnodes,
        };
        let endpoint = self.endpoint.clone();
        let mut pending: Option<Exit> = None;
        let result = {
            let session = self.client.session().to_vec();
            let attempt = rejoin(cfg, &endpoint, self.join_req.clone(), Some(resume), session);
            tokio::pin!(attempt);
            loop {
                let live = group.as_ref().is_some_and(|g| !g.all_ended());
                tokio::select! {
                    r = &mut attempt => break r,
                    exit = async { group.as_mut().expect("guarded by `live`").next_exit().await }, if live => {
                        if !exit.ended.success() && !*failed {
                            warn!(local_rank = exit.local_rank, rank = exit.global_rank, ended = %exit.ended, "worker failed while the rendezvous is unreachable");
                            *failed = true;
                            pending = Some(exit);
                            stop(group, Signal::SIGTERM, cfg.shutdown_timeout).await;
                        }
                    }
                    sig = self.signals.recv() => {
                        stop(group, sig, cfg.shutdown_timeout).await;
                        return Ok(Recovery::Signaled(sig));
                    }
                }
            }
        };
        match result {
            Ok((client, events, joined)) => {
                self.adopt(client, events);
                if !joined.resumed {
                    info!(
                        round = joined.round,
                        "the job moved on without this node; stopping its workers"
                    );
                    stop(group, Signal::SIGTERM, cfg.shutdown_timeout).await;
                    return Ok(Recovery::MovedOn(joined.round));
                }
                info!(
                    round = info.round,
                    "reconnected; the round is still current"
                );
                if let Some(exit) = pending {
                    self.report(info, &exit).await;
                }
                Ok(Recovery::Resumed)
            }
            Err(e) => {
                stop(group, Signal::SIGTERM, cfg.shutdown_timeout).await;
                Err(gave_up(why, cfg, &e))
            }
        }
    }

    /// Ready for `round`, offering a freshly bound store listener: if this
    /// node becomes node rank 0, its workers' store is served on it.
    async fn offer(&mut self, round: u64) -> Result<(), AgentError> {
        let (addr, listener) = self.store_binder.bind(self.cfg, &self.hostname).await?;
        let port = listener
            .local_addr()
            .map_err(|e| AgentError::io("worker store listener", e))?
            .port();
        self.store_listener = Some(listener);
        self.client
            .ready(round, (addr, u32::from(port)))
            .await
            .map_err(|s| {
                AgentError::Rendezvous(format!(
                    "the rendezvous did not accept this node as ready: {}",
                    s.message()
                ))
            })
    }

    fn specs(&mut self, info: &RoundInfo) -> Result<Vec<WorkerSpec>, AgentError> {
        let run_dir = match &self.run_dir {
            Some(d) => d.clone(),
            None => {
                let d = crate::files::run_dir(self.cfg.log_dir.as_deref(), &self.cfg.run_id)?;
                self.run_dir = Some(d.clone());
                d
            }
        };
        let attempt = crate::files::attempt_dir(&run_dir, info.restart_count)?;
        let env = |k: &str| std::env::var(k).ok();
        (0..self.cfg.nproc_per_node)
            .map(|local_rank| {
                let dir = crate::files::rank_dir(&attempt, local_rank)?;
                let error_file = dir.join("error.json");
                let vars = crate::logs::PrefixVars {
                    role_name: &self.cfg.role,
                    rank: info.base_rank + local_rank,
                    local_rank,
                    hostname: &self.hostname,
                    node_rank: info.node_rank,
                };
                let (stdout, stderr) = self.cfg.logs.sinks(&dir, &vars);
                Ok(WorkerSpec {
                    local_rank,
                    global_rank: info.base_rank + local_rank,
                    argv: worker_argv(&self.cfg.entrypoint, local_rank),
                    env: full_env(
                        self.cfg,
                        info,
                        local_rank,
                        &error_file.to_string_lossy(),
                        &env,
                    ),
                    stdout,
                    stderr,
                    error_file,
                })
            })
            .collect()
    }

    /// Handles a lost stream inside [`Self::run_round`]: `Ok(exits)` to go on
    /// (resumed), or the round's end.
    async fn lost(
        &mut self,
        info: &RoundInfo,
        group: &mut Option<WorkerGroup>,
        failed: &mut bool,
        succeeded: bool,
        why: &str,
    ) -> Result<Vec<Exit>, RoundExit> {
        match self.recover(info, group, failed, why).await {
            Ok(Recovery::Resumed) => {
                if succeeded {
                    // A restarted server has forgotten; say it again.
                    self.client.report_success(info.round).await;
                }
                Ok(Vec::new())
            }
            Ok(Recovery::MovedOn(round)) => Err(Ok(RoundEnd::Restart(round))),
            Ok(Recovery::Signaled(sig)) => Err(Ok(RoundEnd::Done(Outcome::Signaled(sig)))),
            Err(e) => Err(Err(e)),
        }
    }

    /// Runs one round's workers until the job decides what comes next.
    pub(super) async fn run_round(
        &mut self,
        info: RoundInfo,
        members: Vec<String>,
    ) -> Result<RoundEnd, AgentError> {
        info!(
            round = info.round,
            node_rank = info.node_rank,
            nnodes = info.nnodes,
            ranks = %format!("{}..{}", info.base_rank, info.base_rank + self.cfg.nproc_per_node),
            world_size = info.world_size,
            restart_count = info.restart_count,
            master = %format!("{}:{}", info.master_addr, info.master_port),
            "round formed; starting workers"
        );
        // Node rank 0 serves this round's store; everyone else lets its offer go.
        let _store = match self.store_listener.take() {
            Some(l) if info.node_rank == 0 => Some(
                WorkerStore::start_with(l, store_options(self.cfg, &info, members))
                    .map_err(|e| AgentError::io("cannot start the worker store", e))?,
            ),
            _ => None,
        };
        let specs = self.specs(&info)?;
        self.error_files = specs.iter().map(|s| s.error_file.clone()).collect();
        self.failures.clear();
        let mut group =
            match WorkerGroup::spawn(specs, self.guard.clone(), self.console.clone()).await {
                Ok(g) => Some(g),
                Err(e) => {
                    tracing::error!(error = %e, "worker failed to start");
                    self.client
                        .report_failure(
                            info.round,
                            e.local_rank,
                            e.global_rank,
                            127,
                            e.to_string(),
                            None,
                        )
                        .await;
                    None
                }
            };
        let grace = self.cfg.shutdown_timeout;
        let mut failed = group.is_none();
        let mut barrier: Option<Instant> = None;
        let mut monitor = tokio::time::interval(self.cfg.monitor_interval);
        monitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let live = group.as_ref().is_some_and(|g| !g.all_ended());
            let wake = tokio::select! {
                exit = async { group.as_mut().expect("guarded by `live`").next_exit().await }, if live => Wake::Exit(exit),
                _ = monitor.tick(), if live => Wake::Tick,
                Some(why) = self.silent.recv() => Wake::Lost(why),
                ev = self.events.message() => match ev {
                    Ok(Some(ev)) => Wake::Event(ev.kind),
                    Ok(None) => Wake::Lost("the rendezvous ended this node's session".into()),
                    Err(s) => Wake::Lost(format!("lost the rendezvous: {}", s.message())),
                },
                sig = self.signals.recv() => Wake::Signal(sig),
                _ = async { sleep_until(barrier.expect("guarded")).await }, if barrier.is_some() => Wake::BarrierExpired,
            };
            let exits = match wake {
                Wake::Exit(e) => vec![e],
                Wake::Tick => group.as_mut().map(WorkerGroup::check).unwrap_or_default(),
                Wake::Event(Some(Kind::RestartRequested(r))) if r.round == info.round => {
                    info!(reason = %r.reason, counted = r.counted, "restart requested; stopping workers");
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Ok(RoundEnd::Restart(r.next_round));
                }
                Wake::Event(Some(Kind::JobFailed(f))) => {
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    self.report_job_failure(f.root_cause.as_ref());
                    return Ok(RoundEnd::Done(Outcome::Failed(f.reason)));
                }
                Wake::Event(Some(Kind::JobSucceeded(_))) => {
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Ok(RoundEnd::Done(Outcome::Succeeded));
                }
                Wake::Event(Some(Kind::JobClosed(c))) if !c.may_rejoin => {
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Err(closed(&c));
                }
                Wake::Event(Some(Kind::JobClosed(c))) => match self
                    .lost(&info, &mut group, &mut failed, barrier.is_some(), &c.reason)
                    .await
                {
                    Ok(exits) => exits,
                    Err(end) => return end,
                },
                Wake::Event(_) => Vec::new(),
                Wake::Lost(why) => match self
                    .lost(&info, &mut group, &mut failed, barrier.is_some(), &why)
                    .await
                {
                    Ok(exits) => exits,
                    Err(end) => return end,
                },
                Wake::Signal(sig) => {
                    warn!(signal = %sig, grace_s = grace.as_secs_f64(), "stopping workers; a second signal kills them at once");
                    if let Some(g) = group.as_mut() {
                        tokio::select! {
                            _ = g.stop(sig, grace) => {}
                            again = self.signals.recv() => {
                                warn!(signal = %again, "second signal: killing workers now");
                                g.stop(Signal::SIGKILL, Duration::ZERO).await;
                            }
                        }
                    }
                    return Ok(RoundEnd::Done(Outcome::Signaled(sig)));
                }
                Wake::BarrierExpired => {
                    warn!(
                        timeout_s = self.cfg.exit_barrier_timeout.as_secs_f64(),
                        "this node's workers succeeded but other nodes did not finish within --exit-barrier-timeout; exiting"
                    );
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    self.client
                        .leave("its workers succeeded; exit barrier timed out")
                        .await;
                    return Ok(RoundEnd::Done(Outcome::Succeeded));
                }
            };
            for exit in exits {
                if exit.ended.success() || failed {
                    continue;
                }
                failed = true;
                warn!(local_rank = exit.local_rank, rank = exit.global_rank, ended = %exit.ended, "worker failed");
                self.report(&info, &exit).await;
                // Workers this stops show in the summary too (as torchrun's do).
                for stopped in stop(&mut group, Signal::SIGTERM, grace).await {
                    if !stopped.ended.success() {
                        let f = self.describe(&stopped);
                        self.failures.push(f);
                    }
                }
            }
            if !failed && barrier.is_none() && group.as_ref().is_some_and(WorkerGroup::all_ended) {
                self.client.report_success(info.round).await;
                barrier = Some(crate::deadline::after(self.cfg.exit_barrier_timeout));
            }
        }
    }
}
