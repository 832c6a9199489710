//! Inputs the `store_wire` fuzz target (fuzz/fuzz_targets/store_wire.rs)
//! found, replayed on [`State`] with the rule they broke.

use super::*;

fn run(st: &mut State, conn: ConnId, cmd: Command) -> (Vec<u8>, Effects) {
    let mut out = Replies::default();
    let fx = st.apply(conn, cmd, &mut out).expect("applies");
    (out.to_vec(), fx)
}

/// A queue push to a barrier's key counted as the barrier's last arrival:
/// one rank of three passed the barrier alone.
#[test]
fn a_queue_push_does_not_release_a_barrier() {
    let mut st = State::default();
    let (reply, fx) = run(&mut st, 1, Command::Barrier(b"/a".to_vec(), 3));
    assert!(reply.is_empty());
    let generation = fx.parked.expect("parked at 1 of 3");
    let (_, fx) = run(&mut st, 2, Command::QueuePush(b"/a".to_vec(), Vec::new()));
    assert!(fx.woken.is_empty(), "released by a push: {:?}", fx.woken);
    // A key waiter still gets a push; the barrier opens at its third arrival.
    let waiter = run(&mut st, 3, Command::Wait(vec![b"/q".to_vec()]))
        .1
        .parked
        .expect("parked");
    let (_, fx) = run(&mut st, 2, Command::QueuePush(b"/q".to_vec(), Vec::new()));
    assert_eq!(fx.woken, vec![(3, waiter)]);
    let second = run(&mut st, 5, Command::Barrier(b"/a".to_vec(), 3))
        .1
        .parked
        .expect("2 of 3");
    let (reply, fx) = run(&mut st, 6, Command::Barrier(b"/a".to_vec(), 3));
    assert_eq!(reply, [STOP_WAITING]);
    assert_eq!(fx.woken, vec![(1, generation), (5, second)]);
}
