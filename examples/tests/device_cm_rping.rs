//! Interop of the Rust `rping` with rdmacm-utils' C `rping` in the Soft-RoCE guest:
//! Rust server with C client, C server with Rust client (the data both sides print
//! must be equal), Rust with Rust with validation, and several concurrent Rust
//! clients against the threaded Rust server (`-P`).
//!
//! Run by `cargo xtask test`; they fail without a device.

use examples::cm::child::{port, run_client, spawn, Finished};
use std::time::Duration;

const RUST: &str = env!("CARGO_BIN_EXE_rping");
const C: &str = "rping";
const T: Duration = Duration::from_secs(60);
const STARTUP: Duration = Duration::from_secs(20);

fn ip() -> String {
    std::env::var("RDMA_IP").expect(
        "RDMA_IP is not set: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    )
}

/// The ping lines `rping -v` prints: `rdma-ping-N: <rotating text>`.
fn expected(count: usize, size: usize) -> Vec<String> {
    let mut start = 65u8;
    (0..count)
        .map(|n| {
            let mut s = format!("rdma-ping-{n}: ").into_bytes();
            let mut c = start;
            while s.len() < size - 1 {
                s.push(c);
                c = if c >= 122 { 65 } else { c + 1 };
            }
            start = if start >= 122 { 65 } else { start + 1 };
            String::from_utf8(s).unwrap()
        })
        .collect()
}

fn no_panic(out: &Finished) {
    assert!(!out.stderr.contains("panicked"), "{out}");
}

fn pair(server_prog: &str, client_prog: &str, slot: u16, count: usize, size: usize) {
    let ip = ip();
    let p = port(7000, slot).to_string();
    let size_s = size.to_string();
    let count_s = count.to_string();
    let server = spawn(
        server_prog,
        &["-s", "-v", "-a", &ip, "-p", &p, "-S", &size_s],
    );
    let client = run_client(
        client_prog,
        &[
            "-c", "-v", "-V", "-a", &ip, "-p", &p, "-C", &count_s, "-S", &size_s,
        ],
        T,
        STARTUP,
    );
    let server = server.wait(T);
    assert!(
        client.success(),
        "client failed:\n{client}\nserver:\n{server}"
    );
    no_panic(&client);
    no_panic(&server);
    let want = expected(count, size);
    assert_eq!(client.lines_after("ping data: "), want, "client:\n{client}");
    assert_eq!(
        server.lines_after("server ping data: "),
        want,
        "server:\n{server}"
    );
    assert!(
        server.status.is_some(),
        "server did not end after the client left:\n{server}"
    );
    // It printed every ping; it must also have ended cleanly (C's rping exits 0).
    assert!(server.success(), "server failed:\n{server}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_server_c_client() {
    pair(RUST, C, 1, 5, 64);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn c_server_rust_client() {
    pair(C, RUST, 2, 5, 64);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_server_rust_client_large_pings() {
    pair(RUST, RUST, 3, 20, 1000);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn persistent_server_serves_concurrent_clients() {
    let ip = ip();
    let p = port(7000, 4).to_string();
    let server = spawn(RUST, &["-s", "-P", "-v", "-a", &ip, "-p", &p]);
    // Make sure it listens before the concurrent clients start.
    let first = run_client(RUST, &["-c", "-a", &ip, "-p", &p, "-C", "1"], T, STARTUP);
    assert!(first.success(), "{first}");
    // A connection that never sends stays open while the others run: a server
    // that served one client at a time would wait on it and serve no other.
    let addr = format!("{ip}:{p}").parse().unwrap();
    let idle = idle_connection(addr).expect("an idle connection");
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (ip, p) = (ip.clone(), p.clone());
            std::thread::spawn(move || {
                spawn(RUST, &["-c", "-v", "-V", "-a", &ip, "-p", &p, "-C", "10"]).wait(T)
            })
        })
        .collect();
    let outs: Vec<Finished> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    drop(idle);
    let disconnected = |s: &examples::cm::child::Running| {
        s.stderr_so_far().matches("server DISCONNECT EVENT").count() == 5
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !disconnected(&server) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let server = server.kill();
    for out in &outs {
        assert!(out.success(), "client failed:\n{out}\nserver:\n{server}");
        assert_eq!(out.lines_after("ping data: "), expected(10, 64), "{out}");
        no_panic(out);
    }
    no_panic(&server);
    let served = server.lines_after("server ping data: ");
    assert_eq!(served.len(), 1 + 3 * 10, "server:\n{server}");
    // Each connection has its own channel and thread: the three clients were
    // served while the idle one held its own, and all five left.
    let disconnects = server.stderr.matches("server DISCONNECT EVENT").count();
    assert_eq!(disconnects, 5, "server:\n{server}");
}

/// A server started well before its client waits for it, as C's `rping -s` does
/// (it gave up after 30 s), and then serves the C client with C's own command line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_server_waits_for_a_client_that_comes_late() {
    let ip = ip();
    let p = port(7000, 5).to_string();
    let mut server = spawn(RUST, &["-s", "-v", "-a", &ip, "-p", &p]);
    std::thread::sleep(Duration::from_secs(35));
    assert!(!server.exited(), "the server gave up:\n{}", server.wait(T));
    let client = run_client(
        C,
        &["-c", "-v", "-V", "-a", &ip, "-p", &p, "-C", "3"],
        T,
        STARTUP,
    );
    let server = server.wait(T);
    assert!(
        client.success(),
        "client failed:\n{client}\nserver:\n{server}"
    );
    assert!(server.success(), "server failed:\n{server}");
    no_panic(&server);
    assert_eq!(
        client.lines_after("ping data: "),
        expected(3, 64),
        "{client}"
    );
    assert_eq!(
        server.lines_after("server ping data: "),
        expected(3, 64),
        "{server}"
    );
}

/// An idle connection (its queue pair, nothing sent).
type Idle = (
    rdma_safe::QueuePair<rdma_safe::qp::Init>,
    examples::cm::Conn,
);

/// An idle connection to `addr`, or why not.
fn idle_connection(addr: std::net::SocketAddr) -> Result<Idle, String> {
    use rdma_safe::cm::{CmId, ConnParam, EventChannel, PortSpace};
    let events = EventChannel::new().map_err(|e| e.to_string())?;
    let id = CmId::new(&events, PortSpace::Tcp).map_err(|e| e.to_string())?;
    id.resolve(None, addr, Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    let conn = examples::cm::Conn::new(id, events, 4).map_err(|e| e.to_string())?;
    let qp = conn.create_qp(2, 2).map_err(|e| e.to_string())?;
    conn.id
        .connect(&ConnParam::default())
        .map_err(|e| e.to_string())?;
    let established = conn.wait_established(Duration::from_secs(10), "rdma_connect");
    established.map(|_| (qp, conn)).map_err(|e| e.to_string())
}

/// A client that opens connections and leaves them idle makes a `-P` server run
/// out of file descriptors (a low limit here). The requests that cannot be
/// served are refused one by one, and once the idle connections go the server
/// serves a real client: it never exits.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_persistent_server_outlives_a_client_that_hoards_connections() {
    let ip = ip();
    let p = port(7000, 6).to_string();
    let limited = format!("ulimit -n 40 && exec {RUST} -s -P -a {ip} -p {p}");
    let mut server = spawn("sh", &["-c", &limited]);
    let first = run_client(RUST, &["-c", "-a", &ip, "-p", &p, "-C", "1"], T, STARTUP);
    assert!(first.success(), "{first}");
    let addr = format!("{ip}:{p}").parse().unwrap();
    let (mut held, mut refused) = (Vec::new(), 0);
    for _ in 0..30 {
        match idle_connection(addr) {
            Ok(c) => held.push(c),
            Err(_) => refused += 1,
        }
    }
    // Refused before its thread (no event channel), or failed on it (no
    // completion channel): which comes first depends on the descriptors left.
    let said = |server: &examples::cm::child::Running| {
        let err = server.stderr_so_far();
        err.contains("rping: a connection request refused")
            || err.contains("rping: connection failed")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !said(&server) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        refused > 0 && said(&server),
        "{} held, {refused} refused; server:\n{}",
        held.len(),
        server.stderr_so_far()
    );
    drop(held);
    // Once the server has let the idle clients' resources go, a real client is
    // served (tried again while it is still refused).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let client = loop {
        let c = run_client(
            RUST,
            &["-c", "-v", "-a", &ip, "-p", &p, "-C", "3"],
            T,
            STARTUP,
        );
        if c.success() || std::time::Instant::now() >= deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        client.success(),
        "{client}\nserver:\n{}",
        server.stderr_so_far()
    );
    assert_eq!(client.lines_after("ping data: ").len(), 3, "{client}");
    assert!(!server.exited(), "the server is gone");
    let server = server.kill();
    no_panic(&server);
}

/// Command lines C's rping refuses, refused as it does: an option its getopt
/// does not know (`-h`; `-t`, in its option string but never handled) or neither
/// `-s` nor `-c` print the usage on stdout; a size or count out of range C's
/// message on stderr; all with status 22 (EINVAL).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn refused_command_lines_end_as_c_does() {
    let run = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8 output");
        (out.status.code(), text(out.stdout), text(out.stderr))
    };
    let cases: [&[&str]; 6] = [
        &["-s", "-t", "5"],
        &["-h"],
        &["-v"],
        &["-s", "-S", "5"],
        &["-c", "-C", "-1"],
        &["-c", "-S", "70000", "-C", "-2"],
    ];
    for args in cases {
        let c = run(C, args);
        let rust = run(RUST, args);
        assert_eq!(c.0, Some(22), "C rping {args:?}: {c:?}");
        assert_eq!(rust, c, "rping {args:?}: Rust and C differ");
    }
}
