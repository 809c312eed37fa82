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
#[derive(Debug)]
pub struct Relax {
    empty: u32,
    period: u32,
}

/// Empty polls in a row before [`Relax`] yields.
pub const EMPTY_POLLS_BEFORE_YIELD: u32 = 128;

/// Empty polls in a row before [`Relax::latency`] yields: about a millisecond of
/// polling in the guest, far longer than a ping-pong's wait (20-50 µs one way),
/// far shorter than a scheduler tick.
pub const LATENCY_EMPTY_POLLS_BEFORE_YIELD: u32 = 4096;

impl Default for Relax {
    fn default() -> Self {
        Relax {
            empty: 0,
            period: EMPTY_POLLS_BEFORE_YIELD,
        }
    }
}

impl Relax {
    /// For the latency tools' ping-pongs, which wait tens of microseconds for
    /// each message: yields after [`LATENCY_EMPTY_POLLS_BEFORE_YIELD`] empty
    /// polls. The default's period, [`EMPTY_POLLS_BEFORE_YIELD`], put a yield
    /// inside 4-7% of those waits at the guest's fast speed and about 90% at
    /// its slow one, a system call C perftest does not make.
    pub fn latency() -> Self {
        Relax {
            empty: 0,
            period: LATENCY_EMPTY_POLLS_BEFORE_YIELD,
        }
    }

