//! The queue from the threads that reap a session's messages to its dispatcher.
//!
//! A deque under a lock, a condition variable and a closed flag: unlike a channel
//! it keeps its capacity, so a steady stream of messages allocates nothing once
//! the queue has grown to the most messages ever waiting at once (bounded by the
//! session's credits).

use crate::message::Message;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;

/// What [`DispatchQueue::try_pop`] found.
pub(crate) enum Pop {
    /// The next message.
    Item(Message),
    /// Nothing now.
    Empty,
    /// Nothing, and nothing will come: the session closed.
    Closed,
}

/// The session's end of a queue: it pushes, and closes the queue when dropped
/// (the session closed, or went away), which ends the dispatcher once it has
/// delivered what the queue holds.
pub(crate) struct Sender(Arc<DispatchQueue>);

impl Sender {
    /// A queue and its sending end.
    pub(crate) fn new() -> (Sender, Arc<DispatchQueue>) {
        let queue = Arc::new(DispatchQueue::default());
        (Sender(queue.clone()), queue)
    }

    /// See [`DispatchQueue::push`].
    pub(crate) fn push(&self, msg: Message) -> Result<(), Message> {
        self.0.push(msg)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The queue; shared by the session's [`Sender`] and its dispatcher (which pops).
#[derive(Default)]
pub(crate) struct DispatchQueue {
    state: Mutex<State>,
    cond: Condvar,
}

#[derive(Default)]
struct State {
    items: VecDeque<Message>,
    closed: bool,
}

impl DispatchQueue {
    /// Adds `msg` at the end and wakes the dispatcher; gives it back if the queue is
    /// closed.
    pub(crate) fn push(&self, msg: Message) -> Result<(), Message> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(msg);
        }
        st.items.push_back(msg);
        drop(st);
        self.cond.notify_one();
        Ok(())
    }

    /// Closes the queue: what it holds is still popped, then [`Pop::Closed`].
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
        self.cond.notify_all();
    }

    /// The next message, if one is there.
    pub(crate) fn try_pop(&self) -> Pop {
        let mut st = self.state.lock();
        match st.items.pop_front() {
            Some(msg) => Pop::Item(msg),
            None if st.closed => Pop::Closed,
            None => Pop::Empty,
        }
    }

    /// The next message, waiting for one; `None` once closed and empty.
    pub(crate) fn pop_wait(&self) -> Option<Message> {
        let mut st = self.state.lock();
        loop {
            if let Some(msg) = st.items.pop_front() {
                return Some(msg);
            }
            if st.closed {
                return None;
            }
            self.cond.wait(&mut st);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: Pop) -> String {
        match p {
            Pop::Item(m) => String::from_utf8(m.bytes().to_vec()).unwrap(),
            Pop::Empty => "empty".into(),
            Pop::Closed => "closed".into(),
        }
    }

    #[test]
    fn order_is_kept_and_what_was_queued_outlives_the_close() {
        let (tx, q) = Sender::new();
        tx.push(Message::new(b"a".to_vec())).ok().unwrap();
        tx.push(Message::new(b"b".to_vec())).ok().unwrap();
        assert_eq!(text(q.try_pop()), "a");
        drop(tx);
        assert!(q.push(Message::new(b"c".to_vec())).is_err(), "closed");
        assert_eq!(text(q.try_pop()), "b");
        assert_eq!(text(q.try_pop()), "closed");
        assert!(q.pop_wait().is_none());
    }

    #[test]
    fn a_waiting_dispatcher_is_woken_by_a_push_and_by_the_close() {
        let q = Arc::new(DispatchQueue::default());
        assert_eq!(text(q.try_pop()), "empty");
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || {
                let first = q.pop_wait().map(|m| m.bytes().to_vec());
                let second = q.pop_wait().map(|m| m.bytes().to_vec());
                (first, second)
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.push(Message::new(b"x".to_vec())).ok().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.close();
        assert_eq!(waiter.join().unwrap(), (Some(b"x".to_vec()), None));
    }
}
