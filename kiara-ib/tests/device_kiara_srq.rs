//! A server whose sessions share one receive queue (`Config::shared_receive_slots`),
//! in the Soft-RoCE guest (`cargo xtask test`).
//!
//! The queue is made far smaller than the credits its clients hold (8 slots; six
//! clients of 32 credits each keeping 16 messages in flight), so that the device
//! must make senders retry (RNR) again and again. What must hold:
//! - every message of every size comes back intact and in order, whether it went
//!   eager (up to the shrunken threshold the server announces) or by RDMA READ;
//! - every slot comes back to the queue: after the clients leave, and after
//!   clients that go with messages in flight;
//! - clients (sessions `connect` opens) have no shared queue;
//! - the receives, which all complete on one CQ of the queue's, reach their own
//!   session: served by a callback or by a thread waiting in `recv`, and when
//!   every request finds its session cold (the poller routes it);
//! - a slot the device refuses to take back is kept and posted again, and the
//!   session whose message it held goes on.

#[path = "support/mod.rs"]
mod support;

use kiara_ib::message::checksum;
use kiara_ib::{Config, Linger, Message, Transport};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::server_ip;

/// Slots of the server's shared receive queue.
const SLOTS: u32 = 8;
/// Messages each client keeps in flight.
const WINDOW: usize = 16;
/// Sizes the clients cycle through: eager below and at the shared slots' threshold
/// (1,023 - 104 = 919 bytes at rxe's 1,024-byte MTU), read messages above it.
const SIZES: [usize; 8] = [1, 64, 500, 900, 919, 920, 4096, 65536];

/// An echo server on a shared receive queue of [`SLOTS`] slots.
fn echo_server() -> (Transport, SocketAddr) {
    echo_server_logging(Arc::new(|line: &str| eprintln!("kiara-ib: {line}")))
}

