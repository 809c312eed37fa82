//! A session's messages waiting for its callback, and whether a runner has the
//! session: the runners take a session only while it is *scheduled*, and only one
//! runner at a time, so its messages reach the callback one at a time and in order.
//!
//! A deque keeps its capacity: a steady stream of messages allocates nothing once the
//! queue has grown to the most messages ever waiting at once (bounded by the
//! session's credits).

use crate::message::Message;
use parking_lot::Mutex;
use std::collections::VecDeque;

/// The queue of one session.
#[derive(Default)]
pub(crate) struct CallbackQueue {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    items: VecDeque<Message>,
    /// On the runners' ready list, or held by a runner.
    scheduled: bool,
    /// The session closed: what is queued is still delivered, nothing more is taken.
    closed: bool,
}

/// What [`CallbackQueue::push`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued; the session was idle and is now scheduled: the caller puts it on the
    /// ready list (or, a spinning runner that reaped the message, takes its turn).
    Schedule,
    /// Queued behind others; a runner has the session or it is on the ready list.
    Queued,
}

impl CallbackQueue {
    /// Adds `msg` at the end; gives it back if the session closed.
    pub(crate) fn push(&self, msg: Message) -> Result<Pushed, Message> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(msg);
        }
        st.items.push_back(msg);
        if st.scheduled {
            return Ok(Pushed::Queued);
        }
        st.scheduled = true;
        Ok(Pushed::Schedule)
    }

    /// The next message for the runner that has the session. `None` when the queue
    /// is empty: the session is no longer scheduled (the next push schedules it).
    pub(crate) fn next(&self) -> Option<Message> {
        let mut st = self.state.lock();
        let msg = st.items.pop_front();
        if msg.is_none() {
            st.scheduled = false;
        }
        msg
    }

    /// The session closed: later pushes are refused.
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: Option<Message>) -> String {
        m.map_or("none".into(), |m| {
            String::from_utf8(m.bytes().to_vec()).unwrap()
        })
    }

    #[test]
    fn only_the_first_push_to_an_idle_session_schedules_it() {
        let q = CallbackQueue::default();
        assert_eq!(
            q.push(Message::new(b"a".to_vec())).ok(),
            Some(Pushed::Schedule)
        );
        assert_eq!(
            q.push(Message::new(b"b".to_vec())).ok(),
            Some(Pushed::Queued)
        );
        assert_eq!(text(q.next()), "a");
        assert_eq!(text(q.next()), "b");
        assert_eq!(text(q.next()), "none");
        // Emptied: the runner let go, so the next push schedules again.
        assert_eq!(
            q.push(Message::new(b"c".to_vec())).ok(),
            Some(Pushed::Schedule)
        );
        assert_eq!(text(q.next()), "c");
    }

    #[test]
    fn what_was_queued_outlives_the_close() {
        let q = CallbackQueue::default();
        q.push(Message::new(b"a".to_vec())).ok().unwrap();
        q.close();
        assert!(q.push(Message::new(b"b".to_vec())).is_err(), "closed");
        assert_eq!(text(q.next()), "a");
        assert_eq!(text(q.next()), "none");
    }

    #[test]
    fn one_runner_at_a_time_and_no_message_is_stranded() {
        // A pusher and a runner race; every message is taken exactly once, in order,
        // and a push schedules the session only when no runner holds it.
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let q = Arc::new(CallbackQueue::default());
        let held = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(parking_lot::Mutex::new(0usize));
        let got = Arc::new(AtomicUsize::new(0));
        const N: usize = 20_000;
        let runner = {
            let (q, held, ready, got) = (q.clone(), held.clone(), ready.clone(), got.clone());
            std::thread::spawn(move || {
                let mut expect = 0u32;
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while got.load(Ordering::Acquire) < N {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "a message was stranded"
                    );
                    let scheduled = std::mem::take(&mut *ready.lock());
                    assert!(scheduled <= 1, "scheduled twice");
                    if scheduled == 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    assert!(!held.swap(true, Ordering::AcqRel), "two runners");
                    while let Some(m) = q.next() {
                        let n = u32::from_le_bytes(m.bytes().try_into().unwrap());
                        assert_eq!(n, expect, "in order");
                        expect += 1;
                        got.fetch_add(1, Ordering::AcqRel);
                    }
                    held.store(false, Ordering::Release);
                }
            })
        };
        for i in 0..N as u32 {
            if q.push(Message::new(i.to_le_bytes().to_vec())).ok() == Some(Pushed::Schedule) {
                *ready.lock() += 1;
            }
        }
        runner.join().unwrap();
        assert_eq!(got.load(Ordering::Acquire), N);
    }
}
