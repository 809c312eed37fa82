//! When a waiting thread should spin on a session's completion queue, and when the
//! poller may arm that queue's notification.
//!
//! Spinning wins when the answer comes within a few microseconds (a request/reply
//! round trip); it loses when waits are long (a window of large messages): the
//! spinning thread then takes a core from the work it waits for, which on a
//! software RDMA device is the kernel's packet processing. So each session keeps a
//! running estimate of how long its waits take and spins only while they are
//! short (and only briefly while they are long). The poller leaves a queue unarmed while a thread spins on it, so that
//! every completion does not also wake the poller.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Waits longer than `busy_poll / LONG_WAIT_DIVISOR` on average stop the spinning.
const LONG_WAIT_DIVISOR: u32 = 4;

/// While waits are long, a wait still spins for `busy_poll / SHORT_LOOK_DIVISOR`.
const SHORT_LOOK_DIVISOR: u32 = 16;

/// Callback runners that may spin at once per transport: one fewer than the cores, at
/// least one. More would take every core from the kernel's packet processing on a
/// software device, and from the threads that must wake.
pub(crate) fn max_spinners() -> usize {
    // Asked once: `available_parallelism` reads cgroup files, allocating each time.
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get().saturating_sub(1))
            .max(1)
    })
}

/// The right of one thread of a transport to spin, while held.
pub(crate) struct Allowance<'a>(&'a AtomicUsize);

impl<'a> Allowance<'a> {
    /// Takes an allowance if fewer than [`max_spinners`] threads spin.
    pub(crate) fn take(count: &'a AtomicUsize) -> Option<Allowance<'a>> {
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

/// The wait statistics of one session.
#[derive(Default)]
pub(crate) struct Waiting {
    /// Threads spinning on the session's completion queue right now.
    spinners: AtomicU32,
    /// Spins started so far.
    epoch: AtomicU64,
    /// `epoch` when the poller last looked.
    seen_epoch: AtomicU64,
    /// Running average of recent waits, in nanoseconds (weight 1/8 per wait).
    typical_ns: AtomicU64,
    /// Spinning rounds a millisecond, as the last spin measured it ([`Ticker`]).
    pub(crate) pace: AtomicU32,
}

/// Marks a thread as spinning until dropped.
pub(crate) struct Spinning<'a>(&'a Waiting);

impl Drop for Spinning<'_> {
    fn drop(&mut self) {
        self.0.spinners.fetch_sub(1, Ordering::Release);
    }
}

impl Waiting {
    /// How long the next wait may spin: `busy_poll` while waits are short, else a
    /// short look (`busy_poll / SHORT_LOOK_DIVISOR`): a wait that ends within it is
    /// short again, which brings the full spinning back. (Waits that sleep also
    /// measure the wake-up, which can be slow enough to keep the average long.)
    pub(crate) fn spin_budget(&self, busy_poll: Duration) -> Duration {
        let typical = u128::from(self.typical_ns.load(Ordering::Relaxed));
        if typical * u128::from(LONG_WAIT_DIVISOR) > busy_poll.as_nanos() {
            busy_poll / SHORT_LOOK_DIVISOR
        } else {
            busy_poll
        }
    }

    /// Counts the calling thread as spinning until the guard is dropped.
    pub(crate) fn spinning(&self) -> Spinning<'_> {
        self.spinners.fetch_add(1, Ordering::Acquire);
        self.epoch.fetch_add(1, Ordering::Relaxed);
        Spinning(self)
    }

    /// Records how long a wait took (spinning and sleeping).
    pub(crate) fn record(&self, waited: Duration) {
        let sample = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX) / 8;
        let old = self.typical_ns.load(Ordering::Relaxed);
        // A lost update between two waiters only skews an estimate.
        self.typical_ns
            .store(old - old / 8 + sample, Ordering::Relaxed);
    }

    /// True while some thread spins on the queue.
    pub(crate) fn is_spun(&self) -> bool {
        self.spinners.load(Ordering::Acquire) > 0
    }

    /// Whether the poller may arm the queue's notification before it sleeps: not
    /// while a thread spins on it or has spun since the poller's last look (that
    /// thread will likely spin again soon; the poller looks again within a few
    /// milliseconds).
    pub(crate) fn poller_may_arm(&self) -> bool {
        let epoch = self.epoch.load(Ordering::Relaxed);
        let seen = self.seen_epoch.swap(epoch, Ordering::Relaxed);
        self.spinners.load(Ordering::Acquire) == 0 && seen == epoch
    }
}

/// Rounds a spin makes before its first look at the clock, until the speed of a
/// round is learnt.
const FIRST_STEP: u32 = 64;

/// Bounds of the rounds between two looks at the clock.
const STEP: std::ops::RangeInclusive<u32> = 16..=1 << 16;

/// Rounds of spinning between two offers of the core to another thread.
pub(crate) const YIELD_EVERY: u32 = 1024;