    /// Records an empty poll; yields the CPU every `period`th one in a row.
    #[inline]
    pub fn idle(&mut self) {
        self.empty += 1;
        if self.empty >= self.period {
            self.empty = 0;
            std::thread::yield_now();
        }
        // No `spin_loop` (PAUSE) otherwise: perftest's polls have none, and under
        // QEMU's TCG one leaves the translated code, which made the latency ports'
        // round trips 3-8% longer (docs/performance-history.md).
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

    /// The phases of `p`'s `-D` run starting now (none without `-D`, or with
    /// `--run_infinitely`, whose rows have no window), with the CPU sampled over
    /// the window for `--cpu_util`.
    pub fn of(p: &crate::perftest::params::Params) -> Option<Phases> {
        let secs = p.args.duration.filter(|_| Phases::wanted(p))?;
        let ph = Phases::start(secs);
        if p.cpu_util {
            crate::perftest::cpu::sample(ph.sample_start, ph.sample_end);
        }
        Some(ph)
    }

    /// True when `p` runs for a duration (`-D` without `--run_infinitely`), so
    /// that [`Phases::of`] gives phases.
    pub fn wanted(p: &crate::perftest::params::Params) -> bool {
        p.args.duration.is_some() && !p.args.run_infinitely
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

/// `--run_infinitely`'s rows: one every period, each over what completed since
/// the one before (perftest's `print_bw_infinite_mode`), timed by the cheap clock.
#[derive(Clone, Copy, Debug)]
pub struct Every {
    clock: Clock,
    period: u64,
    last_ticks: u64,
    last_count: u64,
}

impl Every {
    /// Rows every `secs` seconds, the first `secs` from now.
    pub fn new(clock: Clock, secs: u64) -> Every {
        Every {
            clock,
            period: clock.ticks_in(Duration::from_secs(secs)),
            last_ticks: clock.ticks(),
            last_count: 0,
        }
    }

    /// Once a period has passed since the last row: how many of the running
    /// `count` came since then, and in how many seconds.
    #[inline]
    pub fn due(&mut self, count: u64) -> Option<(u64, f64)> {
        let now = self.clock.ticks();
        let since = now.wrapping_sub(self.last_ticks);
        if since < self.period {
            return None;
        }
        let new = count - self.last_count;
        self.last_ticks = now;
        self.last_count = count;
        Some((new, self.clock.ns(since) / 1e9))
    }
}

/// A cheap clock for the data path: the CPU's time-stamp counter (as perftest's
/// `get_cycles`), at the rate perftest's `get_cpu_mhz` takes; elsewhere `Instant`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    ns_per_tick: f64,
}

/// How far a measured counter rate may be from the nominal one before the
/// measurement wins (perftest's `get_cpu_mhz`: 2%).
const NOMINAL_TOLERANCE: f64 = 0.02;

impl Clock {
    /// The counter's rate as perftest's `get_cpu_mhz` takes it: the nominal
    /// `cpu MHz` of `/proc/cpuinfo` when a measurement (20 ms against the
    /// monotonic clock) agrees within 2%, else the measurement. Measured alone,
    /// the first 20 ms of a process in the emulated guest read 0.4-1% slow (the
    /// first pass through new code), which made every time Rust printed that
    /// much longer than C's.
    ///
    /// Silent, as perftest is when the measurement wins; see
    /// `warn_cpu_freq` for the warning perftest does print.
    pub fn calibrate() -> Clock {
        if cfg!(target_arch = "x86_64") {
            let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            if let Some(measured) = Self::measure_mhz() {
                let mhz = choose_mhz(nominal_mhz(&cpuinfo), measured);
                return Clock {
                    ns_per_tick: 1e3 / mhz,
                };
            }
        }
        Clock { ns_per_tick: 1.0 }
    }

    /// Counter ticks per microsecond over 20 ms of the monotonic clock, after a
    /// first pass through the same code.
    fn measure_mhz() -> Option<f64> {
        let mut mhz = None;
        for _ in 0..2 {
            let (t0, c0) = (Instant::now(), Self::ticks_raw());
            std::thread::sleep(Duration::from_millis(if mhz.is_none() { 1 } else { 20 }));
            let (t1, c1) = (Instant::now(), Self::ticks_raw());
            let ticks = c1.wrapping_sub(c0) as f64;
            let us = (t1 - t0).as_nanos() as f64 / 1e3;
            mhz = Some(ticks / us).filter(|m| m.is_finite() && *m > 0.0);
        }
        mhz
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

/// The first `cpu MHz` of a `/proc/cpuinfo` text.
fn nominal_mhz(cpuinfo: &str) -> Option<f64> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()
        .filter(|m: &f64| m.is_finite() && *m > 0.0)
}

/// perftest's one warning about the clock, printed where it computes a report
/// (its `get_cpu_mhz`: each row a side prints from its own times) unless `quiet`
/// (`-F`): cores whose `cpu MHz` in `/proc/cpuinfo` differ by more than 2%.
pub fn warn_cpu_freq(quiet: bool) {
    if quiet || !cfg!(target_arch = "x86_64") {
        return;
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if let Some((first, other)) = conflicting_mhz(&cpuinfo) {
        eprintln!(
            "Conflicting CPU frequency values detected: {first:.6} != {other:.6}. \
             CPU Frequency is not max."
        );
    }
}

/// The first non-zero core's `cpu MHz` and the first later core's more than 2%
/// away from it, as perftest's `proc_get_cpu_mhz` finds them for its warning.
fn conflicting_mhz(cpuinfo: &str) -> Option<(f64, f64)> {
    let mut rates = cpuinfo
        .lines()
        .filter(|l| l.starts_with("cpu MHz"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok());
    let first = rates.find(|m| *m != 0.0)?;
    let other = rates.find(|m| (first - m).abs() / first > NOMINAL_TOLERANCE)?;
    Some((first, other))
}

/// perftest's choice between the nominal rate and a measured one.
fn choose_mhz(nominal: Option<f64>, measured: f64) -> f64 {
    match nominal {
        Some(n) if (n - measured).abs() / n <= NOMINAL_TOLERANCE => n,
        _ => measured,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_perftests_choice() {
        let cpuinfo =
            "processor\t: 0\nmodel name\t: QEMU\ncpu MHz\t\t: 2445.399\ncache size\t: 512 KB\n";
        assert_eq!(nominal_mhz(cpuinfo), Some(2445.399));
        assert_eq!(nominal_mhz("processor : 0\n"), None);
        assert_eq!(nominal_mhz("cpu MHz : n/a\n"), None);
        // The first 20 ms of a process in the guest: 0.7% slow; the nominal wins.
        assert_eq!(choose_mhz(Some(2445.399), 2427.7), 2445.399);
        // A measurement 3% off, or no nominal rate: the measurement.
        assert_eq!(choose_mhz(Some(2445.399), 2372.0), 2372.0);
        assert_eq!(choose_mhz(None, 2427.7), 2427.7);
        let clock = Clock::calibrate();
        assert!(clock.ns(1_000_000) > 0.0);
    }

    #[test]
    fn cores_more_than_two_percent_apart_conflict() {
        let cores = |rates: &[&str]| -> String {
            rates
                .iter()
                .map(|r| format!("cpu MHz\t\t: {r}\n"))
                .collect()
        };
        assert_eq!(conflicting_mhz(&cores(&["2445.399", "2445.399"])), None);
        assert_eq!(conflicting_mhz(&cores(&["2400.000", "2440.000"])), None);
        assert_eq!(
            conflicting_mhz(&cores(&["2400.000", "2420.000", "1200.000", "800.000"])),
            Some((2400.0, 1200.0))
        );
        assert_eq!(conflicting_mhz(&cores(&["2400.000"])), None);
        // Cores reading 0 before the first rate are skipped, as perftest does.
        assert_eq!(
            conflicting_mhz(&cores(&["0.000", "2400.000", "2400.000"])),
            None
        );
        assert_eq!(conflicting_mhz(""), None);
    }
}
