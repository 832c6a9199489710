//! The commit path alone: events wait for the store, a failed write loses
//! nothing and keeps the order, closing delivers nothing more.

use std::sync::Mutex;

use accel_proto::v1 as pb;
use pb::event::Kind;

use super::*;
use crate::store::StoreFuture;

/// A store that takes or refuses each batch, as told, and keeps what it took.
#[derive(Debug, Default)]
struct Switch {
    refuse: Mutex<bool>,
    saved: Mutex<Vec<Batch>>,
}

impl Switch {
    fn refuse(&self, refuse: bool) {
        *self.refuse.lock().expect("lock") = refuse;
    }
    fn saved(&self) -> Vec<Batch> {
        self.saved.lock().expect("lock").clone()
    }
}

impl JobStore for Switch {
    fn load(&self) -> StoreFuture<'_, Vec<JobRecord>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn save(&self, batch: Batch) -> StoreFuture<'_, ()> {
        let refused = *self.refuse.lock().expect("lock");
        if !refused {
            self.saved.lock().expect("lock").push(batch);
        }
        Box::pin(async move {
            if refused {
                Err(StoreError::Unavailable("switched off".into()))
            } else {
                Ok(())
            }
        })
    }
}

fn event(to: &str, round: u64) -> Outbound {
    Outbound {
        to: to.into(),
        event: Kind::RestartRequested(pb::RestartRequested {
            round,
            ..Default::default()
        }),
    }
}

fn rounds(held: Vec<HeldEvents>) -> Vec<(String, u64)> {
    held.into_iter()
        .flat_map(|h| {
            let (job, out, _) = h.into_parts();
            out.into_iter().map(move |o| match o.event {
                Kind::RestartRequested(r) => (job.clone(), r.round),
                _ => (job.clone(), u64::MAX),
            })
        })
        .collect()
}

async fn flush(c: &mut Commit, store: &Switch) -> Result<Vec<HeldEvents>, StoreError> {
    let pending = c.take().expect("not closing");
    let put = Vec::new();
    let removed: Vec<String> = pending.ids.iter().cloned().collect();
    match pending.write(store, put, removed, Duration::ZERO).await {
        Ok(done) => Ok(c.written(done)),
        Err((pending, e)) => {
            c.failed(pending, &e);
            Err(e)
        }
    }
}

#[test]
fn without_a_store_events_go_at_once_to_every_stream_and_nothing_is_marked() {
    let mut c = Commit::new(false);
    c.mark("job");
    let held = c
        .decided("job", vec![event("n1", 1)], false, 7)
        .expect("at once");
    let (_, out, horizon) = held.into_parts();
    assert_eq!((out.len(), horizon), (1, u64::MAX));
    let pending = c.take().expect("a take");
    assert!(pending.ids.is_empty(), "nothing to write without a store");
}

#[tokio::test]
async fn with_a_store_events_reach_nodes_only_after_the_write_that_holds_them() {
    let store = Switch::default();
    let mut c = Commit::new(true);
    c.mark("job");
    assert!(
        c.decided("job", vec![event("n1", 1)], false, 3).is_none(),
        "held"
    );
    // An empty change of a job that ended still waits (its streams end then).
    assert!(c.decided("job", Vec::new(), true, 3).is_none());
    assert!(c.decided("job", Vec::new(), false, 3).is_none());
    assert!(store.saved().is_empty(), "nothing written before a flush");
    let released = flush(&mut c, &store).await.expect("written");
    assert_eq!(store.saved().len(), 1, "one batch");
    assert_eq!(store.saved()[0].removed, vec!["job".to_owned()]);
    assert_eq!(
        released.len(),
        2,
        "the events, and the end, after the write"
    );
    assert_eq!(released[0].horizon, 3);
}

#[tokio::test]
async fn a_failed_write_keeps_everything_ahead_of_later_changes_and_refuses_until_one_succeeds() {
    let store = Switch::default();
    let mut c = Commit::new(true);
    c.mark("a");
    let _ = c.decided("a", vec![event("n1", 1)], false, 1);
    store.refuse(true);
    assert!(flush(&mut c, &store).await.is_err());
    assert!(
        c.unwritable().is_some(),
        "new members are refused meanwhile"
    );
    // Decided while the store was away: goes after the earlier change.
    c.mark("b");
    let _ = c.decided("b", vec![event("n2", 2)], false, 2);
    assert!(store.saved().is_empty());
    store.refuse(false);
    let released = flush(&mut c, &store).await.expect("written");
    assert_eq!(c.unwritable(), None);
    assert_eq!(
        rounds(released),
        vec![("a".into(), 1), ("b".into(), 2)],
        "in order"
    );
    let batch = &store.saved()[0];
    assert_eq!(
        batch.removed,
        vec!["a".to_owned(), "b".to_owned()],
        "both jobs in one batch"
    );
}

#[tokio::test]
async fn tombstones_are_written_once_and_a_removed_one_is_not_written() {
    let store = Switch::default();
    let mut c = Commit::new(true);
    let stone = |id: &str| Tombstone {
        job_id: id.into(),
        succeeded: true,
        exit_code: 0,
        reason: String::new(),
        round: 0,
        finished_ms: 0,
        nodes: Vec::new(),
        hosts: Vec::new(),
    };
    c.put_tombstone(&stone("gone"));
    c.put_tombstone(&stone("kept"));
    c.remove_tombstone("gone");
    flush(&mut c, &store).await.expect("written");
    let batch = &store.saved()[0];
    let put: Vec<&str> = batch.tombstones.iter().map(|t| t.job_id.as_str()).collect();
    assert_eq!(put, vec!["kept"]);
    assert_eq!(batch.tombstones_removed, vec!["gone".to_owned()]);
    flush(&mut c, &store).await.expect("nothing left");
    assert_eq!(store.saved().len(), 1, "an empty flush writes nothing");
}

#[tokio::test]
async fn once_closing_nothing_is_marked_written_or_delivered() {
    let store = Switch::default();
    let mut c = Commit::new(true);
    c.mark("job");
    let _ = c.decided("job", vec![event("n1", 1)], false, 1);
    let pending = c.take().expect("a write in flight");
    // The server closes while the write is in flight.
    c.close();
    c.mark("job");
    assert!(c.closing());
    let done = pending
        .write(&store, Vec::new(), vec!["job".into()], Duration::ZERO)
        .await
        .expect("written");
    assert!(
        c.written(done).is_empty(),
        "decided before closing, delivered by no one"
    );
    assert!(c.take().is_none(), "nothing more is written");
}

/// The invariant of the commit path fires: events of a change whose job
/// was not marked would be released by a write without the change.
#[test]
#[should_panic(expected = "does not carry the change")]
fn events_of_an_unmarked_change_fire_the_invariant() {
    let mut c = Commit::new(true);
    c.mark("other");
    let _ = c.decided("job", vec![event("n1", 1)], false, 3);
}
