//! Two-host tests: one test binary runs on each of the two guests of
//! `cargo xtask test` (see `docs/two-hosts.md`), and every test, a *case*, runs
//! in lockstep on both: host b plays the server, host a the client.
//!
//! The hosts coordinate through files in the directory both guests share
//! (`XTASK_HOSTS_DIR`), one directory per case,
//! `<shared>/cases/<test binary>/<case>/`. A host *publishes* a key by writing
//! `<host>.<key>` there; the other waits for it. [`Case::start`] publishes
//! `start` and waits for the peer's; dropping the case publishes `end` (`ok`,
//! or `FAILED: <panic message>`) and waits for the peer's, so the two hosts
//! leave a case together, and xtask reads every case's two `end` files for its
//! summary. A wait fails (panics, naming what it waited for) on its timeout, when
//! the peer has already left the case, when the peer's test binary or script has
//! ended, or when the peer was killed; so one host's failure never leaves the
//! other hanging.
//!
//! Outside `cargo xtask test` (no `XTASK_HOST`) a case fails: a two-host test
//! never passes without its peer.

pub mod fault;
pub mod files;
pub mod side;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// How long [`Case::start`] waits for the peer (it may still be finishing its
/// previous case).
pub const START_WAIT: Duration = Duration::from_secs(180);

/// How long dropping a case waits for the peer to leave it too.
const END_WAIT: Duration = Duration::from_secs(120);

/// How often waits look at the shared directory.
const POLL: Duration = Duration::from_millis(50);

/// What a host does in a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Host a: runs the clients.
    Client,
    /// Host b: runs the servers.
    Server,
}

/// One case, on this host: created by [`Case::start`], ended when dropped.
#[derive(Debug)]
pub struct Case {
    shared: PathBuf,
    dir: PathBuf,
    me: String,
    peer: String,
    binary: String,
}

/// The message of the last panic on this process, for the `end` file.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Records every panic's message in [`LAST_PANIC`], then reports it as before.
fn record_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
            previous(info);
        }));
    });
}

/// The variable `name`, which `cargo xtask test` sets on both hosts.
fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: two-host tests run on the two guests of `cargo xtask test`")
    })
}

/// This test binary's name without cargo's hash: `twohost_cm` for `twohost_cm-0123abcd`.
fn binary_name() -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
    strip_hash(&name.expect("the test binary's file name")).to_string()
}

/// `name` without a trailing `-<hex digits>`.
fn strip_hash(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((stem, hash)) if !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            stem
        }
        _ => name,
    }
}

impl Case {
    /// Starts case `name` on this host: puts the guest's own queueing discipline
    /// back (a case that was killed may have left its fault on), publishes
    /// `start` and waits for the peer's.
    pub fn start(name: &str) -> Case {
        record_panics();
        fault::set_qdisc(fault::BASE_QDISC);
        let shared = PathBuf::from(env("XTASK_HOSTS_DIR"));
        let binary = binary_name();
        let dir = shared.join("cases").join(&binary).join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let case = Case {
            shared,
            dir,
            me: env("XTASK_HOST"),
            peer: env("XTASK_PEER"),
            binary,
        };
        case.publish("start", "");
        case.wait_for("start", START_WAIT);
        case
    }

    /// This host's role: host b serves, host a is the client.
    pub fn role(&self) -> Role {
        if self.me == "b" {
            Role::Server
        } else {
            Role::Client
        }
    }

    /// The server's address (host b's `RDMA_IP`), as both hosts see it.
    pub fn server_ip(&self) -> String {
        match self.role() {
            Role::Server => env("RDMA_IP"),
            Role::Client => env("PEER_IP"),
        }
    }

    /// The case's directory in the shared directory (for files both hosts read).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Publishes `key` with `value` for the peer (written whole, then renamed).
    pub fn publish(&self, key: &str, value: &str) {
        let path = self.dir.join(format!("{}.{key}", self.me));
        let tmp = self.dir.join(format!(".{}.{key}.tmp", self.me));
        std::fs::write(&tmp, value)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .unwrap_or_else(|e| panic!("publishing {}: {e}", path.display()));
    }

    /// Whether the peer has published `key`.
    pub fn peer_has(&self, key: &str) -> bool {
        self.dir.join(format!("{}.{key}", self.peer)).exists()
    }

    /// Why the peer can no longer publish anything in this case, if it cannot.
    pub fn peer_gone(&self) -> Option<String> {
        let peer = &self.peer;
        if let Ok(end) = std::fs::read_to_string(self.dir.join(format!("{peer}.end"))) {
            return Some(format!("host {peer} left the case ({end})"));
        }
        let done = self.shared.join(format!("done-{}-{peer}", self.binary));
        if done.exists() {
            return Some(format!("host {peer}'s {} has ended", self.binary));
        }
        if self.shared.join(format!("{peer}.exited")).exists() {
            return Some(format!("host {peer}'s script has ended"));
        }
        if self.shared.join(format!("{peer}.killed")).exists() {
            return Some(format!("host {peer} was killed"));
        }
        None
    }

    /// Has the peer's guest killed outright (its QEMU ended by `cargo xtask`,
    /// which serves `kill-<host>` requests in the shared directory) and waits up
    /// to 10 s until xtask reports it done; returns when it is.
    pub fn kill_peer(&self) {
        let request = self.shared.join(format!("kill-{}", self.peer));
        std::fs::write(&request, "")
            .unwrap_or_else(|e| panic!("writing {}: {e}", request.display()));
        let killed = self.shared.join(format!("{}.killed", self.peer));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !killed.exists() {
            assert!(
                Instant::now() < deadline,
                "xtask did not kill host {} within 10 s",
                self.peer
            );
            std::thread::sleep(POLL);
        }
    }

    /// Waits up to `timeout` for the peer's `key` and returns its value; panics
    /// if it does not come (see the module's documentation).
    pub fn wait_for(&self, key: &str, timeout: Duration) -> String {
        let path = self.dir.join(format!("{}.{key}", self.peer));
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(value) = std::fs::read_to_string(&path) {
                return value;
            }
            if let Some(why) = self.peer_gone() {
                // It may have published just before it went.
                if let Ok(value) = std::fs::read_to_string(&path) {
                    return value;
                }
                panic!("waiting for host {}'s `{key}`: {why}", self.peer);
            }
            if Instant::now() > deadline {
                panic!(
                    "host {} did not publish `{key}` within {timeout:?}",
                    self.peer
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let result = if std::thread::panicking() {
            let msg = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
            let msg = msg.unwrap_or_default();
            // The first line says what failed; the rest (program output) is in the log.
            format!("FAILED: {}", msg.lines().next().unwrap_or(""))
        } else {
            "ok".to_string()
        };
        let path = self.dir.join(format!("{}.end", self.me));
        let _ = std::fs::write(path, result);
        let deadline = Instant::now() + END_WAIT;
        while self.peer_gone().is_none() && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
    }
}

/// Polls `cond` every 20 ms for up to `limit`; returns how long it took until it
/// held, or `None` if it never did.
pub fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_names_lose_the_hash() {
        assert_eq!(strip_hash("twohost_cm-0123abcdef"), "twohost_cm");
        assert_eq!(strip_hash("twohost_cm"), "twohost_cm");
        assert_eq!(strip_hash("kiara-echo-x"), "kiara-echo-x");
    }
}
