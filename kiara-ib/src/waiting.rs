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
use std::time::Duration;

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
        let typical = Duration::from_nanos(self.typical_ns.load(Ordering::Relaxed));
        if typical * LONG_WAIT_DIVISOR > busy_poll {
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
}
