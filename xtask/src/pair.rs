//! Booting two hosts ([`crate::hosts`]) and supervising them as one run.
//!
//! xtask connects the two ends of the wire (a TCP connection on 127.0.0.1, see
//! [`crate::hosts`]) and starts both QEMUs at once, each with its end; it closes
//! its own copies as soon as both have started, so that a QEMU that ends closes
//! the wire and the other drops what it sends from then on. Each
//! guest is supervised on a thread of its own, exactly as a single guest is
//! (hard timeout, markers, console tail). If one guest fails (setup failure,
//! crash, timeout), the other is killed at once and the error names the host
//! that failed, with its last console lines. A guest may also be ended on
//! purpose: a test that writes the file `kill-<host>` into the shared directory
//! has that host's QEMU killed outright (the peer-killed fault of
//! `docs/faults.md`); xtask then writes `<host>.killed` there and reports that
//! host as killed, not failed.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use crate::error::{Context, Error, Result};
use crate::guest::{fresh_run_dir, Assets, GuestRun};
use crate::hosts::{Host, HostNet, HOSTS};
use crate::step;
use crate::workspace::Workspace;
use crate::GuestOptions;

/// How often the supervisor looks for kill requests.
const POLL: Duration = Duration::from_millis(100);

/// How a host's run ended, when the pair as a whole did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEnd {
    /// The command ran and exited with this status.
    Exited(i32),
    /// Its QEMU was killed on a test's request (`kill-<host>`).
    Killed,
}

/// A marker callback of one host; it runs on that host's supervising thread.
pub type OnMarker<'a> = &'a mut (dyn FnMut(&str, &str) + Send);

/// One two-host run: the directory `target/vm/run/<pid>/` holding each host's
/// run directory and the shared one, removed when dropped.
#[derive(Debug)]
pub struct Pair {
    ws: Workspace,
    dir: PathBuf,
    shared: PathBuf,
}

/// What the supervisor knows of one guest while it runs.
#[derive(Default)]
struct Slot {
    /// QEMU's process id, while it may be signalled.
    pid: Mutex<Option<u32>>,
    /// The supervisor killed it: on request, or because the other host failed.
    killed: AtomicBool,
    /// It was killed on a test's request.
    on_request: AtomicBool,
}

impl Slot {
    /// Kills the guest's QEMU if it still runs; returns whether it did.
    fn kill(&self) -> bool {
        let pid = self.pid.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pid) = *pid else { return false };
        self.killed.store(true, Ordering::SeqCst);
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: kill has no memory effects; the pid is QEMU's, not yet reaped
        // (the lock is held, and the supervising thread clears it before reaping).
        unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
    }
}

impl Pair {
    /// Creates the run directory with the shared directory in it.
    pub fn new(ws: &Workspace) -> Result<Self> {
        let dir = fresh_run_dir(ws)?;
        let shared = dir.join("shared");
        fs::create_dir_all(&shared).context(format!("creating {}", shared.display()))?;
        Ok(Pair {
            ws: ws.clone(),
            dir,
            shared,
        })
    }

    /// The directory both guests share (`XTASK_HOSTS_DIR`).
    pub fn shared(&self) -> &Path {
        &self.shared
    }

