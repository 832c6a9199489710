//! Which member a call goes to, and where the client turns when it fails.
//!
//! Calls go to one member at a time (the current one). When a call to it
//! gets no answer or `UNAVAILABLE`, the next one in the list becomes
//! current, so the caller's retry reaches another member; connecting tries
//! every member in that order, starting from the current one. A failure
//! reported for a member that is no longer current (a concurrent call
//! already moved on) changes nothing, so one outage does not skip a
//! healthy member.

/// The current member among `count`, and the order to turn to the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoints {
    count: usize,
    current: usize,
}

impl Endpoints {
    /// `count` members (at least one), starting with the first.
    pub(crate) fn new(count: usize) -> Self {
        Self {
            count: count.max(1),
            current: 0,
        }
    }

    /// The member calls go to now.
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// Every member once, the current one first, then the ones after it,
    /// wrapping around.
    pub(crate) fn order(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.count).map(|i| (self.current + i) % self.count)
    }

    /// Makes `index` the current member (it answered).
    pub(crate) fn answered(&mut self, index: usize) {
        if index < self.count {
            self.current = index;
        }
    }

    /// Records that a call to `index` failed; the member calls go to next.
    pub(crate) fn failed(&mut self, index: usize) -> usize {
        if index == self.current {
            self.current = (self.current + 1) % self.count;
        }
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoints;

    #[test]
    fn connecting_tries_every_member_from_the_current_one_round() {
        let mut e = Endpoints::new(3);
        assert_eq!(e.order().collect::<Vec<_>>(), [0, 1, 2]);
        e.answered(2);
        assert_eq!(e.order().collect::<Vec<_>>(), [2, 0, 1]);
        e.answered(7);
        assert_eq!(e.current(), 2, "an index past the list is ignored");
    }

    #[test]
    fn a_failure_moves_on_to_the_next_member_and_wraps() {
        let mut e = Endpoints::new(3);
        assert_eq!(e.failed(0), 1);
        assert_eq!(e.failed(1), 2);
        assert_eq!(e.failed(2), 0);
    }

    #[test]
    fn a_late_failure_of_a_member_left_behind_changes_nothing() {
        let mut e = Endpoints::new(3);
        // Two calls to member 0 fail: the first moves on, the second must not
        // skip member 1.
        assert_eq!(e.failed(0), 1);
        assert_eq!(e.failed(0), 1);
    }

    #[test]
    fn one_member_stays_current() {
        let mut e = Endpoints::new(1);
        assert_eq!(e.failed(0), 0);
        assert_eq!(e.order().collect::<Vec<_>>(), [0]);
        assert_eq!(Endpoints::new(0).order().count(), 1);
    }
}
