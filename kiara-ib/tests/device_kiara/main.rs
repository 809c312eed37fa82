//! Device tests of the KIARA transport, run in the Soft-RoCE guest by
//! `cargo xtask test`: no message lost, duplicated, reordered or corrupted across 16
//! clients and sizes from 0 to 8 MiB; 64 sessions at once; hostile and dying peers.
//!
//! Where they are: the shared servers and the dying-peer test here (its child
//! processes run it again by its name, so it stays at the top); the others in
//! `delivery`, `hostile` and `callbacks`.

#[path = "../support/mod.rs"]
mod support;

mod callbacks;
mod delivery;
mod hostile;

use kiara_ib::message::checksum;
use kiara_ib::protocol::{Control, Hello, Kind, CONTROL_HEADER_LEN, HELLO_HEADER_LEN};
use kiara_ib::{CloseReason, Config, Error, Linger, Message, Session, Transport};
use parking_lot::Mutex;
use rdma_safe::{
    Access, CompletionQueue, MemoryRegion, QueuePair, RtrAttr, RtsAttr, SendWr, WorkCompletion,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{held_in_summaries, server_ip, some_hello, Device, SESSION_SUMMARY_END};

const MIB: usize = 1 << 20;

/// A server whose log lines are kept for the test to read, every one of them
/// (`Config::log_lines_per_second`).
fn logged_server(config: Config) -> (Transport, Arc<Mutex<Vec<String>>>) {
    let config = Config {
        log_lines_per_second: 0,
        ..config
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let t = Transport::with_logger(config, Arc::new(move |l: &str| sink.lock().push(l.into())));
    (t, log)
}

/// Waits until a log line contains `needle`.
fn wait_log(log: &Mutex<Vec<String>>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(l) = log.lock().iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {needle:?}: {:?}",
            log.lock()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sizes log-uniform in 0..=8 MiB, with 0 and exact powers of two mixed in.
/// Receiver-not-ready NAKs the devices counted so far (sent and received): credits
/// exist so that this never grows.
fn rnr_naks() -> u64 {
    let mut total = 0;
    let mut seen = false;
    for dev in std::fs::read_dir("/sys/class/infiniband").expect("RDMA devices in sysfs") {
        let counters = dev.unwrap().path().join("ports/1/hw_counters");
        for name in ["send_rnr_err", "rcvd_rnr_err"] {
            if let Ok(v) = std::fs::read_to_string(counters.join(name)) {
                total += v.trim().parse::<u64>().expect("a counter");
                seen = true;
            }
        }
    }
    assert!(seen, "no device reports RNR counters in sysfs");
    total
}

fn sizes(seed: u64, n: usize) -> Vec<usize> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let ln_max = ((8 * MIB + 1) as f64).ln();
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match i % 10 {
                0 => 0,
                1 => 1 << (x % 24),
                _ => {
                    let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                    ((u * ln_max).exp() as usize).saturating_sub(1).min(8 * MIB)
                }
            }
        })
        .collect()
}

