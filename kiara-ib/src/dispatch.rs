//! Each session's dispatcher thread: the only thread that runs the user's callback.
//!
//! Messages reach it through a queue, in the order they arrived, from whichever
//! thread reaped their completions. While the session is busy the dispatcher reaps
//! its own completion queue between callbacks (as a waiting `recv` does): what it
//! reaps goes through the same queue, so the order holds, and a request's callback
//! runs without a wake-up of another thread in between. When the session goes quiet
//! it arms the queue's notification and sleeps until the poller hands it a message.

use crate::conn::{Conn, IN_CALLBACK};
use crate::engine::{Deliver, Engine};
use crate::message::Message;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Rounds of polling between two looks at the clock.
const CLOCK_EVERY: u32 = 64;

/// Dispatchers that may spin at once per transport: a spinning thread per core
/// would starve the kernel's packet processing on a software device.
pub(crate) fn max_spinners() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .max(1)
}

/// Starts the dispatcher thread of `conn`: it runs the callback on each message the
/// session received, in order, and ends when the session closes (its queue's sender
/// is dropped then) and the queue is empty. `None` if no thread could be started
/// (the messages then go to the inbox).
pub(crate) fn start(
    engine: Weak<Engine>,
    conn: &Arc<Conn>,
    deliver: Deliver,
) -> Option<mpsc::Sender<Message>> {
    let (tx, rx) = mpsc::channel::<Message>();
    let weak = Arc::downgrade(conn);
    std::thread::Builder::new()
        .name(format!("kiara-dispatch-{}", conn.id))
        .spawn(move || run(&engine, &weak, &rx, &deliver))
        .ok()
        .map(|_| tx)
}

/// The dispatcher's loop.
fn run(engine: &Weak<Engine>, conn: &Weak<Conn>, rx: &Receiver<Message>, deliver: &Deliver) {
    // Everything this thread runs is the callback: a wait in it is refused.
    IN_CALLBACK.with(|f| f.set(true));
    loop {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => match idle(engine, conn, rx) {
                Some(msg) => msg,
                None => return,
            },
        };
        let Some(conn) = conn.upgrade() else { return };
        crate::engine::run_callback(deliver, conn.clone(), msg);
        conn.consumed();
    }
}

/// Nothing queued: reaps the session's completions on this thread for a while (if
/// this transport's spinning allowance permits), then sleeps until the poller
/// queues a message. `None` once the session closed and its queue is empty.
fn idle(engine: &Weak<Engine>, conn: &Weak<Conn>, rx: &Receiver<Message>) -> Option<Message> {
    let started = Instant::now();
    {
        let engine = engine.upgrade()?;
        let conn = conn.upgrade()?;
        if let Some(found) = spin(&engine, &conn, rx) {
            conn.waiting.record(started.elapsed());
            return found;
        }
        // Armed before sleeping: the next completion wakes the poller, which
        // queues what it delivers.
        engine.progress(&conn, true, None);
    }
    // No strong reference while asleep: a closing session drops its queue's sender,
    // which wakes us with the end.
    let msg = match rx.try_recv() {
        Ok(msg) => Some(msg),
        Err(TryRecvError::Disconnected) => None,
        Err(TryRecvError::Empty) => rx.recv().ok(),
    };
    if let Some(conn) = conn.upgrade() {
        conn.waiting.record(started.elapsed());
    }
    msg
}

/// Reaps `conn`'s completion queue until a message is queued, for up to the
/// session's spin budget. `Some(found)` if the wait is over (`found` is `None` when
/// the session closed), `None` if the budget ran out or spinning is not allowed.
fn spin(engine: &Engine, conn: &Arc<Conn>, rx: &Receiver<Message>) -> Option<Option<Message>> {
    let budget = conn.waiting.spin_budget(engine.config.busy_poll);
    if budget.is_zero() {
        return None;
    }
    let _allowance = Allowance::take(&engine.spinning_dispatchers)?;
    let _spinning = conn.waiting.spinning();
    let began = Instant::now();
    let mut rounds = 0u32;
    loop {
        engine.progress(conn, false, None);
        match rx.try_recv() {
            Ok(msg) => return Some(Some(msg)),
            Err(TryRecvError::Disconnected) => return Some(None),
            Err(TryRecvError::Empty) => {}
        }
        rounds = rounds.wrapping_add(1);
        if rounds % CLOCK_EVERY == 0 && began.elapsed() >= budget {
            return None;
        }
        std::hint::spin_loop();
    }
}

/// One of the transport's spinning dispatchers, while held.
struct Allowance<'a>(&'a AtomicUsize);

impl<'a> Allowance<'a> {
    /// Takes an allowance if fewer than [`max_spinners`] dispatchers spin.
    fn take(count: &'a AtomicUsize) -> Option<Allowance<'a>> {
        let max = max_spinners();
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Allowance(count))
    }
}

impl Drop for Allowance<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spinning_allowance_is_capped_and_given_back() {
        let count = AtomicUsize::new(0);
        let held: Vec<_> = (0..max_spinners())
            .map(|_| Allowance::take(&count).expect("under the cap"))
            .collect();
        assert!(Allowance::take(&count).is_none(), "over the cap");
        drop(held);
        assert_eq!(count.load(Ordering::Acquire), 0);
        assert!(Allowance::take(&count).is_some());
    }
}
