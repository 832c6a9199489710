//! The registry's side of job-wide stacks ([`crate::stacks`] has the why):
//! asking the round's nodes down their streams, and taking their answers
//! once their session secret is checked.

use std::time::Duration;

use accel_proto::v1 as pb;
use pb::event::Kind;
use tracing::info;

use super::{authorize, Registry};
use crate::error::Error;
use crate::stacks::{agent_budget, Answer, Begin, Done, Latest};

impl Registry {
    /// Whether `node_id` is a member of job `job_id` holding `session`
    /// (an agent asking for its own job's stacks).
    pub fn member(&self, job_id: &str, node_id: &str, session: &[u8]) -> Result<(), Error> {
        let guard = self.lock();
        let entry = guard
            .map
            .get(job_id)
            .ok_or_else(|| Error::UnknownJob(job_id.to_owned()))?;
        authorize(&entry.job, job_id, node_id, session)
    }

    /// Begins collecting the stacks of job `job_id`'s running round (or
    /// joins the collection under way): each node of the round that has a
    /// stream is sent `StacksRequested`. The answer arrives on the returned
    /// watch once every node asked answered, or after `timeout`.
    pub fn stacks(&self, job_id: &str, native: bool, timeout: Duration) -> Result<Done, Error> {
        self.acting()?;
        let mut guard = self.lock();
        let jobs = &mut *guard;
        let entry = jobs
            .map
            .get_mut(job_id)
            .ok_or_else(|| Error::UnknownJob(job_id.to_owned()))?;
        let participants = entry.job.participants();
        let collection = match self.stacks.begin(job_id, participants.len())? {
            Begin::UnderWay(done) => return Ok(done),
            Begin::New(c) => c,
        };
        let ask = Kind::StacksRequested(pb::StacksRequested {
            request_id: collection.id,
            native,
            timeout_ms: u32::try_from(agent_budget(timeout).as_millis()).unwrap_or(u32::MAX),
        });
        let mut asked = Vec::with_capacity(participants.len());
        let mut unreachable = Vec::new();
        let mut slow = Vec::new();
        for node in participants {
            let Some(member) = entry.job.members().get(node) else {
                // Departed since the round began: its workers are gone.
                continue;
            };
            let host = member.hostname.clone();
            match entry.streams.get(node) {
                Some((_, tx)) if tx.send(ask.clone()).is_ok() => asked.push((node.clone(), host)),
                Some(_) => {
                    slow.push(node.clone());
                    unreachable.push(host);
                }
                None => unreachable.push(host),
            }
        }
        for node in &slow {
            // As for any event: a node that does not keep up loses its
            // stream (it stays a member and resumes).
            entry.streams.remove(node);
        }
        if !slow.is_empty() {
            jobs.tallies.of(job_id).too_slow += slow.len() as u64;
        }
        let round = entry.job.round();
        self.stacks
            .expect(job_id, collection.id, asked.iter().map(|(n, _)| n.clone()));
        drop(guard);
        info!(
            job = job_id,
            round,
            nodes = asked.len(),
            unreachable = unreachable.len(),
            "collecting the job's stacks"
        );
        let done = collection.done();
        tokio::spawn(collection.run(self.stacks.clone(), round, asked, unreachable, timeout));
        Ok(done)
    }

    /// Node `node_id`'s answer to collection `request_id` of job `job_id`,
    /// once `session` proves the caller is that node (its stacks are then
    /// escaped: control characters, lines kept). An answer nobody waits for
    /// changes nothing.
    pub fn report_stacks(
        &self,
        job_id: &str,
        node_id: &str,
        session: &[u8],
        request_id: u64,
        workers: Vec<pb::WorkerStack>,
    ) -> Result<(), Error> {
        self.acting()?;
        let (host, ranks) = {
            let guard = self.lock();
            let entry = guard
                .map
                .get(job_id)
                .ok_or_else(|| Error::UnknownJob(job_id.to_owned()))?;
            authorize(&entry.job, job_id, node_id, session)?;
            let nproc = entry.job.config().nproc_per_node;
            let member = entry.job.members().get(node_id);
            // The ranks this node runs in its round: a node speaks for its
            // own workers only (it cannot claim another node's, or more).
            let ranks = member.and_then(|m| m.rank).map(|r| {
                let first = r.saturating_mul(nproc);
                first..first.saturating_add(nproc)
            });
            (
                member.map(|m| m.hostname.clone()).unwrap_or_default(),
                ranks,
            )
        };
        let mut seen = std::collections::HashSet::new();
        let workers = workers
            .into_iter()
            .filter(|w| {
                ranks.as_ref().is_some_and(|r| r.contains(&w.rank))
                    && w.local_rank < nproc_of(ranks.as_ref())
                    && seen.insert(w.rank)
            })
            .map(|w| pb::WorkerStack {
                stack: accel_wire::limits::printable_keeping(&w.stack, true),
                ..w
            })
            .collect();
        self.stacks
            .deliver(job_id, request_id, node_id, Answer { host, workers });
        Ok(())
    }

    /// Stack collections under way.
    pub fn stack_collections(&self) -> usize {
        self.stacks.under_way()
    }

    /// Job `job_id`'s stacks for the status page: being collected, or the
    /// last answer.
    pub fn latest_stacks(&self, job_id: &str) -> Latest {
        self.stacks.latest(job_id)
    }
}

/// How many workers a node of `ranks` runs.
fn nproc_of(ranks: Option<&std::ops::Range<u32>>) -> u32 {
    ranks.map_or(0, |r| r.end.saturating_sub(r.start))
}
