//! Log lines about connections and sessions, at most so many a second
//! (`Config::log_lines_per_second`).
//!
//! Every connection `bind` refuses or whose handshake fails is worth a line (who,
//! and why), and so is every session that closes. But a flood of connections would
//! then be a flood of lines for the application's logger, as fast as an attacker
//! can connect. So, as the kernel's `net_ratelimit` does, a window of one second
//! opens at a kind's first line: its first lines are logged, the rest only counted,
//! and one summary line says how many were held once the window has ended (at the
//! next line, or when the accept loop or the poller next looks: every 100 ms at the
//! latest), and what a window holds when the accept loop or the transport stops is
//! reported then. No line goes uncounted.
//!
//! [`Window`] decides, with the time given to it (no clock, no I/O); [`LineLimit`]
//! shares one between threads and writes the lines.

use crate::engine::Log;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// How long a window lasts.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

/// One window's count: how many lines went out and how many were held.
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// When the window opened (`None`: no line since the last one ended).
    opened: Option<Instant>,
    logged: u32,
    held: u64,
}

/// What to do with one line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Lines an ended window held, to report before anything else (zero: none).
    pub(crate) summary: u64,
    /// Whether this line goes out.
    pub(crate) log: bool,
}

impl Window {
    /// A line at `now`, with at most `per_window` lines a window (0: all of them).
    pub(crate) fn line(&mut self, now: Instant, per_window: u32) -> Verdict {
        let summary = self.ended(now);
        if per_window == 0 {
            return Verdict { summary, log: true };
        }
        self.opened.get_or_insert(now);
        let log = self.logged < per_window;
        if log {
            self.logged += 1;
        } else {
            self.held += 1;
        }
        Verdict { summary, log }
    }

    /// If the window has ended by `now`: closes it and returns how many lines it
    /// held (zero: none, or it has not ended).
    pub(crate) fn ended(&mut self, now: Instant) -> u64 {
        match self.opened {
            Some(opened) if now.saturating_duration_since(opened) >= WINDOW => self.flush(),
            _ => 0,
        }
    }

    /// Closes the window whether or not it has ended; returns how many lines it held.
    pub(crate) fn flush(&mut self) -> u64 {
        std::mem::take(self).held
    }
}

/// The window shared by every thread that logs lines of one kind, and where they go.
pub(crate) struct LineLimit {
    window: Mutex<Window>,
    per_window: u32,
    /// What the lines are about, for the summary ("connections refused").
    what: &'static str,
    log: Log,
}

impl LineLimit {
    /// At most `per_second` lines a second about `what` (0: every line) to `log`.
    pub(crate) fn new(per_second: u32, what: &'static str, log: Log) -> LineLimit {
        LineLimit {
            window: Mutex::new(Window::default()),
            per_window: per_second,
            what,
            log,
        }
    }

    /// Logs `line` unless this second's lines are spent, in which case it is
    /// counted for the summary. The summary of an ended window goes first. (The
    /// logger is called without the lock held: it is the application's code.)
    pub(crate) fn line(&self, line: &str) {
        let verdict = self.window.lock().line(Instant::now(), self.per_window);
        self.summarize(verdict.summary);
        if verdict.log {
            (self.log)(line);
        }
    }

    /// Writes the summary of a window that has ended, if it held lines.
    pub(crate) fn look(&self) {
        let held = self.window.lock().ended(Instant::now());
        self.summarize(held);
    }

    /// Writes the summary of what the window holds, ended or not (the transport or
    /// its accept loop stops).
    pub(crate) fn flush(&self) {
        let held = self.window.lock().flush();
        self.summarize(held);
    }

    fn summarize(&self, held: u64) {
        if held > 0 {
            (self.log)(&summary_line(held, self.what, self.per_window));
        }
    }
}

impl Drop for LineLimit {
    /// What the last window held is reported, ended or not; but not from a thread
    /// that is unwinding, where the application's logger may panic again.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let held = self.window.get_mut().flush();
        self.summarize(held);
    }
}

/// `log`, with a panic in it caught: the line is lost, and the thread that logged
/// it (the accept loop, the poller, a runner, under a session's locks) is not. An
/// application's logger can panic where it cannot write (`eprintln!` to a closed
/// pipe), at a moment a peer chooses by closing a session.
pub(crate) fn unwinding_stops_here(log: Log) -> Log {
    std::sync::Arc::new(move |line: &str| {
        // The logger is the application's: nothing of ours is seen half changed
        // if it unwinds.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log(line)));
    })
}

