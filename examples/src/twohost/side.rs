//! This host's side of a server/client case: host b starts the server and tells
//! host a when it is ready; host a then runs the client. Both return what their
//! own program left, and each asserts on its own.

use super::{Case, Role};
use crate::cm::child::{self as cm_child, Finished};
use crate::perftest::child::{self as pt_child, Outcome};
use std::time::{Duration, Instant};

/// How long a server may take to be ready for its client.
pub const READY_WAIT: Duration = Duration::from_secs(30);

/// How long a server may still run after its client left the case.
pub const GRACE: Duration = Duration::from_secs(10);

/// How many times a perftest pair runs when a C tool refuses to report
/// (`pt_child::clock_check_failed`), as in the single-guest tests.
const PERFTEST_ATTEMPTS: usize = 3;

impl Case {
    /// Server side: waits until `ready()` holds, then publishes `ready<attempt>`
    /// (empty); if the server exits first or is not ready in [`READY_WAIT`], the
    /// value says so and the client fails at once.
    pub fn server_ready(
        &self,
        attempt: usize,
        ready: impl Fn() -> bool,
        mut exited: impl FnMut() -> bool,
    ) {
        let deadline = Instant::now() + READY_WAIT;
        let why = loop {
            if ready() {
                break "";
            }
            if exited() {
                break "the server exited before it was ready";
            }
            if Instant::now() > deadline {
                break "the server was not ready within 30 s";
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.publish(&format!("ready{attempt}"), why);
    }

    /// Client side: waits for the server's `ready<attempt>`; panics if the server
    /// did not get ready.
    pub fn await_server(&self, attempt: usize) {
        let why = self.wait_for(&format!("ready{attempt}"), READY_WAIT * 2);
        assert!(why.is_empty(), "host b's server: {why}");
    }

    /// Server side: waits until `exited()`, `timeout`, or [`GRACE`] after the
    /// client left the case, whichever comes first.
    pub fn wait_server(&self, timeout: Duration, mut exited: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        let mut grace_end = None;
        while !exited() && Instant::now() < deadline {
            if grace_end.is_none() && self.peer_gone().is_some() {
                grace_end = Some(Instant::now() + GRACE);
            }
            if grace_end.is_some_and(|t| Instant::now() > t) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Publishes `mine` under `key`, waits for the peer's, and returns whether
    /// either side said yes.
    pub fn either(&self, key: &str, mine: bool) -> bool {
        self.publish(key, if mine { "1" } else { "0" });
        let theirs = self.wait_for(key, Duration::from_secs(120));
        mine || theirs == "1"
    }
}

/// Runs this host's side of a pair of perftest-style programs (`ready()` tells
/// when the server on host b accepts its client), each with its own command line;
/// runs the pair again, up to three times in all, while either C tool refuses to
/// report. Returns this host's outcome.
pub fn perftest(
    case: &Case,
    server: (&str, &[String]),
    client: (&str, &[String]),
    ready: impl Fn() -> bool,
    timeout: Duration,
) -> Outcome {
    for attempt in 1.. {
        let out = match case.role() {
            Role::Server => {
                let mut srv = pt_child::spawn(server.0, server.1)
                    .unwrap_or_else(|e| panic!("cannot start {}: {e}", server.0));
                case.server_ready(attempt, &ready, || !srv.running());
                case.wait_server(timeout, || !srv.running());
                srv.wait(Duration::from_secs(1))
            }
            Role::Client => {
                case.await_server(attempt);
                pt_child::spawn(client.0, client.1)
                    .unwrap_or_else(|e| panic!("cannot start {}: {e}", client.0))
                    .wait(timeout)
            }
        };
        let refused = pt_child::clock_check_failed(&out);
        if attempt == PERFTEST_ATTEMPTS || !case.either(&format!("refused{attempt}"), refused) {
            return out;
        }
        eprintln!("perftest refused to report (its clock check failed): running the pair again");
    }
    unreachable!("the loop returns")
}

/// Server side of an RDMA CM or TCP case: starts `program args`, publishes
/// `ready1` once `ready()` holds, and waits for the server to end (at most
/// `timeout`, or [`GRACE`] after the client left); a server still running then
/// is killed. Returns what it left.
pub fn server(
    case: &Case,
    program: &str,
    args: &[&str],
    ready: impl Fn() -> bool,
    timeout: Duration,
) -> Finished {
    let mut srv = cm_child::spawn(program, args);
    case.server_ready(1, &ready, || srv.exited());
    case.wait_server(timeout, || srv.exited());
    if srv.exited() {
        srv.wait(Duration::from_secs(1))
    } else {
        srv.kill()
    }
}

/// Client side: waits for the server's `ready1`, then runs `program args` (again
/// while the output says nobody listened yet) and returns what it left.
pub fn client(case: &Case, program: &str, args: &[&str], timeout: Duration) -> Finished {
    case.await_server(1);
    cm_child::run_client(program, args, timeout, Duration::from_secs(20))
}
