//! The callback runners: a few threads per transport that run every session's
//! callback, and between callbacks reap every session's completion queue.
//!
//! A message a runner reaps is delivered by that runner, without waking another
//! thread: on a busy machine a wake-up costs more than the round trip it delays.
//! Each session's messages reach the callback one at a time and in order: a runner
//! takes a session only while it is scheduled, which it is at most once
//! ([`CallbackQueue`](crate::callback_queue::CallbackQueue)): off the ready list,
//! or straight from the delivery that scheduled it, when the runner reaped that
//! itself and the list was empty. It gives the session back after a turn of at
//! most [`TURN`] messages, so one busy session cannot starve the others.
//!
//! A callback may block. One that the checks (each poller round, at least every
//! sweep, and spinning runners now and then) see running for longer than [`STALL`]
//! is taken for blocked: another runner starts, so the other sessions are served while it blocks; once it
//! returns, the surplus runner ends when it is next idle. A blocked callback holds up
//! its own session only, and the runners number at most [`target`] plus one per
//! blocked callback.
//!
//! Idle runners spin over the completion queues for up to `Config::busy_poll`
//! (within the transport's spinning allowance, see [`crate::waiting`]), then arm them
//! and sleep until the poller schedules a session. While spinning they poll only
//! the sessions heard from lately: one quiet for [`COLD_AFTER`] times
//! `Config::busy_poll` goes *cold* (its queue is armed and left to the poller,
//! which warms it again on its next completion event), so a round costs the same
//! with a thousand idle sessions as with none.
//!
//! A runner that panics outside the callback (a callback's own panic is caught
//! where it runs) is a bug in this crate: the runner logs it and ends, a new one
//! takes its place (at once, then after growing pauses should it happen again),
//! and the session whose turn it was taking is closed, its waiting messages still
//! delivered, unless it was closed already ([`failed`]).

use crate::conn::{Conn, IN_CALLBACK};
use crate::engine::{Catch, Deliver, Engine};
use crate::error::CloseReason;
use crate::waiting::{Allowance, Ticker, Waiting};
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A callback running longer than this is taken for blocked.
pub(crate) const STALL: Duration = Duration::from_millis(20);

/// Messages of one session a runner delivers before the others get a turn.
pub(crate) const TURN: usize = 16;

/// A session quiet for this many times `Config::busy_poll` goes cold. Not once:
/// on a busy machine a client's round trip can take a few milliseconds, and a
/// session that went cold between two of its requests costs the next one a hop
/// through the poller, which makes the round trip slower still. With 16 (32 ms
/// by default), four clients sharing the guest's two vCPUs with the server had
/// p99.9 lower than with the old setting (1) in all six runs, alternating the
/// two over two boots (docs/performance-history.md).
pub(crate) const COLD_AFTER: u64 = 16;

/// Runners that panicked outside a callback are forgotten after this long without
/// another ([`Runners::failed`]).
const FAILURES_FORGOTTEN: Duration = Duration::from_secs(10);

/// A sleeping runner wakes this often to see whether the transport ended.
const NAP: Duration = Duration::from_millis(100);

/// Most runners per transport that are not blocked in a callback.
const MAX_RUNNERS: usize = 4;

/// Runners not blocked in a callback: one fewer than the cores (so one is left to
/// the device and the application), at least one, at most [`MAX_RUNNERS`].
pub(crate) fn target() -> usize {
    crate::waiting::max_spinners().min(MAX_RUNNERS)
}

