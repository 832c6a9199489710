//! What this node tells about failures: each worker failure to the
//! rendezvous (with what the worker's error file says), and, when the job
//! fails, torchrun's summary with the job-wide root cause.

use accel_proto::v1 as pb;
use tracing::warn;

use super::link::{Failed, Link};
use super::round::{Ended, Exit};
use super::workers::Spawner;
use super::Driver;
use crate::failure;

impl<L: Link, S: Spawner> Driver<'_, L, S> {
    /// Reports a worker failure to the rendezvous, with what its error file
    /// says: true once the rendezvous answered.
    pub(super) async fn report(&mut self, round: u64, exit: &Exit) -> bool {
        let f = self.describe(exit);
        let reason = match f.error_file.as_str() {
            "<N/A>" => exit.ended.to_string(),
            _ => format!("{}: {}", exit.ended, f.message),
        };
        self.failures.push(f.clone());
        self.link
            .report_failure(
                round,
                Failed {
                    local_rank: exit.local_rank,
                    global_rank: exit.global_rank,
                    exit_code: exit.ended.code(),
                    reason,
                    failure: Some(f),
                    // An exit, not a signal (whose torchrun code 128 + N could equal it).
                    no_restart: matches!(
                        exit.ended,
                        Ended::Exited(c) if self.cfg.no_restart_exit_code == Some(c)
                    ),
                    // Read now, so the steps the worker reported just
                    // before it failed count.
                    progress: self
                        .progress
                        .summary_now(&self.watched, Some(exit.local_rank)),
                },
            )
            .await
    }

    /// A failure as the rendezvous records it.
    pub(super) fn describe(&self, exit: &Exit) -> pb::Failure {
        let file = self
            .error_files
            .get(exit.local_rank as usize)
            .map(crate::files::FileAt::path)
            .unwrap_or_default();
        failure::describe(
            self.cfg.identity(&self.hostname),
            exit.global_rank,
            exit.local_rank,
            exit.pid,
            exit.ended,
            &file,
        )
    }

    /// The job failed: print torchrun's summary (root cause first, from
    /// whichever node) and write it to a parent's error file.
    pub(super) fn report_job_failure(&self, root: Option<&pb::Failure>) {
        let Some(root) = root.or(self.failures.first()) else {
            return;
        };
        let others: Vec<pb::Failure> = self
            .failures
            .iter()
            .filter(|f| !(f.host == root.host && f.pid == root.pid))
            .cloned()
            .collect();
        let entry = &self.cfg.entrypoint;
        let title = entry
            .leading_args
            .iter()
            .rfind(|a| !a.starts_with('-'))
            .unwrap_or(&entry.program);
        // Not eprint!: a closed stderr (a notebook kernel that died) must
        // not abort the agent while it stops.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            failure::summary(title, root, &others).as_bytes(),
        );
        if let Some(path) = &self.cfg.parent_error_file {
            let json = failure::parent_error_file(
                root,
                &others,
                self.run_dir.as_deref().map(crate::files::Dir::path),
            )
            .to_string();
            if let Err(e) = crate::files::write_given_file(path, json.as_bytes()) {
                warn!(file = %path.display(), error = %e, "cannot write TORCHELASTIC_ERROR_FILE");
            }
        }
    }
}
