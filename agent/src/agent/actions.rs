//! Doing what the node's state machine decided: offering a store listener,
//! starting a round's workers (and node rank 0's store), stopping them,
//! calling the rendezvous, rejoining it. An error here (a listener that
//! cannot bind, a run directory that cannot be made, a refused ready) ends
//! the agent; a worker that cannot start is an event for the machine.

use std::collections::VecDeque;

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::Notify;

use super::link::{Failed, Link};
use super::machine::{Action, Event};
use super::round::RoundInfo;
use super::store_bind::store_options;
use super::workers::{Spawner, Workers};
use super::{Driver, DriverEnd};
use crate::error::AgentError;
use crate::logs::filter::{Filtered, FilteredFile, LineFilter};
use crate::supervisor::WorkerSpec;
use crate::worker_env::{full_env, worker_argv};
use accel_worker_store::WorkerStore;

impl<L: Link, S: Spawner> Driver<'_, L, S> {
    /// Performs one action; events it causes at once go to `queue`.
    /// `Some` when the node's life is over.
    pub(super) async fn perform(
        &mut self,
        action: Action,
        queue: &mut VecDeque<Event>,
    ) -> Result<Option<DriverEnd>, AgentError> {
        match action {
            Action::Offer { round } => {
                // The last round's store and peer hub end with the round.
                self.store = None;
                self.end_peers();
                if !self.healthy(queue).await {
                    return Ok(Some(DriverEnd::Unhealthy));
                }
                self.offered_at
                    .get_or_insert_with(tokio::time::Instant::now);
                if let Err(why) = self.offer(round).await? {
                    // Not the server's verdict: it went silent, or no longer
                    // leads. Rejoin (as for a lost stream) and offer again.
                    queue.push_back(Event::Lost(why));
                }
            }
            Action::Start { info, members } => {
                // The round's progress starts from nothing.
                self.progress.new_round(info.round);
                if let Some(failed) = self.start(info, members).await? {
                    queue.push_back(failed);
                }
            }
            Action::Stop { signal, grace } => {
                // Stopping workers are no longer watched for hangs.
                self.watch(Vec::new());
                self.progress.stopped();
                match self.group.take() {
                    Some(mut group) => {
                        let kill = Arc::new(Notify::new());
                        self.kill = Some(kill.clone());
                        // The fence holds during a stop too: a grace that
                        // outlasts it ends in SIGKILL there, before the
                        // rendezvous may drop this node and re-form.
                        // A stop for a re-form keeps the fence it began
                        // with (`NodeMachine::stop_reforms`).
                        let reforms = self.machine.stop_reforms();
                        let answered = self.link.answered().map(|a| match reforms {
                            true => super::link::Answered::fixed(a.get()),
                            false => a,
                        });
                        let fence = self.machine.fence_within().zip(answered);
                        self.stopping = Some(tokio::spawn(async move {
                            let fenced = async {
                                match fence {
                                    Some((within, answered)) => {
                                        super::link::fence_falls(answered, within).await
                                    }
                                    None => std::future::pending().await,
                                }
                            };
                            let exits = tokio::select! {
                                exits = group.stop(signal, grace) => exits,
                                // Killing now also ends the wait for the grace.
                                _ = kill.notified() => group.stop(Signal::SIGKILL, Duration::ZERO).await,
                                () = fenced => group.stop(Signal::SIGKILL, Duration::ZERO).await,
                            };
                            (group, exits)
                        }));
                    }
                    None => queue.push_back(Event::Stopped(Vec::new())),
                }
            }
            Action::Kill => {
                if let Some(kill) = &self.kill {
                    kill.notify_one();
                }
            }
            Action::ReportFailure { round, exit } => {
                if self.report(round, &exit).await {
                    queue.push_back(Event::FailureTaken(round));
                }
            }
            Action::ReportStartFailure {
                round,
                local_rank,
                global_rank,
                message,
            } => {
                let taken = self
                    .link
                    .report_failure(
                        round,
                        Failed {
                            local_rank,
                            global_rank,
                            exit_code: 127,
                            reason: message,
                            failure: None,
                            no_restart: false,
                            progress: self.progress.summary_now(&self.watched, Some(local_rank)),
                        },
                    )
                    .await;
                if taken {
                    queue.push_back(Event::FailureTaken(round));
                }
            }
            Action::ReportFenced { round, reason } => self.link.report_fenced(round, reason).await,
            Action::Note(exit) => {
                let f = self.describe(&exit);
                self.failures.push(f);
            }
            Action::ReportSuccess { round } => self.link.report_success(round).await,
            Action::Rejoin { resume } => self.rejoin = Some(Box::pin(self.link.rejoin(resume))),
            Action::Leave { reason } => self.link.leave(&reason, false).await,
            Action::Depart { why } => {
                self.store = None;
                self.end_peers();
                self.link
                    .leave(&format!("the node failed its health check: {why}"), true)
                    .await;
                return Ok(Some(DriverEnd::Unhealthy));
            }
            Action::Summarize { root } => self.report_job_failure(root.as_ref()),
            Action::Exit(result) => {
                // The round's store ends with the node's life, before the
                // console drains.
                self.store = None;
                self.end_peers();
                return result.map(|o| Some(DriverEnd::Done(o)));
            }
        }
        Ok(None)
    }

    /// Runs `--health-check` before this node offers itself again. A node
    /// that fails it leaves the job (an elastic job re-forms without it);
    /// a stop signal meanwhile is queued and the check counts as passed.
    async fn healthy(&mut self, queue: &mut VecDeque<Event>) -> bool {
        let Some(check) = self.cfg.health_check.as_ref() else {
            return true;
        };
        if std::mem::replace(&mut self.health_checked, false) {
            return true;
        }
        // A periodic run in flight is this check: one run at a time.
        let run = self
            .health
            .running
            .take()
            .unwrap_or_else(|| Box::pin(check.run()));
        let verdict = tokio::select! {
            v = run => v,
            sig = self.signals.recv() => {
                queue.push_back(Event::Signal(sig));
                return true;
            }
        };
        self.health.ran();
        self.metrics.health(&verdict);
        match verdict.overall() {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(reason = %why, "this node failed its health check (--health-check*); leaving the job until it passes");
                self.link
                    .leave(&format!("the node failed its health check: {why}"), true)
                    .await;
                false
            }
        }
    }

    /// Ready for `round`, offering a freshly bound store listener: if this
    /// node becomes node rank 0, its workers' store is served on it.
    /// Offers a store listener for `round`. `Ok(Err(why))`: the rendezvous
    /// did not answer (or no longer serves): the node reconnects.
    async fn offer(&mut self, round: u64) -> Result<Result<(), String>, AgentError> {
        let (addr, listener) = self.store_binder.bind(self.cfg, &self.hostname).await?;
        let port = listener
            .local_addr()
            .map_err(|e| AgentError::io("worker store listener", e))?
            .port();
        self.store_listener = Some(listener);
        match self.link.ready(round, (addr, u32::from(port))).await {
            Ok(()) => Ok(Ok(())),
            Err(s) if super::link::is_silence(s.code()) => Ok(Err(format!(
                "ready for round {round} went unanswered: {}",
                s.message()
            ))),
            Err(s) => Err(AgentError::NotReady {
                round,
                code: s.code(),
                message: s.message().to_owned(),
            }),
        }
    }

    /// Starts the round's store (node rank 0; everyone else lets its offer
    /// go) and workers. A worker that cannot start is returned as an event.
    async fn start(
        &mut self,
        info: RoundInfo,
        members: Vec<String>,
    ) -> Result<Option<Event>, AgentError> {
        let store_at = self
            .store_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok());
        self.start_peers(&info, store_at);
        self.store = match self.store_listener.take() {
            Some(l) if info.node_rank == 0 => Some(
                WorkerStore::start_counted(
                    l,
                    store_options(self.cfg, &info, members),
                    self.metrics.store(),
                )
                .map_err(|e| AgentError::io("cannot start the worker store", e))?,
            ),
            _ => None,
        };
        let rendezvous = self.offered_at.map(|t| t.elapsed()).unwrap_or_default();
        let assigning = tokio::time::Instant::now();
        let specs = self.specs(&info)?;
        let assign = assigning.elapsed();
        self.record_events(|e| e.formed(rendezvous, assign, &info));
        self.error_files = specs.iter().map(|s| s.error_file.clone()).collect();
        self.failures.clear();
        // The first round may wait for the imports, and every round for the
        // last one's processes to release the GPUs; a stop signal meanwhile
        // starts nothing and is handled as if they had.
        let last = std::mem::take(&mut self.last_pids);
        tokio::select! {
            () = self.spawner.prepare(&last) => {}
            sig = self.signals.recv() => return Ok(Some(Event::Signal(sig))),
        }
        self.monitor.reset();
        match self.spawner.spawn(specs).await {
            Ok(group) => {
                let pids = group.pids();
                self.record_events(|e| {
                    e.started(
                        pids.iter()
                            .enumerate()
                            .map(|(i, pid)| crate::events::WorkerInfo {
                                local_rank: i as u32,
                                global_rank: info.base_rank + i as u32,
                                pid: *pid,
                            })
                            .collect(),
                    )
                });
                self.watch(
                    group
                        .pids()
                        .into_iter()
                        .zip(&self.error_files)
                        .enumerate()
                        .map(|(i, (pid, file))| crate::file_timer::Watched {
                            pid,
                            rank: info.base_rank + i as u32,
                            local_rank: i as u32,
                            error_file: file.clone(),
                        })
                        .collect(),
                );
                self.last_pids = group.pids();
                self.group = Some(group);
                let now = tokio::time::Instant::now();
                self.metrics
                    .started(self.cfg.nproc_per_node as usize, info.round);
                if let Some(t) = self.offered_at.take() {
                    self.metrics.formed(now - t);
                }
                if let Some(t) = self.failed_at.take() {
                    self.metrics.recovered(now.into_std() - t);
                }
                Ok(None)
            }
            Err(e) => {
                tracing::error!(error = %e, "worker failed to start");
                self.group = None;
                Ok(Some(Event::StartFailed {
                    local_rank: e.local_rank,
                    global_rank: e.global_rank,
                    message: e.to_string(),
                }))
            }
        }
    }

    /// Starts this node's part of the round's peer hub (node rank 0 serves
    /// it beside the store, at `store_at`'s address and `MASTER_PORT`).
    fn start_peers(&mut self, info: &RoundInfo, store_at: Option<std::net::SocketAddr>) {
        let cfg = self.cfg;
        let Some(peers) = &mut self.peers else { return };
        peers.task = super::AbortOnDrop(None);
        peers.shared.clear();
        if info.peer_key.is_empty() {
            return;
        }
        let drop_limit = cfg.rdzv.dead_after();
        let fence_in = drop_limit.saturating_sub(super::link::fence_margin(drop_limit));
        let host = match info.master_addr.contains(':') && !info.master_addr.starts_with('[') {
            true => format!("[{}]", info.master_addr),
            false => info.master_addr.clone(),
        };
        let port = u16::try_from(info.master_port).unwrap_or(0);
        let serve = match (info.node_rank, store_at) {
            (0, Some(at)) => Some(std::net::SocketAddr::new(at.ip(), port)),
            _ => None,
        };
        let round = crate::peers::PeerRound {
            round: info.round,
            node_rank: info.node_rank,
            nnodes: info.nnodes,
            key: info.peer_key.clone(),
            hub: format!("{host}:{port}"),
            serve,
            timing: crate::peers::Timing::new(
                drop_limit,
                cfg.rdzv.keep_alive_interval,
                cfg.rdzv.outage_timeout,
                fence_in,
                info.nnodes,
            ),
        };
        let answered = peers.answered.clone();
        peers.task = super::AbortOnDrop(Some(crate::peers::spawn(
            round,
            peers.shared.clone(),
            move || answered.get(),
        )));
    }

    /// This node stops pinging (and, on node rank 0, serving) the round's
    /// hub, and vouches for nobody any more; the latest evidence it had
    /// still bounds the hold of a silent server's connection while its
    /// workers stop (`Shared::quiet`).
    pub(super) fn quiet_peers(&mut self) {
        if let Some(peers) = &mut self.peers {
            peers.task = super::AbortOnDrop(None);
            peers.shared.quiet();
        }
    }

    /// The round's peer hub ends with the round.
    fn end_peers(&mut self) {
        if let Some(peers) = &mut self.peers {
            peers.task = super::AbortOnDrop(None);
            peers.shared.clear();
        }
    }

    /// The workers the FileTimer server may act on: the running round's.
    fn watch(&self, workers: Vec<crate::file_timer::Watched>) {
        *self
            .watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = workers;
    }

    fn specs(&mut self, info: &RoundInfo) -> Result<Vec<WorkerSpec>, AgentError> {
        // Every directory and file below is created in the handle of its
        // parent, private to the job's user (see crate::files).
        let run_dir = match &self.run_dir {
            Some(d) => d.clone(),
            None => {
                let d = crate::files::run_dir(self.cfg.log_dir.as_deref(), &self.cfg.run_id)?;
                // As torchrun: where the workers' files go (attempt_N/RANK/
                // below it), said once; without --log-dir or redirection it
                // holds only error files, and is not news.
                let logged = self.cfg.logs.redirects != crate::logs::StdSpec::default()
                    || self.cfg.logs.tee != crate::logs::StdSpec::default();
                if self.cfg.log_dir.is_some() || logged {
                    tracing::info!(dir = %d.path().display(), "worker logs and error files go to attempt_N/LOCAL_RANK/ in this directory");
                }
                self.run_dir = Some(d.clone());
                d
            }
        };
        let attempt = Arc::new(run_dir.attempt_dir(info.restart_count)?);
        // One filtered file per stream and attempt, for all of the node's
        // workers, created even when nothing is tee'd (as torchrun).
        let filtered = |filter: &Option<LineFilter>, name: &str| {
            filter.as_ref().map(|f| Filtered {
                filter: Arc::new(f.clone()),
                file: FilteredFile::create(&crate::files::FileAt::new(attempt.clone(), name)),
            })
        };
        let stdout_filtered = filtered(&self.cfg.logs.stdout_filter, "filtered_stdout.log");
        let stderr_filtered = filtered(&self.cfg.logs.stderr_filter, "filtered_stderr.log");
        let env = |k: &str| std::env::var(k).ok();
        (0..self.cfg.nproc_per_node)
            .map(|local_rank| {
                let dir = Arc::new(attempt.rank_dir(local_rank)?);
                let error_file = crate::files::FileAt::new(dir.clone(), "error.json");
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
                        &error_file.path().to_string_lossy(),
                        &env,
                    ),
                    stdout,
                    stderr,
                    stdout_filtered: stdout_filtered.clone(),
                    stderr_filtered: stderr_filtered.clone(),
                    error_file,
                    cpus: self
                        .cfg
                        .numa_binding
                        .as_ref()
                        .and_then(|plan| plan.get(local_rank as usize).cloned()),
                })
            })
            .collect()
    }
}