/// The runners of one transport.
pub(crate) struct Runners {
    ready: Mutex<Ready>,
    /// `ready.sessions.len()`, for spinning runners to look at without the lock.
    ready_len: AtomicUsize,
    wake: Condvar,
    /// One per live runner.
    slots: Mutex<Vec<Arc<Slot>>>,
    /// The clock's zero for [`Runners::now`] (times are nanoseconds after it).
    base: Instant,
    started: AtomicBool,
    stop: AtomicBool,
    /// Whether a runner spins over the queues (the poller leaves them alone then).
    pub(crate) waiting: Waiting,
    next_name: AtomicU64,
    /// Runners that panicked outside a callback ([`failed`]) since a quiet stretch
    /// of [`FAILURES_FORGOTTEN`], and when the last did ([`Runners::now`]).
    failures: Mutex<(u32, u64)>,
    /// No runner starts before this ([`Runners::now`]; see [`Runners::failed`]).
    pause_until: AtomicU64,
    /// Spinning rounds a millisecond ([`Ticker`]).
    pace: AtomicU32,
}

struct Ready {
    sessions: VecDeque<Arc<Conn>>,
    sleepers: usize,
}

/// One runner, as the checks for blocked callbacks see it. The runner reads no
/// clock per message: it counts the callbacks it begins and ends, and a check
/// (under the runners' slot lock) takes a callback for blocked once it has seen the
/// same one running across more than [`STALL`].
#[derive(Default)]
struct Slot {
    /// Callbacks begun plus callbacks ended: odd while one runs. The runner's alone
    /// to write.
    calls: AtomicU64,
    /// `calls` at the last check, and when that check first saw it
    /// ([`Runners::now`]). Written by the checks, under the slot lock.
    seen_calls: AtomicU64,
    seen_at: AtomicU64,
}

/// Whether the spinning runners poll a session's queue.
#[derive(Default)]
pub(crate) struct Heat {
    /// The queue is armed and left to the poller.
    cold: AtomicBool,
    /// Something was reaped since the last clock tick.
    heard: AtomicBool,
    /// When the session was last heard from ([`Runners::now`]); 0: not yet timed.
    quiet_since: AtomicU64,
}

impl Heat {
    /// The session was heard from (the poller saw an event of its queue).
    pub(crate) fn warm(&self) {
        self.quiet_since.store(0, Ordering::Relaxed);
        self.cold.store(false, Ordering::Release);
    }

    /// True while the runners leave the session to the poller.
    pub(crate) fn is_cold(&self) -> bool {
        self.cold.load(Ordering::Acquire)
    }

    /// A spinning round reaped something of the session.
    fn heard(&self) {
        self.heard.store(true, Ordering::Relaxed);
    }

    /// A clock tick of a spinning runner at `now`: true once the session has been
    /// quiet for `quiet` nanoseconds, when it is marked cold (its queue must be armed
    /// next, after the mark: an event after the arm warms it again).
    fn tick(&self, now: u64, quiet: u64) -> bool {
        let since = self.quiet_since.load(Ordering::Relaxed);
        if self.heard.swap(false, Ordering::Relaxed) || since == 0 {
            self.quiet_since.store(now, Ordering::Relaxed);
            return false;
        }
        if now.saturating_sub(since) < quiet {
            return false;
        }
        self.cold.store(true, Ordering::Release);
        true
    }
}

impl Slot {
    /// The runner begins (or ends) a callback.
    fn step(&self) {
        let calls = self.calls.load(Ordering::Relaxed);
        self.calls.store(calls + 1, Ordering::Release);
    }

    /// Whether the callback running now ran across more than [`STALL`] of checks
    /// (the first check that sees a callback starts its clock).
    fn blocked(&self, now: u64) -> bool {
        let calls = self.calls.load(Ordering::Acquire);
        if calls % 2 == 0 {
            return false;
        }
        if self.seen_calls.swap(calls, Ordering::Relaxed) != calls {
            self.seen_at.store(now, Ordering::Relaxed);
            return false;
        }
        let since = self.seen_at.load(Ordering::Relaxed);
        now.saturating_sub(since) > STALL.as_nanos() as u64
    }
}