    /// Boots both hosts, runs `bodies[0]` on A and `bodies[1]` on B, and waits
    /// for both. Output lines start with `a| ` or `b| `.
    pub fn run(
        &self,
        assets: &Assets,
        opts: &GuestOptions,
        bodies: [&str; 2],
        on_marker: [OnMarker<'_>; 2],
    ) -> Result<[HostEnd; 2]> {
        let (wire, port) = connect_wire()?;
        let mut wire = wire.map(Some);
        let runs = HOSTS.map(|host| {
            let net = HostNet {
                host,
                wire_fd: wire[host.index()].as_ref().map_or(-1, |w| w.as_raw_fd()),
                shared: self.shared.clone(),
            };
            GuestRun::for_host(
                &self.ws,
                self.dir.join(format!("host-{}", host.name())),
                net,
            )
        });
        let [a, b] = runs;
        let runs = [a?, b?];
        step!(
            "two hosts: a at {} and b at {}, wired through 127.0.0.1:{port}",
            Host::A.ip(),
            Host::B.ip()
        );
        let slots: [Slot; 2] = Default::default();
        let [on_a, on_b] = on_marker;
        let (tx, rx) = mpsc::channel();
        let go = |i: usize, on: &mut (dyn FnMut(&str, &str) + Send)| {
            let r = runs[i].run_tracked(assets, opts, bodies[i], on, &slots[i].pid);
            let _ = tx.send((i, r));
        };
        let go = &go;
        let results = std::thread::scope(|s| {
            s.spawn(move || go(0, on_a));
            s.spawn(move || go(1, on_b));
            let mut results: [Option<Result<i32>>; 2] = [None, None];
            self.supervise(&rx, &slots, &mut results, &mut wire);
            results
        });
        self.outcome(results, &slots)
    }

    /// Collects both results, killing the other guest when one fails, serving
    /// kill requests meanwhile, and closing our end of a host's wire once its
    /// QEMU holds it.
    fn supervise(
        &self,
        rx: &mpsc::Receiver<(usize, Result<i32>)>,
        slots: &[Slot; 2],
        results: &mut [Option<Result<i32>>; 2],
        wire: &mut [Option<TcpStream>; 2],
    ) {
        while results.iter().any(Option::is_none) {
            for (end, slot) in wire.iter_mut().zip(slots) {
                if slot.pid.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                    *end = None;
                }
            }
            match rx.recv_timeout(POLL) {
                Ok((i, r)) => {
                    let failed = r.is_err() && !slots[i].killed.load(Ordering::SeqCst);
                    results[i] = Some(r);
                    if failed && slots[1 - i].kill() {
                        step!(
                            "host {} failed: killing host {}",
                            HOSTS[i].name(),
                            HOSTS[1 - i].name()
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.serve_kill_requests(slots),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    /// Kills the host named by a `kill-<host>` file in the shared directory,
    /// once. The request stays where it is: removing it could race with the
    /// guest still creating it, and over 9p the guest's `open` then fails with
    /// `ENOENT` although the kill goes ahead.
    fn serve_kill_requests(&self, slots: &[Slot; 2]) {
        for host in HOSTS {
            let slot = &slots[host.index()];
            let request = self.shared.join(format!("kill-{}", host.name()));
            if slot.on_request.load(Ordering::SeqCst) || !request.exists() {
                continue;
            }
            slot.on_request.store(true, Ordering::SeqCst);
            let done = slot.kill();
            step!(
                "host {}: QEMU killed on a test's request{}",
                host.name(),
                if done { "" } else { " (it had already ended)" }
            );
            let _ = fs::write(self.shared.join(format!("{}.killed", host.name())), "");
        }
    }

    /// The pair's result: an error naming the host that failed first, else how
    /// each host ended.
    fn outcome(
        &self,
        results: [Option<Result<i32>>; 2],
        slots: &[Slot; 2],
    ) -> Result<[HostEnd; 2]> {
        let mut ends = [HostEnd::Killed; 2];
        let mut errors = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            let name = HOSTS[i].name();
            match r {
                Some(Ok(st)) => ends[i] = HostEnd::Exited(st),
                _ if slots[i].on_request.load(Ordering::SeqCst) => ends[i] = HostEnd::Killed,
                Some(Err(e)) if !slots[i].killed.load(Ordering::SeqCst) => {
                    errors.push(format!("host {name}: {e}"))
                }
                Some(Err(_)) => {}
                None => errors.push(format!("host {name}: no result")),
            }
        }
        if errors.is_empty() {
            return Ok(ends);
        }
        Err(Error::new(format!(
            "{}\n(both guests were stopped)",
            errors.join("\n")
        )))
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The wire: both ends of a TCP connection on 127.0.0.1 (host A's end first)
/// with Nagle's algorithm off, and the port it was made on (for messages).
fn connect_wire() -> Result<([TcpStream; 2], u16)> {
    let l = TcpListener::bind("127.0.0.1:0").context("listening on 127.0.0.1 for the wire")?;
    let addr = l.local_addr().context("reading the wire's port")?;
    let a = TcpStream::connect(addr).context("connecting the wire on 127.0.0.1")?;
    let (b, _) = l.accept().context("accepting the wire on 127.0.0.1")?;
    for end in [&a, &b] {
        end.set_nodelay(true)
            .context("setting TCP_NODELAY on the wire")?;
    }
    Ok(([a, b], addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_carries_bytes_both_ways() {
        use std::io::{Read, Write};
        let ([mut a, mut b], port) = connect_wire().unwrap();
        assert!(port > 0 && a.nodelay().unwrap() && b.nodelay().unwrap());
        a.write_all(b"frame").unwrap();
        let mut buf = [0u8; 5];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"frame");
    }

    #[test]
    fn a_failure_names_the_host_and_a_kill_on_request_is_no_failure() {
        let ws = Workspace::locate().unwrap();
        let pair = Pair {
            ws,
            dir: PathBuf::from("/nonexistent"),
            shared: PathBuf::from("/nonexistent/shared"),
        };
        let slots: [Slot; 2] = Default::default();
        let r = pair.outcome([Some(Ok(0)), Some(Ok(3))], &slots).unwrap();
        assert_eq!(r, [HostEnd::Exited(0), HostEnd::Exited(3)]);
        slots[0].killed.store(true, Ordering::SeqCst);
        let e = pair
            .outcome(
                [Some(Err(Error::new("x"))), Some(Err(Error::new("boom")))],
                &slots,
            )
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("host b: boom\n"), "{e}");
        slots[1].on_request.store(true, Ordering::SeqCst);
        slots[0].killed.store(false, Ordering::SeqCst);
        let r = pair
            .outcome([Some(Ok(0)), Some(Err(Error::new("gone")))], &slots)
            .unwrap();
        assert_eq!(r, [HostEnd::Exited(0), HostEnd::Killed]);
    }

    #[test]
    fn a_kill_request_is_served_once_and_left_in_place() {
        let dir = std::env::temp_dir().join(format!("xtask-kill-{}", std::process::id()));
        let shared = dir.join("shared");
        fs::create_dir_all(&shared).unwrap();
        let pair = Pair {
            ws: Workspace::locate().unwrap(),
            dir: dir.clone(),
            shared: shared.clone(),
        };
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let slots: [Slot; 2] = Default::default();
        *slots[1].pid.lock().unwrap() = Some(sleeper.id());
        pair.serve_kill_requests(&slots);
        assert!(!slots[1].killed.load(Ordering::SeqCst), "no request yet");
        fs::write(shared.join("kill-b"), "").unwrap();
        pair.serve_kill_requests(&slots);
        let status = sleeper.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(slots[1].on_request.load(Ordering::SeqCst));
        assert!(shared.join("b.killed").exists());
        assert!(shared.join("kill-b").exists(), "the request must stay");
        fs::remove_file(shared.join("b.killed")).unwrap();
        pair.serve_kill_requests(&slots);
        assert!(!shared.join("b.killed").exists(), "served a second time");
        assert!(!slots[0].killed.load(Ordering::SeqCst));
    }
}
