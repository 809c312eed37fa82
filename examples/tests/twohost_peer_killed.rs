//! Two hosts, and then one: host b's guest is killed outright (its QEMU ended)
//! in the middle of traffic, and host a must cope. `cargo xtask test` runs this
//! binary last, since host b is gone after it (`docs/faults.md`).
//!
//! Here host a serves KIARA: `kiara-echo-server` on a, two clients on b and one
//! on a itself, all echoing; meanwhile a sends a large stream to
//! `rdma-file-transfer` on b. Once everything runs, a has b killed. Then on a:
//! the file-transfer client fails within a bounded time with an error naming
//! the cause; the KIARA server goes on serving: the local client finishes with
//! every echo verified, and a new client afterwards is served too; and the
//! server closes both of b's sessions within [`DETECT`], naming the cause: a
//! killed host sends nothing (no FIN, no DREQ), and a session with no call
//! pending has nothing RC could fail, so kiara-ib finds it by TCP keepalive on
//! the session's bootstrap connection (`Config::peer_timeout`, 30 s by default).
//!
//! Run by `cargo xtask test` on its two guests (`docs/two-hosts.md`); it fails
//! anywhere else.

use examples::cm::child::{run_client, spawn, Finished, Running};
use examples::perftest::child::{cm_listening, listening};
use examples::twohost::{within, Case, Role};
use std::time::{Duration, Instant};

const FT: &str = env!("CARGO_BIN_EXE_rdma-file-transfer");
const KIARA_SERVER: &str = env!("CARGO_BIN_EXE_kiara-echo-server");
const KIARA_CLIENT: &str = env!("CARGO_BIN_EXE_kiara-echo-client");
const T: Duration = Duration::from_secs(120);
const FT_PORT: u16 = 19901;
const KIARA_PORT: u16 = 19902;

/// The file-transfer client's limit on any single wait (`--timeout`): with RC's
/// retry count 7, rxe retransmits forever, so this is how it learns the peer is gone.
const FT_WAIT: &str = "20";

/// How long the file-transfer client may take to fail after the kill: its
/// `--timeout` and room to spare.
const DETECT: Duration = Duration::from_secs(60);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run `cargo xtask test`"))
}

/// Host b: the file-transfer server and two KIARA clients of a's server, until killed.
fn host_b(case: &Case) {
    let p = FT_PORT.to_string();
    let _server = spawn(FT, &["server", "-p", &p, "--discard", "--timeout", "300"]);
    assert!(
        within(T, || cm_listening(FT_PORT)).is_some(),
        "the file-transfer server does not listen"
    );
    case.publish("ft-ready", "");
    case.wait_for("kiara-ready", T);
    let (ip, kp) = (env("PEER_IP"), KIARA_PORT.to_string());
    let args = [
        ip.as_str(),
        "-p",
        &kp,
        "-c",
        "2",
        "-n",
        "100000",
        "-s",
        "4096",
    ];
    let clients = spawn(KIARA_CLIENT, &args);
    // Published once both sessions' queue pairs are ready to send: host a kills
    // this guest soon after, and a session still in its handshake on this busy
    // guest would not be there to close.
    let pid = clients.id();
    let up = within(T, || rts_queue_pairs_of(pid) >= 2);
    assert!(up.is_some(), "the KIARA client's sessions never came up");
    case.publish("clients-started", "");
    // Host a has this guest killed now; getting past this wait is a failure.
    std::thread::sleep(T);
    panic!("host b was not killed within {T:?}");
}

/// Whether an RDMA CM id of this host is connected to `port` (`rdma resource
/// show cm_id` lists it with its destination address).
fn cm_connected_to(port: u16) -> bool {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", "cm_id"])
        .output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let dst = format!(":{port}");
    text.unwrap_or_default().lines().any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let connected = w.windows(2).any(|p| p == ["state", "CONNECT"]);
        connected
            && w.windows(2)
                .any(|p| p[0] == "dst-addr" && p[1].ends_with(&dst))
    })
}

/// The RC queue pairs of process `pid` in state RTS (`rdma resource show qp` lists
/// each with its state and owner).
fn rts_queue_pairs_of(pid: u32) -> usize {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", "qp"])
        .output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let owner = pid.to_string();
    text.unwrap_or_default()
        .lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let has = |k: &str, v: &str| w.windows(2).any(|p| p == [k, v]);
            has("type", "RC") && has("state", "RTS") && has("pid", &owner)
        })
        .count()
}

/// The lines of the KIARA server's stderr that close one of b's sessions.
fn closed_sessions_of(stderr: &str, b_ip: &str) -> Vec<String> {
    let from_b = format!("({b_ip}:");
    stderr
        .lines()
        .filter(|l| l.contains(&from_b) && l.contains(" closed: "))
        .map(str::to_string)
        .collect()
}

/// What host a runs while b is killed.
struct Traffic {
    kiara_server: Running,
    local_client: Running,
    ft_client: Running,
}