/// [`echo_server`], its log lines sent to `log`.
fn echo_server_logging(log: Arc<dyn Fn(&str) + Send + Sync>) -> (Transport, SocketAddr) {
    let config = Config {
        shared_receive_slots: SLOTS,
        ..Config::default()
    };
    let server = Transport::with_logger(config, log);
    server
        .register_callback(|msg, session, t| {
            // The session may be closing (a client died): nothing to echo to then.
            let _ = t.send(session, msg, Linger::NoWait);
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    (server, addr)
}

/// Message `i` of client `c`: its size cycles through [`SIZES`], its bytes and
/// metadata are its own.
fn message(c: usize, i: usize) -> (Vec<u8>, [u8; 16]) {
    let len = SIZES[i % SIZES.len()];
    let bytes = (0..len).map(|k| (k * 31 + c * 7 + i) as u8).collect();
    let mut meta = [0u8; 16];
    meta[..8].copy_from_slice(&(c as u64).to_be_bytes());
    meta[8..].copy_from_slice(&(i as u64).to_be_bytes());
    (bytes, meta)
}

/// Client `c` sends `n` messages with [`WINDOW`] in flight and checks every echo.
fn client(addr: SocketAddr, c: usize, n: usize) {
    let t = Transport::new(Config::default());
    let s = t.connect(addr).unwrap();
    let mut expected = VecDeque::new();
    let mut sent = 0;
    while sent < n || !expected.is_empty() {
        while sent < n && expected.len() < WINDOW {
            let (bytes, meta) = message(c, sent);
            expected.push_back((checksum(&bytes), bytes.len(), meta));
            let msg = Message::new(bytes).with_meta(&meta).unwrap();
            t.send(&s, msg, Linger::NoWait).unwrap();
            sent += 1;
        }
        let echo = t
            .recv(&s, Linger::Timeout(Duration::from_secs(60)))
            .unwrap()
            .unwrap_or_else(|| panic!("client {c}: no echo within 60 s"));
        let (sum, len, meta) = expected.pop_front().unwrap();
        assert_eq!(echo.meta(), meta, "client {c}: echoes out of order");
        assert_eq!(echo.bytes().len(), len, "client {c}: length");
        assert_eq!(checksum(echo.bytes()), sum, "client {c}: bytes changed");
    }
    assert!(t.shared_receives().is_none(), "a client has its own slots");
    t.disconnect(s).unwrap();
}

/// Waits until every slot of `server`'s queue is posted again.
fn all_slots_back(server: &Transport, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let q = server
            .shared_receives()
            .expect("the server has a shared queue");
        assert_eq!(q.slots, SLOTS);
        if q.posted == SLOTS {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {after}: only {} of {SLOTS} slots came back",
            q.posted
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn many_clients_share_a_small_receive_queue_and_every_byte_arrives() {
    let (server, addr) = echo_server();
    let clients: Vec<_> = (0..6)
        .map(|c| std::thread::spawn(move || client(addr, c, 240)))
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    all_slots_back(&server, "six clients of 240 messages");
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn clients_dying_with_messages_in_flight_lose_no_slot() {
    let (server, addr) = echo_server();
    for round in 0..12 {
        let t = Transport::new(Config::default());
        let s = t.connect(addr).unwrap();
        for i in 0..WINDOW {
            let (bytes, meta) = message(round, i);
            let msg = Message::new(bytes).with_meta(&meta).unwrap();
            t.send(&s, msg, Linger::NoWait).unwrap();
        }
        // Gone without a goodbye, sometimes at once, sometimes after some echoes.
        if round % 2 == 1 {
            let _ = t.recv(&s, Linger::Timeout(Duration::from_secs(10)));
        }
        drop(s);
        drop(t);
    }
    all_slots_back(&server, "twelve clients that died");
    // And the queue still serves.
    client(addr, 99, 64);
    all_slots_back(&server, "a client after them");
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_server_thread_waiting_in_recv_gets_its_sessions_messages() {
    // No callback: each accepted session is served by a thread blocked in `recv`,
    // which reaps the shared CQ for every session while it spins, and sleeps
    // while the poller does.
    let server = Transport::new(Config {
        shared_receive_slots: SLOTS,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let clients: Vec<_> = (0..4)
        .map(|c| std::thread::spawn(move || client(addr, c, 160)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.sessions().len() < 4 {
        assert!(
            Instant::now() < deadline,
            "4 clients did not connect in 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let servers: Vec<_> = server
        .sessions()
        .into_iter()
        .map(|s| {
            let t = server.clone();
            std::thread::spawn(move || {
                for i in 0..160 {
                    let msg = t
                        .recv(&s, Linger::Timeout(Duration::from_secs(60)))
                        .unwrap()
                        .unwrap_or_else(|| panic!("server: message {i} did not come"));
                    t.send(&s, msg, Linger::NoWait).unwrap();
                }
            })
        })
        .collect();
    for t in servers.into_iter().chain(clients) {
        t.join().unwrap();
    }
    all_slots_back(&server, "four clients served by waiting threads");
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn cold_sessions_on_the_shared_queue_each_get_their_own_messages() {
    // Forty sessions, each asked once in turn, with pauses that let the server's
    // runners go to sleep: every request finds its session cold, and the poller
    // wakes on the shared CQ and routes the receive to the right session.
    let (server, addr) = echo_server();
    let t = Transport::new(Config::default());
    let sessions: Vec<_> = (0..40).map(|_| t.connect(addr).unwrap()).collect();
    for round in 0..3 {
        for (c, s) in sessions.iter().enumerate() {
            let (bytes, meta) = message(c, round * 7 + c);
            let sum = checksum(&bytes);
            let msg = Message::new(bytes).with_meta(&meta).unwrap();
            t.send(s, msg, Linger::NoWait).unwrap();
            let echo = t
                .recv(s, Linger::Timeout(Duration::from_secs(30)))
                .unwrap()
                .unwrap_or_else(|| panic!("session {c}, round {round}: no echo in 30 s"));
            assert_eq!(echo.meta(), meta, "session {c}: another session's message");
            assert_eq!(checksum(echo.bytes()), sum, "session {c}: bytes changed");
            if c % 8 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    for s in sessions {
        t.disconnect(s).unwrap();
    }
    all_slots_back(&server, "forty cold sessions");
    server.unbind().unwrap();
}

/// Eager messages of a pool buffer's size on the shared queue: their bytes are
/// copied out under the queue's lock, where only a cached buffer is taken (a
/// registration there would hold up every session on the queue); the first
/// misses, and a buffer of its class is registered after the lock, so the rest
/// reuse it. Over 120 messages the server registers at most a couple of
/// buffers, not one a message, and every message arrives intact.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn eager_messages_on_the_shared_queue_reuse_the_pools_buffers() {
    let server = Transport::new(Config {
        shared_receive_slots: SLOTS,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let t = Transport::new(Config::default());
    let s = t.connect(addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.sessions().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the client did not connect in 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let session = server.sessions().remove(0);
    let before = server.registrations();
    for i in 0..120 {
        let (bytes, meta) = message(0, i * SIZES.len() + 2);
        assert_eq!(bytes.len(), 500, "an eager size over a small message's");
        let sum = checksum(&bytes);
        let msg = Message::new(bytes).with_meta(&meta).unwrap();
        t.send(&s, msg, Linger::NoWait).unwrap();
        let got = server
            .recv(&session, Linger::Timeout(Duration::from_secs(60)))
            .unwrap()
            .unwrap_or_else(|| panic!("message {i} did not come"));
        assert_eq!((got.meta(), checksum(got.bytes())), (&meta[..], sum));
    }
    let registered = server.registrations() - before;
    assert!(
        (1..=2).contains(&registered),
        "{registered} registrations for 120 eager messages"
    );
    assert!(
        server.pooled_buffers() >= 1,
        "no buffer came back to the pool"
    );
    t.disconnect(s).unwrap();
    all_slots_back(&server, "120 eager messages");
    server.unbind().unwrap();
}

/// (Only with the crate's `fault-injection` feature, which its dev-dependency on
/// itself turns on for these tests: the published crate's tests build without it.
/// Where it is off, `the_fault_tests_are_built` fails in its place.)
#[cfg(feature = "fault-injection")]
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_slot_the_device_refuses_back_is_kept_and_the_session_goes_on() {
    // Reposts the device refuses (`kiara_ib::faults`: no device refuses a good
    // request on demand, so these go to `ibv_post_srq_recv` with a scatter entry
    // too many; everything else is the device's): more of them than the queue has slots, so that for a while every
    // slot is refused and no receive comes to post them again (the poller's sweep
    // does). Meanwhile senders retry on RNR: no message is lost, no slot, and not
    // the session whose message it was, which did nothing wrong.
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let (server, addr) = echo_server_logging(Arc::new(move |l: &str| {
        sink.lock().push(l.into());
    }));
    let _armed = kiara_ib::faults::refuse_shared_posts(SLOTS + 3);
    client(addr, 0, 240);
    all_slots_back(&server, "every slot refused back");
    let q = server.shared_receives().unwrap();
    assert_eq!((q.refused, q.posted), (0, SLOTS), "{q:?}");
    let lines = lines.lock().clone();
    let refused: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("refused a slot back"))
        .collect();
    assert_eq!(refused.len(), 1, "the first refusal is logged: {lines:?}");
    // The device's own refusal: the verb, and the errno Soft-RoCE gives a request
    // with more scatter entries than the queue takes (EINVAL).
    assert!(
        refused[0].contains("ibv_post_srq_recv") && refused[0].contains("os error 22"),
        "{}",
        refused[0]
    );
    assert!(
        !lines.iter().any(|l| l.contains("internal error")),
        "no session closed for it: {lines:?}"
    );
    server.unbind().unwrap();
}

/// Fails where the fault test above was compiled out.
#[cfg(not(feature = "fault-injection"))]
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn the_fault_tests_are_built() {
    support::fault_tests_missing()
}
