//! Child processes with deadlines, for the interop and error tests: every wait has a
//! timeout and a child left running is killed when its handle drops.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running child whose output is collected; killed on drop.
pub struct Running {
    child: Option<Child>,
    what: String,
    /// Readers of stdout and stderr: drained while the child runs, so a chatty
    /// child never blocks on a full pipe.
    readers: Option<(JoinHandle<()>, JoinHandle<()>)>,
    /// What the readers collected so far.
    out: (Shared, Shared),
}

/// Output collected by a reader thread.
type Shared = Arc<Mutex<Vec<u8>>>;

fn drain(mut r: impl Read + Send + 'static, into: Shared) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&chunk[..n]);
        }
    })
}

fn text(buf: &Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// What a finished child left.
#[derive(Debug)]
pub struct Finished {
    /// Exit status (`None`: it was killed after its deadline).
    pub status: Option<ExitStatus>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl Finished {
    /// True when it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The lines of stdout starting with `prefix`, without it.
    pub fn lines_after(&self, prefix: &str) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(prefix).map(str::to_owned))
            .collect()
    }
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Starts `program` with `args`, stdout and stderr piped.
pub fn spawn(program: &str, args: &[&str]) -> Running {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let out = (Arc::default(), Arc::default());
    let readers = match (child.stdout.take(), child.stderr.take()) {
        (Some(o), Some(e)) => Some((drain(o, Arc::clone(&out.0)), drain(e, Arc::clone(&out.1)))),
        _ => None,
    };
    Running {
        child: Some(child),
        what: format!("{program} {}", args.join(" ")),
        readers,
        out,
    }
}

impl Running {
    /// Waits up to `timeout` for the exit; kills the child after it. Either way the
    /// output is returned.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let mut child = self.child.take().expect("waited once");
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    eprintln!("killing `{}` after {timeout:?}", self.what);
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        if let Some((o, e)) = self.readers.take() {
            let _ = o.join();
            let _ = e.join();
        }
        let (stdout, stderr) = (text(&self.out.0), text(&self.out.1));
        Finished {
            status,
            stdout,
            stderr,
        }
    }

    /// Kills the child now and returns its output.
    pub fn kill(mut self) -> Finished {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
        self.wait(Duration::from_secs(5))
    }

    /// True once the child has exited (its output is still collected by `wait`).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// What the child wrote to stdout so far.
    pub fn stdout_so_far(&self) -> String {
        text(&self.out.0)
    }

    /// Waits up to `timeout` until the child's stdout contains `text`; false if it
    /// did not by then (or the child exited without it).
    pub fn wait_for_stdout(&mut self, text: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stdout_so_far().contains(text) {
                return true;
            }
            if Instant::now() >= deadline || self.exited() {
                // What it wrote before exiting may still be on its way.
                std::thread::sleep(Duration::from_millis(100));
                return self.stdout_so_far().contains(text);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the child wrote to stderr so far.
    pub fn stderr_so_far(&self) -> String {
        text(&self.out.1)
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs a client until it exits (or `timeout`), retrying while the output says the
/// server was not listening yet (`nobody listens`, C rping's `REJECTED, error 8`),
/// for up to `startup` in total.
pub fn run_client(program: &str, args: &[&str], timeout: Duration, startup: Duration) -> Finished {
    let deadline = Instant::now() + startup;
    loop {
        let out = spawn(program, args).wait(timeout);
        let not_yet = out.stderr.contains("nobody listens")
            || out.stderr.contains("REJECTED, error 8")
            || out.stderr.contains("rdma_connect: Connection refused")
            || out.stdout.contains("REJECTED, error 8");
        if !not_yet || Instant::now() > deadline {
            return out;
        }
        eprintln!("{program}: the server does not listen yet, retrying");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A port for a test: `base` plus a value from the process id, so that parallel
/// runs and consecutive tests do not collide.
pub fn port(base: u16, slot: u16) -> u16 {
    base + (std::process::id() % 1000) as u16 * 10 + slot
}