impl Runners {
    /// No runner yet: [`Runners::start`] starts them once a callback is set.
    pub(crate) fn new() -> Arc<Runners> {
        Arc::new(Runners {
            ready: Mutex::new(Ready {
                sessions: VecDeque::new(),
                sleepers: 0,
            }),
            ready_len: AtomicUsize::new(0),
            wake: Condvar::new(),
            slots: Mutex::new(Vec::new()),
            base: Instant::now(),
            started: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            waiting: Waiting::default(),
            next_name: AtomicU64::new(1),
            failures: Mutex::new((0, 0)),
            pause_until: AtomicU64::new(0),
            pace: AtomicU32::new(0),
        })
    }

    /// Starts [`target`] runners, the first time only.
    pub(crate) fn start(self: &Arc<Self>, engine: &Weak<Engine>) -> crate::error::Result<()> {
        if self.started.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut slots = self.slots.lock();
        for _ in 0..target() {
            self.spawn(engine, &mut slots)
                .map_err(|e| crate::error::Error::io("starting a callback runner", e))?;
        }
        Ok(())
    }

    fn spawn(
        self: &Arc<Self>,
        engine: &Weak<Engine>,
        slots: &mut Vec<Arc<Slot>>,
    ) -> std::io::Result<()> {
        let slot = Arc::new(Slot::default());
        let (me, engine, mine) = (self.clone(), engine.clone(), slot.clone());
        let n = self.next_name.fetch_add(1, Ordering::Relaxed);
        std::thread::Builder::new()
            .name(format!("kiara-runner-{n}"))
            .spawn(move || run(&engine, &me, &mine))?;
        slots.push(slot);
        Ok(())
    }

    /// Starts another runner if fewer than [`target`] are free (the others are
    /// blocked in callbacks). Called by the poller on each of its rounds and by
    /// spinning runners.
    pub(crate) fn check(self: &Arc<Self>, engine: &Weak<Engine>) {
        self.check_at(engine, self.now());
    }

    /// [`Runners::check`] with the clock already read ([`Runners::now`]).
    fn check_at(self: &Arc<Self>, engine: &Weak<Engine>, now: u64) {
        if !self.started.load(Ordering::Acquire) || self.stopped() {
            return;
        }
        if now < self.pause_until.load(Ordering::Acquire) {
            return;
        }
        let mut slots = self.slots.lock();
        let blocked = slots.iter().filter(|s| s.blocked(now)).count();
        if slots.len() - blocked < target() {
            // Failing to start one is tried again on the next look.
            let _ = self.spawn(engine, &mut slots);
        }
    }

    /// A runner panicked at `now` ([`Runners::now`]): its replacement may start
    /// at once the first time, then after a pause that doubles with each panic
    /// (2 ms to about a second), until none came for [`FAILURES_FORGOTTEN`]. A
    /// panic that comes back at once cannot make the runners a spawning loop. (The
    /// pause holds back the stand-in for a blocked callback too.)
    fn failed(&self, now: u64) {
        let mut failures = self.failures.lock();
        let (count, last) = &mut *failures;
        if now.saturating_sub(*last) > FAILURES_FORGOTTEN.as_nanos() as u64 {
            *count = 0;
        }
        let pause = match *count {
            0 => 0,
            n => 1_000_000u64 << n.min(10),
        };
        (*count, *last) = (count.saturating_add(1), now);
        self.pause_until
            .store(now.saturating_add(pause), Ordering::Release);
    }

    /// Puts a session that just became scheduled at the end of the ready list.
    pub(crate) fn schedule(&self, conn: Arc<Conn>) {
        let mut ready = self.ready.lock();
        ready.sessions.push_back(conn);
        self.ready_len
            .store(ready.sessions.len(), Ordering::Release);
        let sleepers = ready.sessions.len() <= ready.sleepers;
        drop(ready);
        if sleepers {
            self.wake.notify_one();
        }
    }

    /// Ends every runner (the transport shut down).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ready = self.ready.lock();
        self.wake.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn now(&self) -> u64 {
        self.since_base(Instant::now())
    }

