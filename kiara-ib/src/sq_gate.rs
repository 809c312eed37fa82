//! Holds a memory-window bind back until every earlier request on the send queue
//! has completed, and everything posted after it behind it, in order.
//!
//! Why: Soft-RoCE's requester (`rxe_requester` in Linux, 6.1 through at least
//! 6.12) restarts from the oldest unacknowledged request when it retransmits,
//! and executes again every local operation it meets on the way, although that
//! operation was already done. A `BIND_MW` posted behind an unacknowledged SEND
//! is thus bound a second time as soon as that SEND is retransmitted; the second
//! bind of a bound type 2 window fails, the QP goes to the error state and every
//! outstanding request is flushed (the bind's own status is lost in the flush).
//! On a wire that loses packets this closed KIARA sessions within seconds.
//! A bind executed while nothing before it is outstanding is retired before any
//! later retransmission starts, so it is never executed twice. (Invalidations
//! need no gate: rxe holds a LOCAL_INV until everything before it completed.)
//!
//! No I/O here: the driver (`conn.rs`) offers each send-queue action, counts its
//! signaled posts and their completions, and posts what [`SqGate::ready`] hands
//! back.

use std::collections::VecDeque;

/// The gate, over the driver's send-queue actions `T`.
#[derive(Debug)]
pub(crate) struct SqGate<T> {
    enabled: bool,
    /// Signaled requests posted and not yet completed.
    outstanding: u32,
    /// Actions waiting, oldest first, each with whether it is a bind.
    held: VecDeque<(T, bool)>,
}

/// Actions a gate has room for before its first hold.
const HELD_AT_FIRST: usize = 16;

impl<T> SqGate<T> {
    /// A gate; a disabled one lets everything through at once.
    pub(crate) fn new(enabled: bool) -> Self {
        SqGate {
            enabled,
            outstanding: 0,
            // Room up front: the first hold mid-stream allocates nothing
            // (`device_kiara_alloc` caught it); more are held only at a new peak.
            held: VecDeque::with_capacity(if enabled { HELD_AT_FIRST } else { 0 }),
        }
    }

    /// Offers a send-queue action: `Some` to post now, `None` when it must wait
    /// (a bind while requests are outstanding, or anything behind a waiting one).
    pub(crate) fn admit(&mut self, action: T, is_bind: bool) -> Option<T> {
        if self.held.is_empty() && !self.blocks(is_bind) {
            return Some(action);
        }
        self.held.push_back((action, is_bind));
        None
    }

    /// The oldest waiting action, once it may be posted.
    pub(crate) fn ready(&mut self) -> Option<T> {
        let &(_, is_bind) = self.held.front()?;
        if self.blocks(is_bind) {
            return None;
        }
        self.held.pop_front().map(|(action, _)| action)
    }

    /// Nothing is held: an action admitted now would go at once (unless a bind).
    pub(crate) fn is_clear(&self) -> bool {
        self.held.is_empty()
    }

    /// A signaled request was posted.
    pub(crate) fn posted(&mut self) {
        self.outstanding += 1;
    }

    /// A signaled request completed.
    pub(crate) fn completed(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    /// Forgets every waiting action (the queue pair is gone).
    pub(crate) fn clear(&mut self) {
        self.held.clear();
        self.outstanding = 0;
    }

    /// Actions waiting.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.held.len()
    }

    fn blocks(&self, is_bind: bool) -> bool {
        self.enabled && is_bind && self.outstanding > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_bind_waits_for_the_send_before_it_and_what_follows_waits_behind() {
        let mut g = SqGate::new(true);
        assert_eq!(g.admit("ack", false), Some("ack"));
        g.posted();
        assert_eq!(g.admit("bind", true), None);
        assert_eq!(g.admit("data", false), None);
        assert_eq!(g.ready(), None);
        g.completed();
        assert_eq!(g.ready(), Some("bind"));
        assert_eq!(g.ready(), Some("data"));
        g.posted();
        assert_eq!(g.ready(), None);
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn a_bind_on_an_idle_queue_goes_at_once_and_a_disabled_gate_never_holds() {
        let mut g = SqGate::new(true);
        assert_eq!(g.admit(1, true), Some(1));
        let mut off = SqGate::new(false);
        off.posted();
        assert_eq!(off.admit(2, true), Some(2));
        assert_eq!(off.waiting(), 0);
    }

    /// The driver's side of the property test: posts `a`, checking the rule.
    fn post(g: &mut SqGate<(u32, bool)>, a: (u32, bool), out: &mut Vec<u32>, busy: &mut u32) {
        if a.1 {
            assert_eq!(*busy, 0, "bind {} posted behind a request", a.0);
        } else {
            g.posted();
            *busy += 1;
        }
        out.push(a.0);
    }

    proptest! {
        /// Whatever the interleaving: actions come out in the order offered, none
        /// is lost, and a bind comes out only while no signaled request is
        /// outstanding.
        #[test]
        fn order_is_kept_and_no_bind_passes_an_outstanding_request(
            steps in proptest::collection::vec(0u8..4, 1..200)
        ) {
            let mut g = SqGate::new(true);
            let (mut next, mut out, mut busy) = (0u32, Vec::new(), 0u32);
            for step in steps {
                match step {
                    0 | 1 => {
                        let a = (next, step == 1);
                        next += 1;
                        if let Some(a) = g.admit(a, a.1) {
                            post(&mut g, a, &mut out, &mut busy);
                        }
                    }
                    _ if busy > 0 => {
                        g.completed();
                        busy -= 1;
                    }
                    _ => {}
                }
                while let Some(a) = g.ready() {
                    post(&mut g, a, &mut out, &mut busy);
                }
            }
            // Drain: complete everything, post what was held, until nothing is left.
            loop {
                while busy > 0 {
                    g.completed();
                    busy -= 1;
                }
                let mut posted = false;
                while let Some(a) = g.ready() {
                    post(&mut g, a, &mut out, &mut busy);
                    posted = true;
                }
                if !posted && busy == 0 {
                    break;
                }
            }
            prop_assert_eq!(g.waiting(), 0);
            prop_assert_eq!(out, (0..next).collect::<Vec<_>>());
        }
    }
}
