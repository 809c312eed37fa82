//! Each session's dispatcher thread: the only thread that runs the user's callback.
//!
//! Messages reach it through a queue, in the order they arrived, from whichever
//! thread reaped their completions. While the session is busy the dispatcher reaps
//! its own completion queue between callbacks (as a waiting `recv` does): what it
//! reaps goes through the same queue, so the order holds, and a request's callback
//! runs without a wake-up of another thread in between. When the session goes quiet
//! it arms the queue's notification and sleeps until the poller hands it a message.

use crate::conn::{Conn, IN_CALLBACK};
use crate::dispatch_queue::{DispatchQueue, Pop, Sender};
use crate::engine::{Deliver, Engine};
use crate::message::Message;
use crate::waiting::Allowance;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Rounds of polling between two looks at the clock.
const CLOCK_EVERY: u32 = 64;

/// Starts the dispatcher thread of `conn`: it runs the callback on each message the
/// session received, in order, and ends when the session closes (its queue's sender
/// is dropped then) and the queue is empty. `None` if no thread could be started
/// (the messages then go to the inbox).
pub(crate) fn start(engine: Weak<Engine>, conn: &Arc<Conn>, deliver: Deliver) -> Option<Sender> {
    let (queue, rx) = Sender::new();
    let weak = Arc::downgrade(conn);
    std::thread::Builder::new()
        .name(format!("kiara-dispatch-{}", conn.id))
        .spawn(move || run(&engine, &weak, &rx, &deliver))
        .ok()
        .map(|_| queue)
}

/// The dispatcher's loop.
fn run(engine: &Weak<Engine>, conn: &Weak<Conn>, rx: &DispatchQueue, deliver: &Deliver) {
    // Everything this thread runs is the callback: a wait in it is refused.
    IN_CALLBACK.with(|f| f.set(true));
    loop {
        let msg = match rx.try_pop() {
            Pop::Item(msg) => msg,
            Pop::Closed => return,
            Pop::Empty => match idle(engine, conn, rx) {
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
fn idle(engine: &Weak<Engine>, conn: &Weak<Conn>, rx: &DispatchQueue) -> Option<Message> {
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
    // No strong reference while asleep: a closing session closes the queue, which
    // wakes us with the end.
    let msg = rx.pop_wait();
    if let Some(conn) = conn.upgrade() {
        conn.waiting.record(started.elapsed());
    }
    msg
}

/// Reaps `conn`'s completion queue until a message is queued, for up to the
/// session's spin budget. `Some(found)` if the wait is over (`found` is `None` when
/// the session closed), `None` if the budget ran out or spinning is not allowed.
fn spin(engine: &Engine, conn: &Arc<Conn>, rx: &DispatchQueue) -> Option<Option<Message>> {
    let budget = conn.waiting.spin_budget(engine.config.busy_poll);
    if budget.is_zero() {
        return None;
    }
    let _allowance = Allowance::take(&engine.spinners)?;
    let _spinning = conn.waiting.spinning();
    let began = Instant::now();
    let mut rounds = 0u32;
    loop {
        engine.progress(conn, false, None);
        match rx.try_pop() {
            Pop::Item(msg) => return Some(Some(msg)),
            Pop::Closed => return Some(None),
            Pop::Empty => {}
        }
        rounds = rounds.wrapping_add(1);
        if rounds % crate::engine::OTHERS_EVERY == 0 {
            engine.progress_others(conn);
        }
        if rounds % CLOCK_EVERY == 0 {
            if began.elapsed() >= budget {
                return None;
            }
            // As in `Engine::spin`: a woken thread gets the core now and then.
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}