    /// `at` in nanoseconds after [`Runners::base`], plus one.
    fn since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    fn pop(&self) -> Option<Arc<Conn>> {
        if self.ready_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut ready = self.ready.lock();
        let conn = ready.sessions.pop_front();
        self.ready_len
            .store(ready.sessions.len(), Ordering::Release);
        conn
    }

    /// An idle runner ends if more than [`target`] runners are free.
    fn retire(&self, slot: &Slot) -> bool {
        let mut slots = self.slots.lock();
        // Not more than `target` runners: none is surplus (and no clock is read).
        if slots.len() <= target() {
            return false;
        }
        let now = self.now();
        let blocked = slots.iter().filter(|s| s.blocked(now)).count();
        if slots.len() - blocked <= target() {
            return false;
        }
        slots.retain(|s| !std::ptr::eq(&**s, slot));
        true
    }

    /// Sleeps until a session is scheduled, the transport stops, or [`NAP`] passed.
    fn sleep(&self) {
        let mut ready = self.ready.lock();
        if !ready.sessions.is_empty() || self.stopped() {
            return;
        }
        ready.sleepers += 1;
        self.wake.wait_for(&mut ready, NAP);
        ready.sleepers -= 1;
    }
}

/// A runner: [`serve`] until the transport ends or the runner is surplus. Should it
/// panic outside a callback (a bug in kiara-ib: a callback's panic is caught where
/// it runs), a new runner takes its place ([`failed`]).
fn run(engine: &Weak<Engine>, runners: &Arc<Runners>, slot: &Arc<Slot>) {
    // Everything this thread runs is the callback: a wait in it is refused.
    IN_CALLBACK.with(|f| f.set(true));
    let mut mine = Mine {
        slot,
        kept: Kept::new(),
        sessions: Vec::new(),
        seen: u64::MAX,
        serving: None,
        claimed: RefCell::new(None),
    };
    let served = std::panic::catch_unwind(AssertUnwindSafe(|| serve(engine, runners, &mut mine)));
    runners.slots.lock().retain(|s| !Arc::ptr_eq(s, slot));
    if let Err(panic) = served {
        let held = (mine.serving.take(), mine.claimed.take());
        failed(engine, runners, held, panic.as_ref());
    }
}

/// A runner panicked outside a callback. The sessions it held scheduled go back
/// to the ready list, so that what waits for their callbacks is still delivered
/// (and their bytes given back): one it had `claimed` in a spin as it is; the one
/// whose turn it was `serving` closed first, since the panic may have left its
/// state half changed. A session already closed when its turn panics gets no
/// other: what waits for its callback is dropped ([`drop_waiting`]), so a panic
/// that its messages bring back ends with them. Then a new runner takes the dead
/// one's place ([`Runners::failed`] says when), and a line goes on the log.
fn failed(
    engine: &Weak<Engine>,
    runners: &Arc<Runners>,
    (serving, claimed): (Option<Arc<Conn>>, Option<Arc<Conn>>),
    panic: &(dyn Any + Send),
) {
    let what = panic_text(panic);
    if let Some(conn) = claimed {
        runners.schedule(conn);
    }
    let whose = match serving {
        Some(conn) => {
            let again = conn.closed().is_some();
            let whose = format!(
                "session {} ({}) {}",
                conn.id,
                conn.peer,
                if again {
                    "was closed: what waited for its callback is dropped"
                } else {
                    "closed"
                }
            );
            // The state may be half changed: should this panic too, the session
            // is scheduled again rather than held for good.
            let settled = std::panic::catch_unwind(AssertUnwindSafe(|| {
                if again {
                    drop_waiting(&conn);
                } else {
                    conn.close(CloseReason::Local(format!(
                        "a callback runner panicked serving the session: {what}"
                    )));
                }
            }));
            if !again || settled.is_err() {
                runners.schedule(conn);
            }
            whose
        }
        None => "no session was in its turn".into(),
    };
    runners.failed(runners.now());
    runners.check(engine);
    if let Some(engine) = engine.upgrade() {
        engine.session_line(&format!(
            "a callback runner panicked outside the callback ({what}): a bug in \
             kiara-ib, please report it; {whose}, and a new runner takes its place"
        ));
    }
}

