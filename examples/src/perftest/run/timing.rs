//! The data paths' clocks: the time-stamp counter ([`Clock`]), the phases of a
//! duration run ([`Phases`]) and the courtesy of a busy poller ([`Relax`]).

use std::time::{Duration, Instant};

/// Busy-polling with a courtesy: after `EMPTY_POLLS_BEFORE_YIELD` fruitless polls in a
/// row the thread yields the CPU once.
///
/// On a machine with fewer CPUs than busy pollers (the 2-vCPU Soft-RoCE guest runs
/// two spinning peers), rxe's deferred work (its tasklets, run by `ksoftirqd`) would
/// otherwise wait for the next scheduler tick, milliseconds later. With a CPU to
/// spare, `sched_yield` returns at once and costs one system call per
/// `EMPTY_POLLS_BEFORE_YIELD` empty polls.
#[derive(Debug, Default)]
pub struct Relax {
    empty: u32,
}

/// Empty polls in a row before [`Relax`] yields.
pub const EMPTY_POLLS_BEFORE_YIELD: u32 = 128;

impl Relax {
    /// Records an empty poll; yields the CPU every `EMPTY_POLLS_BEFORE_YIELD`th one.
    #[inline]
    pub fn idle(&mut self) {
        self.empty += 1;
        if self.empty >= EMPTY_POLLS_BEFORE_YIELD {
            self.empty = 0;
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// Records progress.
    #[inline]
    pub fn busy(&mut self) {
        self.empty = 0;
    }
}

/// perftest's duration mode (`-D`): a margin of a quarter of the duration (whole
/// seconds: perftest's integer division), the sampled window, the margin again. Only
/// work completed inside the window counts; the figures are over the window's length.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    sample_start: Instant,
    sample_end: Instant,
    end: Instant,
}

impl Phases {
    /// The phases of a run of `secs` seconds starting now.
    pub fn start(secs: u64) -> Phases {
        let margin = Duration::from_secs(secs / 4);
        let now = Instant::now();
        let total = Duration::from_secs(secs);
        Phases {
            sample_start: now + margin,
            sample_end: now + total - margin,
            end: now + total,
        }
    }

    /// True inside the sampled window.
    #[inline]
    pub fn sampling(&self, now: Instant) -> bool {
        now >= self.sample_start && now < self.sample_end
    }

    /// True once the run is over.
    #[inline]
    pub fn ended(&self, now: Instant) -> bool {
        now >= self.end
    }

    /// The sampled window's length in seconds.
    pub fn window_secs(&self) -> f64 {
        (self.sample_end - self.sample_start).as_secs_f64()
    }
}

/// A cheap clock for the data path: the CPU's time-stamp counter (as perftest's
/// `get_cycles`), calibrated once against the monotonic clock; elsewhere `Instant`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    ns_per_tick: f64,
}

impl Clock {
    /// Calibrates the counter over 20 ms.
    pub fn calibrate() -> Clock {
        if cfg!(target_arch = "x86_64") {
            let (t0, c0) = (Instant::now(), Self::ticks_raw());
            std::thread::sleep(Duration::from_millis(20));
            let (t1, c1) = (Instant::now(), Self::ticks_raw());
            let ticks = c1.wrapping_sub(c0);
            if ticks > 0 {
                return Clock {
                    ns_per_tick: (t1 - t0).as_nanos() as f64 / ticks as f64,
                };
            }
        }
        Clock { ns_per_tick: 1.0 }
    }

    #[cfg(target_arch = "x86_64")]
    fn ticks_raw() -> u64 {
        // Raw on purpose: perftest times with the cycle counter (`get_cycles`), and
        // std offers no safe way to read it.
        // SAFETY: RDTSC has no preconditions on x86_64; it only reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn ticks_raw() -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    /// The counter now.
    #[inline]
    pub fn ticks(&self) -> u64 {
        Self::ticks_raw()
    }

    /// Counter ticks to nanoseconds.
    #[inline]
    pub fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 * self.ns_per_tick
    }

    /// Ticks in a duration.
    pub fn ticks_in(&self, d: Duration) -> u64 {
        (d.as_nanos() as f64 / self.ns_per_tick) as u64
    }
}
