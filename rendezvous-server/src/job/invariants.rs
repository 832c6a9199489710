//! Invariants the job asserts where they must hold, in release builds too.
//!
//! # Why
//! The fuzzer and the simulator check these from outside, on the states
//! they reach. Asserting them in the code that keeps them catches a change
//! that breaks one wherever it runs, in a test of any kind or in a server,
//! at the moment it happens rather than rounds later in a checker. Each is
//! O(1) or O(the round's nodes) at a round's formation, which already costs
//! that much: cheap enough to leave on.
//!
//! A violated invariant is a bug in this crate, never a value a caller
//! sent: every input is checked (and refused) before it reaches the job, so
//! panicking here does not hand a network caller a way to stop the server.
//! The registry's lock survives the panic (it takes a poisoned lock's
//! state), and the fuzzer and the simulator report it with their input.
//!
//! Each function's test shows it fires.

use std::collections::HashMap;

/// A round forms with `ranks`, each participant's node rank (0, 1, ...
/// in `order`): every node at most once, so ranks are exactly `0..nnodes`,
/// no more nodes than the job allows, and a count the job can use (a
/// multiple of `multiple_of`, `--nnodes-multiple-of`; 0: any).
pub(super) fn round_formed(
    ranks: &HashMap<&String, u32>,
    nnodes: usize,
    max_nodes: u32,
    multiple_of: u32,
) {
    assert_eq!(
        ranks.len(),
        nnodes,
        "invariant: a node holds two node ranks of one round"
    );
    assert!(
        nnodes <= max_nodes as usize,
        "invariant: a round of {nnodes} nodes formed in a job of at most {max_nodes}"
    );
    let k = multiple_of.max(1) as usize;
    assert!(
        nnodes % k == 0,
        "invariant: a round of {nnodes} nodes formed in a job of multiples of {k}"
    );
}

/// The round goes from `old` to `new` at a restart: rounds only go up (a
/// round number names one set of workers; reused, an agent could take an
/// old round's message for the new one's).
pub(super) fn next_round(old: u64, new: u64) {
    assert!(
        new > old,
        "invariant: round {old} was followed by round {new}"
    );
}

/// A restart is decided with `used` of `max` restarts spent before it and
/// `after` once decided (`counted`: a worker failure, not a membership
/// change): a counted restart spends exactly one, only while budget is left;
/// any other spends none.
pub(super) fn budget(used: u32, after: u32, max: u32, counted: bool) {
    match counted {
        true => assert!(
            used < max && after == used + 1,
            "invariant: a counted restart took the budget from {used} to {after} of {max}"
        ),
        false => assert_eq!(
            after, used,
            "invariant: a restart that is not counted changed the budget"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_of_distinct_nodes_within_the_bound_holds() {
        let (a, b) = ("a".to_owned(), "b".to_owned());
        round_formed(&HashMap::from([(&a, 0), (&b, 1)]), 2, 2, 2);
        next_round(3, 4);
        budget(0, 1, 1, true);
        budget(1, 1, 1, false);
    }

    #[test]
    #[should_panic(expected = "two node ranks")]
    fn a_node_twice_in_a_round_fires() {
        let a = "a".to_owned();
        // `order` was [a, a]: the map kept one.
        round_formed(&HashMap::from([(&a, 1)]), 2, 4, 0);
    }

    #[test]
    #[should_panic(expected = "of at most 2")]
    fn a_round_beyond_max_nodes_fires() {
        let (a, b, c) = ("a".to_owned(), "b".to_owned(), "c".to_owned());
        round_formed(&HashMap::from([(&a, 0), (&b, 1), (&c, 2)]), 3, 2, 0);
    }

    #[test]
    #[should_panic(expected = "multiples of 2")]
    fn a_round_of_a_count_the_job_cannot_use_fires() {
        let (a, b, c) = ("a".to_owned(), "b".to_owned(), "c".to_owned());
        round_formed(&HashMap::from([(&a, 0), (&b, 1), (&c, 2)]), 3, 8, 2);
    }

    #[test]
    #[should_panic(expected = "was followed by round 7")]
    fn a_round_that_does_not_go_up_fires() {
        next_round(7, 7);
    }

    #[test]
    #[should_panic(expected = "from 2 to 3 of 2")]
    fn a_counted_restart_past_the_budget_fires() {
        budget(2, 3, 2, true);
    }

    #[test]
    #[should_panic(expected = "not counted changed the budget")]
    fn a_free_restart_that_spends_fires() {
        budget(0, 1, 3, false);
    }
}