/// A server whose callback answers each message with (sequence, checksum) as
/// metadata and checks per session that sequences arrive in order, once each.
fn checksum_server(config: Config) -> (Transport, SocketAddr, Arc<AtomicUsize>) {
    let server = Transport::new(config);
    let seen = Arc::new(Mutex::new(std::collections::HashMap::<u64, u64>::new()));
    let delivered = Arc::new(AtomicUsize::new(0));
    let count = delivered.clone();
    server
        .register_callback(move |msg, session, transport| {
            let seq = u64::from_be_bytes(msg.meta()[..8].try_into().expect("sequence"));
            let mut seen = seen.lock();
            let next = seen.entry(session.id()).or_insert(0);
            assert_eq!(
                seq,
                *next,
                "session {}: out of order or duplicated",
                session.id()
            );
            *next += 1;
            drop(seen);
            count.fetch_add(1, Ordering::SeqCst);
            let mut meta = [0u8; 16];
            meta[..8].copy_from_slice(&seq.to_be_bytes());
            meta[8..].copy_from_slice(&checksum(msg.bytes()).to_be_bytes());
            let reply = Message::new(Vec::new()).with_meta(&meta).expect("16 bytes");
            transport
                .send(session, reply, Linger::NoWait)
                .expect("reply queued");
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    (server, addr, delivered)
}

/// Set in the child process of the dying-peer tests: what the child does.
const CHILD: &str = "KIARA_TEST_CHILD";

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_dying_peer_fails_pending_sends_and_nothing_partial_is_delivered() {
    if act_as_dying_peer_child() {
        return;
    }
    a_dead_sender_delivers_nothing();
    let client = a_killed_receiver_fails_the_pending_send();
    queued_sends_fail_when_the_hoarder_dies(&client);
}

/// In a child process of the dying-peer test, does what [`CHILD`] says and returns
/// true (or dies); in the test itself, returns false.
fn act_as_dying_peer_child() -> bool {
    match std::env::var(CHILD).as_deref() {
        Ok("sender") => {
            // Connect, announce 8 MiB, and die before the server can have read it.
            let addr: SocketAddr = std::env::var("KIARA_TEST_ADDR").unwrap().parse().unwrap();
            let t = Transport::new(Config::default());
            let s = t.connect(addr).unwrap();
            t.send(&s, vec![1u8; 8 * MIB], Linger::NoWait).unwrap();
            std::process::abort();
        }
        Ok(role @ ("sink" | "hoard")) => {
            // A server that never answers; the parent kills it. The hoarder does not
            // even take its messages, so it returns no credits.
            let t = Transport::new(Config::default());
            if role == "sink" {
                t.register_callback(|_, _, _| {}).unwrap();
            }
            let addr = t.bind((server_ip().as_str(), 0)).unwrap();
            println!("{addr}");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs(60));
            true
        }
        _ => false,
    }
}

/// Starts this test binary again as the dying-peer test's child `role`, its stdout
/// piped.
fn dying_peer_child(role: &str, addr: Option<SocketAddr>) -> std::process::Child {
    let exe = std::env::current_exe().unwrap();
    let test = "a_dying_peer_fails_pending_sends_and_nothing_partial_is_delivered";
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(["--exact", test, "--include-ignored", "--nocapture", "-q"])
        .env(CHILD, role)
        .stdout(std::process::Stdio::piped());
    if let Some(a) = addr {
        cmd.env("KIARA_TEST_ADDR", a.to_string());
    }
    cmd.spawn().unwrap()
}

/// The address a child prints on a line of its own (libtest prints around it).
fn child_address(c: &mut std::process::Child) -> SocketAddr {
    let out = std::io::BufReader::new(c.stdout.take().unwrap());
    std::io::BufRead::lines(out)
        .map_while(Result::ok)
        .find_map(|l| l.trim().parse().ok())
        .expect("the child's address")
}

/// 1. The sender dies mid-transfer: the server never delivers the partial message,
///    logs why, releases the session and serves on.
fn a_dead_sender_delivers_nothing() {
    let (server, log) = logged_server(Config::default());
    let delivered = Arc::new(AtomicUsize::new(0));
    let d = delivered.clone();
    server
        .register_callback(move |_, _, _| {
            d.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let status = dying_peer_child("sender", Some(addr)).wait().unwrap();
    assert!(!status.success(), "the sender must have died");
    wait_log(&log, "closed");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server.sessions().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the dead session was not released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        delivered.load(Ordering::SeqCst),
        0,
        "a partial message was delivered"
    );
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    client.send(&s, vec![3u8; 100_000], Linger::Block).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while delivered.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the server stopped serving");
        std::thread::sleep(Duration::from_millis(10));
    }
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}

/// 2. The receiver is killed while our 8 MiB send is pending: the send fails with an
///    error within the configured timeout, and so does recv. Returns the client.
fn a_killed_receiver_fails_the_pending_send() -> Transport {
    let mut sink = dying_peer_child("sink", None);
    let sink_addr = child_address(&mut sink);
    let config = Config {
        timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let client = Transport::new(config);
    let s = client.connect(sink_addr).unwrap();
    let handle = client.send(&s, vec![5u8; 8 * MIB], Linger::NoWait).unwrap();
    sink.kill().unwrap();
    let _ = sink.wait();
    match handle.wait(Some(Duration::from_secs(5))) {
        Err(Error::Closed(reason)) => assert!(
            matches!(reason, CloseReason::PeerGone(_) | CloseReason::Rdma(_)),
            "{reason}"
        ),
        other => panic!("the pending send must fail once the peer died: {other:?}"),
    }
    assert!(matches!(
        client.recv(&s, Linger::NoWait),
        Err(Error::Closed(_))
    ));
    assert!(s.closed().is_some());

    client
}

/// 3. Small (eager) messages: those the peer got succeed; those still waiting for
///    credits when it is killed fail, with the reason.
fn queued_sends_fail_when_the_hoarder_dies(client: &Transport) {
    let mut hoard = dying_peer_child("hoard", None);
    let hoard_addr = child_address(&mut hoard);
    let s = client.connect(hoard_addr).unwrap();
    let credits = Config::default().credits as usize;
    let handles: Vec<_> = (0..credits + 8)
        .map(|i| client.send(&s, vec![i as u8; 100], Linger::NoWait).unwrap())
        .collect();
    handles[0].wait(Some(Duration::from_secs(5))).unwrap();
    assert!(
        !handles[credits + 7].is_done(),
        "a message beyond the credits went out"
    );
    hoard.kill().unwrap();
    let _ = hoard.wait();
    match handles[credits + 7].wait(Some(Duration::from_secs(10))) {
        Err(Error::Closed(reason)) => assert!(
            matches!(reason, CloseReason::PeerGone(_) | CloseReason::Rdma(_)),
            "{reason}"
        ),
        other => panic!("a queued send must fail once the peer died: {other:?}"),
    }
    assert!(handles[0].is_done());
    handles[0].wait(Some(Duration::ZERO)).unwrap();
}

/// A callback's echo: the message's bytes and metadata back, without waiting.
fn echo(msg: Message, session: &Session, transport: &Transport) {
    let reply = Message::new(msg.bytes().to_vec())
        .with_meta(msg.meta())
        .unwrap();
    transport.send(session, reply, Linger::NoWait).unwrap();
}

fn client_recv(client: &Transport, session: &Session) -> Message {
    client
        .recv(session, Linger::Timeout(Duration::from_secs(120)))
        .expect("recv")
        .expect("a reply within 120 s")
}
