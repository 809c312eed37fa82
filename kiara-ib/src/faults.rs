//! Faults the crate's own device tests make happen where no device fails on demand
//! (feature `fault-injection`, which only the tests turn on; not an API). A verb's
//! failure is the device's own, to a request made to fail; no verb's result is
//! made up. Every
//! fault is counted down process-wide: arm it, then make the path run. Any
//! transport of the process may take it, so tests that arm one run one at a
//! time (`--test-threads=1`, as `cargo xtask test` runs them).

use std::sync::atomic::{AtomicU32, Ordering};

static SHARED_POSTS_TO_REFUSE: AtomicU32 = AtomicU32::new(0);
static RUNNER_TURNS_TO_PANIC: AtomicU32 = AtomicU32::new(0);

/// A fault armed until its count runs out or this is dropped (so that a test that
/// fails halfway leaves none for the next).
#[must_use = "dropping it disarms the fault"]
pub struct Armed(&'static AtomicU32);

impl Drop for Armed {
    fn drop(&mut self) {
        self.0.store(0, Ordering::SeqCst);
    }
}

/// The next `n` posts to a shared receive queue are refused by the device: each
/// goes to `ibv_post_srq_recv` with one scatter entry more than the queue takes,
/// and the verb fails (`EINVAL` on Soft-RoCE). Nothing but the request is made up.
pub fn refuse_shared_posts(n: u32) -> Armed {
    arm(&SHARED_POSTS_TO_REFUSE, n)
}

/// The next `n` turns a callback runner takes at a session panic before the
/// session's first message, outside the callback: a bug in kiara-ib itself.
pub fn panic_runner_turns(n: u32) -> Armed {
    arm(&RUNNER_TURNS_TO_PANIC, n)
}

thread_local! {
    static DRAINS_TO_PANIC: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The next `n` drains on the calling thread that reap a message panic, with the
/// message reaped and not yet handed on: a bug in kiara-ib itself, on the
/// application's thread (in `recv`). For this thread only, and until done.
pub fn panic_drains_here(n: u32) {
    DRAINS_TO_PANIC.with(|left| left.set(n));
}

/// Panics if this drain is to: it reaped a message (`delivered`).
pub(crate) fn drain_on_this_thread(delivered: bool) {
    if delivered && DRAINS_TO_PANIC.with(|left| left.replace(left.get().saturating_sub(1))) > 0 {
        panic!("kiara-ib fault injection: a drain panics with a message reaped");
    }
}

static POLLER_ROUNDS_TO_PANIC: AtomicU32 = AtomicU32::new(0);

/// The next `n` rounds of a poller (any transport's) panic: a bug in kiara-ib.
pub fn panic_poller_rounds(n: u32) -> Armed {
    arm(&POLLER_ROUNDS_TO_PANIC, n)
}

/// Panics if this poller round is to.
pub(crate) fn poller_round() {
    if take(&POLLER_ROUNDS_TO_PANIC) {
        panic!("kiara-ib fault injection: a poller's round panics");
    }
}

static ACCEPT_TURNS_TO_PANIC: AtomicU32 = AtomicU32::new(0);

/// The next `n` turns of a listening transport's accept loop panic: a bug in
/// kiara-ib.
pub fn panic_accept_turns(n: u32) -> Armed {
    arm(&ACCEPT_TURNS_TO_PANIC, n)
}

/// Panics if this turn of an accept loop is to.
pub(crate) fn accept_turn() {
    if take(&ACCEPT_TURNS_TO_PANIC) {
        panic!("kiara-ib fault injection: an accept loop's turn panics");
    }
}

static SLOW_TARGET_REGISTRATIONS: AtomicU32 = AtomicU32::new(0);

/// The next `n` READ targets registered for a peer's messages (off the drain
/// path, `registrar.rs`) each take two seconds longer: a registration as slow as
/// a large one on a loaded host, to show that nothing else waits for it.
pub fn slow_target_registrations(n: u32) -> Armed {
    arm(&SLOW_TARGET_REGISTRATIONS, n)
}

/// Sleeps if this registration is to be slow.
pub(crate) fn target_registration() {
    if take(&SLOW_TARGET_REGISTRATIONS) {
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

fn arm(left: &'static AtomicU32, n: u32) -> Armed {
    left.store(n, Ordering::SeqCst);
    Armed(left)
}

/// Whether this post to a shared receive queue is to fail.
pub(crate) fn shared_post_fails() -> bool {
    take(&SHARED_POSTS_TO_REFUSE)
}

/// Panics if this runner's turn is to.
pub(crate) fn runner_turn() {
    if take(&RUNNER_TURNS_TO_PANIC) {
        panic!("kiara-ib fault injection: a runner's turn panics");
    }
}

/// Counts one down; true if one was left.
fn take(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}
