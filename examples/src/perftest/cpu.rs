//! `--cpu_util` (duration mode): the machine's CPU use over the sampled window,
//! as perftest measures it (`get_cpu_stats`, `calc_cpu_util`). The user and idle
//! times of `/proc/stat`'s first line are read at the window's start and end,
//! and the figure is the user time over user and idle time, in percent. One
//! window a process, as perftest keeps one.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// The window being sampled: its number, and the times at its start and end.
struct Window {
    id: u64,
    start: Option<Times>,
    end: Option<Times>,
}

/// User and idle time, in the kernel's ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Times {
    user: i64,
    idle: i64,
}

static WINDOW: Mutex<Window> = Mutex::new(Window {
    id: 0,
    start: None,
    end: None,
});

fn window() -> MutexGuard<'static, Window> {
    WINDOW.lock().unwrap_or_else(|e| e.into_inner())
}

/// Samples the CPU's times at `start` and at `end`, from a thread that sleeps
/// until each (as perftest's alarm does); a later window replaces this one.
pub fn sample(start: Instant, end: Instant) {
    let id = {
        let mut w = window();
        w.id += 1;
        w.start = None;
        w.end = None;
        w.id
    };
    // Without a thread the window is not sampled, and the figure is 0.
    let _ = std::thread::Builder::new().spawn(move || {
        for (at, first) in [(start, true), (end, false)] {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let Some(now) = read_times() else { return };
            let mut w = window();
            if w.id != id {
                return;
            }
            let slot = if first { &mut w.start } else { &mut w.end };
            slot.get_or_insert(now);
        }
    });
}

/// The utilization of the window in percent: 0 when none was sampled (as
/// perftest prints for a side whose window never started). A window whose end
/// the sampler has not reached yet ends now.
pub fn utilization() -> f64 {
    let mut w = window();
    let Some(start) = w.start else { return 0.0 };
    let end = *w.end.get_or_insert_with(|| read_times().unwrap_or(start));
    percent(start, end)
}

/// perftest's arithmetic, in its `float`.
fn percent(start: Times, end: Times) -> f64 {
    let (user, idle) = (end.user - start.user, end.idle - start.idle);
    if user + idle == 0 {
        return 0.0;
    }
    f64::from(user as f32 / (user + idle) as f32 * 100.0)
}

/// The user and idle times of `/proc/stat`'s first line ("cpu  user nice system
/// idle ..."), read alone as perftest reads it; `None` if it cannot be read.
fn read_times() -> Option<Times> {
    use std::io::BufRead;
    let mut line = String::new();
    let file = std::fs::File::open("/proc/stat").ok()?;
    std::io::BufReader::new(file).read_line(&mut line).ok()?;
    parse(&line)
}

fn parse(stat: &str) -> Option<Times> {
    let words: Vec<&str> = stat.lines().next()?.split_whitespace().collect();
    Some(Times {
        user: words.get(1)?.parse().ok()?,
        idle: words.get(4)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_user_and_idle_as_perftest_does() {
        let stat = "cpu  1200 30 400 9000 5 0 7 0 0 0\ncpu0 600 15 200 4500 2 0 3 0 0 0\n";
        assert_eq!(
            parse(stat),
            Some(Times {
                user: 1200,
                idle: 9000
            })
        );
        assert_eq!(parse("cpu\n"), None);
        let (a, b) = (
            Times {
                user: 100,
                idle: 900,
            },
            Times {
                user: 175,
                idle: 1125,
            },
        );
        assert_eq!(percent(a, b), 25.0);
        assert_eq!(percent(a, a), 0.0);
    }
}