/// What a panic said, for a log line: its message, or "a panic".
pub(crate) fn panic_text(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}

/// Drops what waits for a closed session's callback, each message given back as
/// if the callback had taken it; the session is no longer scheduled after.
fn drop_waiting(conn: &Conn) {
    while let Some(msg) = conn.callbacks.next() {
        drop(msg);
        conn.consumed();
    }
}

/// A runner's loop: a session's turn when one is ready, else spinning over the
/// queues, else sleep.
fn serve(engine: &Weak<Engine>, runners: &Arc<Runners>, mine: &mut Mine<'_>) {
    while !runners.stopped() {
        {
            let Some(engine) = engine.upgrade() else {
                break;
            };
            if let Some(conn) = runners.pop() {
                mine.take_turn(&engine, runners, conn);
                continue;
            }
            if runners.retire(mine.slot) {
                return;
            }
            if spin(&engine, runners, mine) {
                continue;
            }
            // Armed before sleeping: the next completion wakes the poller, which
            // schedules what it delivers. Warm again: the next spin looks at all.
            engine.reap_shared(true);
            for conn in &mine.sessions {
                conn.heat.warm();
                engine.progress(conn, true, Catch::Route);
            }
            // No strong reference while asleep.
            mine.sessions.clear();
            mine.seen = u64::MAX;
        }
        runners.sleep();
    }
}

/// What one runner keeps from turn to turn.
struct Mine<'a> {
    /// Its entry for the checks for blocked callbacks.
    slot: &'a Slot,
    kept: Kept,
    /// The sessions to reap, refreshed when the engine's list changes.
    sessions: Vec<Arc<Conn>>,
    /// The engine's list as of `sessions` ([`Engine::sessions_into`]).
    seen: u64,
    /// The session whose turn the runner takes, while it does.
    serving: Option<Arc<Conn>>,
    /// A session a delivery in this runner's spin scheduled, for it to take
    /// ([`Catch::Session`]).
    claimed: Claim,
}

/// Where a delivery in a runner's spin puts the session it scheduled, for the
/// runner to take ([`Catch::Session`]).
type Claim = RefCell<Option<Arc<Conn>>>;

impl Mine<'_> {
    /// [`take_turn`] at `conn`, which is in `serving` meanwhile.
    fn take_turn(&mut self, engine: &Engine, runners: &Runners, conn: Arc<Conn>) {
        let conn = self.serving.insert(conn);
        take_turn(engine, runners, self.slot, &mut self.kept, conn);
        self.serving = None;
    }
}

/// The callback as a runner keeps it: read again from the engine only when it
/// changed, instead of a lock and two reference counts every turn.
struct Kept {
    gen: u64,
    deliver: Option<Deliver>,
}

impl Kept {
    /// Nothing read yet.
    fn new() -> Kept {
        Kept {
            gen: u64::MAX,
            deliver: None,
        }
    }

    /// The engine's callback now.
    fn get(&mut self, engine: &Engine) -> Option<&Deliver> {
        if engine.deliverer_gen() != self.gen {
            (self.gen, self.deliver) = engine.deliverer();
        }
        self.deliver.as_ref()
    }
}