/// The line that reports `held` lines about `what` not logged one by one.
pub(crate) fn summary_line(held: u64, what: &str, per_second: u32) -> String {
    format!(
        "{held} more {what} within a second, not logged one by one (at most {per_second} \
         lines a second: Config::log_lines_per_second)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_logger_that_panics_loses_its_line_and_nothing_else() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
        let sink = seen.clone();
        let log = unwinding_stops_here(Arc::new(move |line: &str| {
            sink.lock().push(line.into());
            if line == "boom" {
                panic!("the logger cannot write");
            }
        }));
        let limit = LineLimit::new(0, "lines", log);
        limit.line("one");
        limit.line("boom");
        limit.line("two");
        assert_eq!(*seen.lock(), ["one", "boom", "two"]);
    }

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_flood_is_logged_up_to_the_limit_and_counted_to_the_last_line() {
        let t0 = Instant::now();
        let mut w = Window::default();
        let logged = (0..1000u64)
            .filter(|i| {
                let v = w.line(at(t0, i / 2), 10);
                assert_eq!(v.summary, 0, "line {i}");
                v.log
            })
            .count();
        assert_eq!(logged, 10);
        // Nothing to report before the window ends; then all 990, once.
        assert_eq!(w.ended(at(t0, 999)), 0);
        assert_eq!(w.ended(at(t0, 1000)), 990);
        assert_eq!(w.ended(at(t0, 5000)), 0);
    }

    #[test]
    fn the_next_line_after_the_window_reports_what_it_held_first() {
        let t0 = Instant::now();
        let mut w = Window::default();
        for i in 0..3u64 {
            w.line(at(t0, i), 2);
        }
        // A new window opens at the line that ends the old one.
        let v = w.line(at(t0, 1500), 2);
        assert_eq!(
            v,
            Verdict {
                summary: 1,
                log: true
            }
        );
        assert!(w.line(at(t0, 1600), 2).log);
        assert!(!w.line(at(t0, 2499), 2).log);
        assert_eq!(
            w.line(at(t0, 2500), 2),
            Verdict {
                summary: 1,
                log: true
            }
        );
        // A flush reports what the open window holds.
        assert!(!w.line(at(t0, 2501), 1).log);
        assert_eq!(w.flush(), 1);
        assert_eq!(w.flush(), 0);
    }

    #[test]
    fn a_quiet_window_reports_nothing_and_zero_logs_every_line() {
        let t0 = Instant::now();
        let mut w = Window::default();
        assert_eq!(w.ended(at(t0, 10_000)), 0);
        for i in 0..5u64 {
            assert_eq!(
                w.line(at(t0, i), 5),
                Verdict {
                    summary: 0,
                    log: true
                }
            );
        }
        assert_eq!(w.ended(at(t0, 2000)), 0, "nothing was held");
        let mut all = Window::default();
        assert!((0..10_000u64).all(|i| all.line(at(t0, i / 100), 0).log));
        assert_eq!(all.ended(at(t0, 10_000)), 0);
    }

    #[test]
    fn the_shared_limit_writes_the_lines_let_through_and_every_summary() {
        let lines = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let log: Log = Arc::new(move |l: &str| sink.lock().push(l.to_string()));
        let limit = LineLimit::new(3, "connections refused", log);
        for i in 0..50 {
            limit.line(&format!("connection {i} refused"));
        }
        limit.look();
        assert_eq!(lines.lock().len(), 3, "{:?}", lines.lock());
        std::thread::sleep(WINDOW);
        limit.look();
        assert_eq!(lines.lock().len(), 4, "{:?}", lines.lock());
        assert!(lines.lock()[3].starts_with("47 more connections refused"));
        // What a window still open holds is reported when the limit goes.
        for i in 0..5 {
            limit.line(&format!("connection {i} refused"));
        }
        drop(limit);
        let lines = lines.lock();
        assert_eq!(lines.len(), 8, "{lines:?}");
        assert!(
            lines[7].starts_with("2 more connections refused"),
            "{}",
            lines[7]
        );
        assert!(
            lines[7].contains("Config::log_lines_per_second"),
            "{}",
            lines[7]
        );
    }
}