/// Host a: the KIARA server and its local client, then the stream to b.
fn start_traffic(case: &Case, me: &str, b_ip: &str) -> Traffic {
    let kp = KIARA_PORT.to_string();
    let kiara_server = spawn(KIARA_SERVER, &["-a", me, "-p", &kp]);
    let listens = within(T, || listening(KIARA_PORT));
    assert!(listens.is_some(), "the KIARA server does not listen");
    case.publish("kiara-ready", "");
    let local = [me, "-p", &kp, "-c", "1", "-n", "300", "-s", "4096"];
    let local_client = spawn(KIARA_CLIENT, &local);
    case.wait_for("ft-ready", T);
    let p = FT_PORT.to_string();
    let ft = [
        "client",
        b_ip,
        "--generate",
        "4294967296",
        "--name",
        "big",
        "-p",
        &p,
    ];
    let ft_client = spawn(FT, &[&ft[..], &["--timeout", FT_WAIT]].concat());
    case.wait_for("clients-started", T);
    Traffic {
        kiara_server,
        local_client,
        ft_client,
    }
}

/// Host a: starts everything, has b killed, and checks how a copes.
fn host_a(case: &Case) {
    let (me, b_ip) = (env("RDMA_IP"), env("PEER_IP"));
    let mut t = start_traffic(case, &me, &b_ip);
    // Let the traffic flow: the stream connected (and b's KIARA sessions with it).
    let connected = within(T, || cm_connected_to(FT_PORT));
    assert!(
        connected.is_some(),
        "the file transfer to b never connected"
    );
    std::thread::sleep(Duration::from_secs(2));
    let killed_at = Instant::now();
    case.kill_peer();
    let [ft_end, closed_at] = watch(&mut t.ft_client, &t.kiara_server, &b_ip, killed_at);
    let ft_line = check_ft_client(t.ft_client, ft_end);
    let closed = check_kiara_server(&mut t.kiara_server, &b_ip);
    let local = t.local_client.wait(T);
    assert!(
        local.success(),
        "the local KIARA client, during b's death:\n{local}"
    );
    let verified = "kiara-echo-client: every echo verified\n";
    assert!(local.stdout.ends_with(verified), "{local}");
    let kp = KIARA_PORT.to_string();
    let new = [
        me.as_str(),
        "-p",
        &kp,
        "-c",
        "2",
        "-n",
        "20",
        "-s",
        "64,65536",
    ];
    let after = run_client(KIARA_CLIENT, &new, T, T);
    assert!(
        after.success(),
        "a new KIARA client after b's death:\n{after}"
    );
    assert!(after.stdout.ends_with(verified), "{after}");
    let server = t.kiara_server.kill();
    assert!(!server.stderr.contains("panicked"), "{server}");
    let secs = |d: Duration| d.as_secs_f64();
    let Some(at) = closed_at else {
        panic!(
            "the KIARA server had closed {} of b's 2 sessions {DETECT:?} after the kill:\n{server}",
            closed.len()
        );
    };
    for line in &closed {
        assert!(
            line.contains("did not answer"),
            "a session of b closed for no named cause: {line}"
        );
    }
    let sessions = format!(
        "closed both of b's sessions {:.1} s after the kill ({})",
        secs(at),
        closed[0]
    );
    let ft_secs = secs(ft_end.unwrap_or_default());
    case.publish(
        "measured",
        &format!(
            "rdma-file-transfer client failed {ft_secs:.1} s after the kill: {ft_line}; \
             KIARA server {sessions}; it went on serving: local client 300 echoes verified \
             during the kill, a new client (2 sessions, 64 B and 64 KiB) verified after it"
        ),
    );
}

/// Watches, for up to [`DETECT`] after the kill, for the file-transfer client
/// to end and for the KIARA server to close both of b's sessions; returns when
/// each happened (since the kill).
fn watch(
    ft: &mut Running,
    server: &Running,
    b_ip: &str,
    killed_at: Instant,
) -> [Option<Duration>; 2] {
    let mut seen = [None, None];
    let watching = |seen: &[Option<Duration>; 2]| seen.iter().any(Option::is_none);
    while killed_at.elapsed() < DETECT && watching(&seen) {
        if seen[0].is_none() && ft.exited() {
            seen[0] = Some(killed_at.elapsed());
        }
        if seen[1].is_none() && closed_sessions_of(&server.stderr_so_far(), b_ip).len() >= 2 {
            seen[1] = Some(killed_at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    seen
}

/// The file-transfer client must have failed, naming the cause; returns its error line.
fn check_ft_client(ft: Running, ended: Option<Duration>) -> String {
    let out: Finished = ft.wait(Duration::from_secs(1));
    assert!(
        ended.is_some(),
        "the file-transfer client still ran {DETECT:?} after host b was killed:\n{out}"
    );
    assert!(
        !out.success(),
        "the transfer to a dead host succeeded:\n{out}"
    );
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("rdma-file-transfer"))
        .unwrap_or("");
    let named = ["retry", "Retry", "disconnected", "timed out"]
        .iter()
        .any(|w| line.contains(w));
    assert!(named, "the client's error names no cause:\n{out}");
    line.to_string()
}

/// The KIARA server must still run; returns the lines closing b's sessions so far.
fn check_kiara_server(server: &mut Running, b_ip: &str) -> Vec<String> {
    let stderr = server.stderr_so_far();
    assert!(
        !server.exited(),
        "the KIARA server ended when host b died:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    closed_sessions_of(&stderr, b_ip)
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn peer_killed_mid_traffic() {
    let case = Case::start("peer_killed_mid_traffic");
    match case.role() {
        Role::Server => host_b(&case),
        Role::Client => host_a(&case),
    }
}