/// Delivers up to [`TURN`] of `conn`'s messages, then gives the session back to the
/// ready list if more wait (it stays scheduled: no other runner takes it meanwhile).
fn take_turn(engine: &Engine, runners: &Runners, slot: &Slot, kept: &mut Kept, conn: &Arc<Conn>) {
    #[cfg(feature = "fault-injection")]
    crate::faults::runner_turn();
    let deliver = kept.get(engine);
    for _ in 0..TURN {
        let Some(msg) = conn.callbacks.next() else {
            return;
        };
        let Some(deliver) = deliver else {
            conn.push_inbox(msg);
            continue;
        };
        slot.step();
        crate::engine::run_callback(deliver, conn, msg);
        slot.step();
        conn.consumed();
    }
    runners.schedule(conn.clone());
}

/// Leaves the sessions quiet for [`COLD_AFTER`] times `Config::busy_poll` to the
/// poller: marked cold, then armed (if another thread had the queue, or the drain
/// stopped with completions left, the session stays warm).
fn cool(engine: &Engine, sessions: &[Arc<Conn>], now: u64) {
    let quiet = cold_after(engine.config.busy_poll);
    for conn in sessions.iter().filter(|c| !c.heat.is_cold()) {
        if conn.heat.tick(now, quiet)
            && engine
                .try_progress(conn, true, Catch::Route)
                .is_none_or(|d| d.capped)
        {
            conn.heat.warm();
        }
    }
}