/// A spinning loop's clock: it reads the clock about once a `period`, counting
/// rounds in between. On a machine whose clock is an emulated device a reading is a
/// system call (2.5 to 8 µs on the project's Soft-RoCE guest while its clock was an
/// emulated HPET), dearer than a round: a spin that ends within a period reads it
/// not at all.
///
/// How many rounds make a millisecond is learnt from the spins that read the clock
/// twice, and shared through `pace` with the spins that follow (one per session for
/// `recv` waiters, one per transport for the callback runners).
pub(crate) struct Ticker<'a> {
    pace: &'a AtomicU32,
    period: Duration,
    rounds: u32,
    next: u32,
    first: Option<(Instant, u32)>,
}

impl<'a> Ticker<'a> {
    /// A spin that wants to look at the clock about once a `period`.
    pub(crate) fn new(pace: &'a AtomicU32, period: Duration) -> Self {
        Ticker {
            pace,
            period,
            rounds: 0,
            next: step(pace, period),
            first: None,
        }
    }

    /// Counts a round; the clock when a look at it is due.
    pub(crate) fn round(&mut self) -> Option<Instant> {
        self.rounds = self.rounds.wrapping_add(1);
        if self.rounds != self.next {
            return None;
        }
        let now = Instant::now();
        match self.first {
            None => self.first = Some((now, self.rounds)),
            Some((then, at)) => {
                let nanos = now.duration_since(then).as_nanos().max(1);
                let per_ms = u128::from(self.rounds.wrapping_sub(at)) * 1_000_000 / nanos;
                self.pace.store(
                    u32::try_from(per_ms).unwrap_or(u32::MAX).max(1),
                    Ordering::Relaxed,
                );
            }
        }
        self.next = self.rounds.wrapping_add(step(self.pace, self.period));
        Some(now)
    }

    /// The rounds from here on are timed afresh: time passed since the last look
    /// that was not spent in rounds (a callback ran) does not count in the pace.
    pub(crate) fn restart(&mut self) {
        self.first = None;
    }

    /// Whether this round should offer the core to another thread.
    pub(crate) fn yield_due(&self) -> bool {
        self.rounds % YIELD_EVERY == 0
    }
}

/// Rounds in `period` at the learnt pace (or the first step), within bounds.
fn step(pace: &AtomicU32, period: Duration) -> u32 {
    match pace.load(Ordering::Relaxed) {
        0 => FIRST_STEP,
        per_ms => {
            // In 64 bits: a 128-bit division is a library call, on every wait.
            let nanos = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
            let rounds = u64::from(per_ms).saturating_mul(nanos) / 1_000_000;
            u32::try_from(rounds)
                .unwrap_or(u32::MAX)
                .clamp(*STEP.start(), *STEP.end())
        }
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

    #[test]
    fn long_waits_stop_the_spinning_and_short_ones_bring_it_back() {
        let w = Waiting::default();
        let busy = Duration::from_millis(2);
        assert_eq!(w.spin_budget(busy), busy);
        for _ in 0..40 {
            w.record(Duration::from_millis(1));
        }
        assert_eq!(w.spin_budget(busy), busy / SHORT_LOOK_DIVISOR);
        for _ in 0..40 {
            w.record(Duration::from_micros(30));
        }
        assert_eq!(w.spin_budget(busy), busy);
    }

    #[test]
    fn the_poller_arms_only_after_a_quiet_look() {
        let w = Waiting::default();
        assert!(w.poller_may_arm());
        let guard = w.spinning();
        assert!(!w.poller_may_arm(), "a thread is spinning");
        drop(guard);
        drop(w.spinning());
        assert!(!w.poller_may_arm(), "a thread spun since the last look");
        assert!(w.poller_may_arm(), "quiet since the last look");
    }

    #[test]
    fn a_ticker_looks_at_the_clock_at_its_pace_and_learns_it() {
        let pace = AtomicU32::new(0);
        let mut ticker = Ticker::new(&pace, Duration::from_millis(1));
        let looks: Vec<u32> = (1..=2 * FIRST_STEP)
            .filter(|_| ticker.round().is_some())
            .collect();
        assert_eq!(looks, [FIRST_STEP, 2 * FIRST_STEP], "the first step, twice");
        assert_ne!(pace.load(Ordering::Relaxed), 0, "learnt from two looks");
        let period = Duration::from_micros(10);
        let expected = step(&pace, period);
        assert!(STEP.contains(&expected));
        let mut next = Ticker::new(&pace, period);
        let first = (1..=*STEP.end()).find(|_| next.round().is_some());
        assert_eq!(
            first,
            Some(expected),
            "the next spin steps at the learnt pace"
        );
    }

    #[test]
    fn the_step_is_the_rounds_of_a_period_within_bounds() {
        let pace = AtomicU32::new(2_000); // rounds a millisecond
        assert_eq!(step(&pace, Duration::from_micros(250)), 500);
        assert_eq!(step(&pace, Duration::from_nanos(1)), *STEP.start());
        assert_eq!(step(&pace, Duration::from_secs(3600)), *STEP.end());
        assert_eq!(step(&pace, Duration::MAX), *STEP.end(), "saturates");
        assert_eq!(step(&AtomicU32::new(0), Duration::from_secs(1)), FIRST_STEP);
    }
}