/// The quiet time, in nanoseconds, after which a session goes cold.
fn cold_after(busy_poll: Duration) -> u64 {
    u64::try_from(busy_poll.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_mul(COLD_AFTER)
}

/// Reaps every session's completion queue until a session is scheduled, for up to
/// `Config::busy_poll`. True if one was. A session whose delivery this runner
/// scheduled itself (the ready list being empty) gets its turn here, and the spin
/// goes on after it: no trip through the ready list, and no new spin.
///
/// The budget does not shrink when idle stretches are long, as a `recv` wait's
/// does: a runner that sleeps costs every session two wake-ups (the poller's, then
/// its own), which on a busy machine outweigh the core it would leave to the device
/// (measured in docs/performance-history.md).
fn spin(engine: &Engine, runners: &Arc<Runners>, mine: &mut Mine<'_>) -> bool {
    let budget = u64::try_from(engine.config.busy_poll.as_nanos()).unwrap_or(u64::MAX);
    if budget == 0 {
        return false;
    }
    // About eight looks at the clock over the budget, the first after a period: a
    // runner that finds work sooner (the next message of a busy session) reads none.
    let mut ticker = Ticker::new(&runners.pace, engine.config.busy_poll / 8);
    loop {
        let looked = (&mut mine.sessions, &mut mine.seen, &mine.claimed);
        let conn = match spin_rounds(engine, runners, looked, budget, &mut ticker) {
            Rounds::Ready => return true,
            Rounds::Idle => return false,
            Rounds::Claimed(conn) => conn,
        };
        // Not counted as spinning while the callback runs: it may block, and while
        // a runner spins the poller leaves the warm sessions' queues to it.
        mine.take_turn(engine, runners, conn);
        if runners.stopped() {
            return true;
        }
        // The turn's time is not a round's: the pace is learnt afresh.
        ticker.restart();
    }
}

/// How [`spin_rounds`] ended.
enum Rounds {
    /// A session is on the ready list.
    Ready,
    /// The budget passed, or another thread spins in this runner's place.
    Idle,
    /// This runner scheduled this session: its turn is the runner's to take.
    Claimed(Arc<Conn>),
}

/// The rounds of [`spin`] between two turns it takes itself.
/// `looked` is the runner's: the sessions it reaps, the engine's list they are as
/// of, and the cell a delivery puts the session it scheduled in.
fn spin_rounds(
    engine: &Engine,
    runners: &Arc<Runners>,
    looked: (&mut Vec<Arc<Conn>>, &mut u64, &Claim),
    budget: u64,
    ticker: &mut Ticker<'_>,
) -> Rounds {
    let (sessions, seen, claimed) = looked;
    let Some(_allowance) = Allowance::take(&engine.spinners) else {
        return Rounds::Idle;
    };
    let _spinning = runners.waiting.spinning();
    let mut began = None;
    loop {
        engine.sessions_into(sessions, seen);
        // The shared receive queue's CQ: the sessions it routes to are drained and
        // warmed (looked at by the next rounds).
        engine.reap_shared(false);
        for conn in sessions.iter().filter(|c| !c.heat.is_cold()) {
            if engine.progress(conn, false, Catch::Session(claimed)) {
                conn.heat.heard();
            }
        }
        let ready = runners.ready_len.load(Ordering::Acquire) > 0;
        match claimed.take() {
            // Sessions scheduled before it (by the poller, or in this round once
            // `claimed` was taken) keep their place.
            Some(conn) if ready => runners.schedule(conn),
            Some(conn) => return Rounds::Claimed(conn),
            None => {}
        }
        if ready {
            return Rounds::Ready;
        }
        if let Some(now) = ticker.round() {
            let now = runners.since_base(now);
            if now.saturating_sub(*began.get_or_insert(now)) >= budget {
                return Rounds::Idle;
            }
            cool(engine, sessions, now);
            runners.check_at(&engine.me, now);
        }
        if ticker.yield_due() {
            // A woken thread gets the core now and then.
            std::thread::yield_now();
        }
        // No `spin_loop` (PAUSE), as in the rounds of `Engine::spin`.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callback_seen_running_across_more_than_stall_is_blocked() {
        let stall = STALL.as_nanos() as u64;
        let slot = Slot::default();
        assert!(!slot.blocked(1), "no callback runs");
        slot.step();
        assert!(!slot.blocked(1_000), "first seen: its clock starts");
        assert!(!slot.blocked(1_000 + stall), "not more than STALL yet");
        assert!(slot.blocked(1_001 + stall));
        slot.step();
        assert!(!slot.blocked(9 * stall), "it returned");
        slot.step();
        assert!(
            !slot.blocked(10 * stall),
            "the next callback is new: its clock starts again"
        );
        assert!(slot.blocked(11 * stall + 1));
    }

    #[test]
    fn a_session_goes_cold_after_a_quiet_stretch_and_warms_on_activity() {
        let heat = Heat::default();
        assert!(!heat.tick(1_000, 500), "the first tick starts the clock");
        assert!(!heat.tick(1_400, 500));
        heat.heard();
        assert!(!heat.tick(1_600, 500), "heard: the clock starts again");
        assert!(!heat.tick(2_000, 500));
        assert!(!heat.is_cold());
        assert!(heat.tick(2_200, 500), "quiet for 600 of 500: cold, arm it");
        assert!(heat.is_cold());
        heat.warm();
        assert!(!heat.is_cold());
        assert!(!heat.tick(9_000, 500), "warmed: the clock starts again");
    }

    #[test]
    fn replacements_for_panicked_runners_wait_longer_each_time_until_forgotten() {
        let runners = Runners::new();
        let ms = 1_000_000;
        let paused = |r: &Runners| r.pause_until.load(Ordering::Acquire);
        runners.failed(1);
        assert_eq!(paused(&runners), 1, "the first: at once");
        runners.failed(2);
        assert_eq!(paused(&runners), 2 + 2 * ms);
        runners.failed(3);
        assert_eq!(paused(&runners), 3 + 4 * ms);
        for i in 4..20 {
            runners.failed(i);
        }
        assert_eq!(paused(&runners), 19 + 1024 * ms, "at most about a second");
        let later = 19 + FAILURES_FORGOTTEN.as_nanos() as u64 + 1;
        runners.failed(later);
        assert_eq!(paused(&runners), later, "forgotten: at once again");
    }

    #[test]
    fn a_session_goes_cold_after_sixteen_busy_polls() {
        assert_eq!(cold_after(Duration::from_millis(2)), 32_000_000);
        assert_eq!(cold_after(Duration::ZERO), 0);
        assert_eq!(cold_after(Duration::MAX), u64::MAX, "saturates");
    }
}
