//! Device tests of the KIARA transport, run in the Soft-RoCE guest by
//! `cargo xtask test`: no message lost, duplicated, reordered or corrupted across 16
//! clients and sizes from 0 to 8 MiB; 64 sessions at once; hostile and dying peers.

use kiara_ib::message::checksum;
use kiara_ib::protocol::{Control, Hello, Kind, CONTROL_HEADER_LEN, HELLO_HEADER_LEN};
use kiara_ib::{CloseReason, Config, Error, Linger, Message, Session, Transport};
use parking_lot::Mutex;
use rdma_safe::{
    Access, CompletionQueue, Context, InitAttr, MemoryRegion, ProtectionDomain, QpConfig,
    QueuePair, RtrAttr, RtsAttr, SendWr, WorkCompletion,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn server_ip() -> String {
    std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

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

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn sixteen_clients_lose_duplicate_reorder_and_corrupt_nothing() {
    clients_lose_nothing(16, 100, Config::default());
}

/// The same with a server whose acknowledgements invalidate the clients' windows
/// (SEND_WITH_INV; on Soft-RoCE the default is a plain SEND): the clients take
/// each acknowledgement's invalidation as their window's, and nothing is lost.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn invalidating_acknowledgements_lose_nothing_either() {
    let config = Config {
        invalidating_acks: Some(true),
        ..Config::default()
    };
    clients_lose_nothing(4, 100, config);
}

/// `CLIENTS` clients each send `MESSAGES` messages of every size class to a
/// checksum server built with `server_config`, and check every reply.
fn clients_lose_nothing(clients: usize, messages: usize, server_config: Config) {
    const WINDOW: usize = 8;
    let (server, addr, delivered) = checksum_server(server_config);
    // One pseudo-random source buffer; messages are slices of it at varying offsets.
    let source: Arc<Vec<u8>> = Arc::new(
        (0..9 * MIB as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
    );
    let client = Transport::new(Config::default());
    std::thread::scope(|s| {
        for c in 0..clients {
            let (client, source) = (&client, source.clone());
            s.spawn(move || {
                let session = client.connect(addr).expect("connect");
                let plan = sizes(c as u64 + 1, messages);
                let sums: Vec<u64> = plan
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| checksum(&source[i * 997 % MIB..][..len]))
                    .collect();
                // Replies are read on another thread while sends are pipelined.
                std::thread::scope(|inner| {
                    let receiver = inner.spawn(|| {
                        for (i, want) in sums.iter().enumerate() {
                            let reply = client_recv(client, &session);
                            let seq = u64::from_be_bytes(reply.meta()[..8].try_into().unwrap());
                            let sum = u64::from_be_bytes(reply.meta()[8..16].try_into().unwrap());
                            assert_eq!(seq, i as u64, "client {c}: reply out of order");
                            assert_eq!(sum, *want, "client {c} message {i}: corrupted");
                        }
                    });
                    let mut handles = std::collections::VecDeque::new();
                    for (i, &len) in plan.iter().enumerate() {
                        if handles.len() == WINDOW {
                            let h: kiara_ib::SendHandle = handles.pop_front().unwrap();
                            h.wait(Some(Duration::from_secs(120)))
                                .expect("send completes");
                        }
                        let msg = Message::new(source[i * 997 % MIB..][..len].to_vec())
                            .with_meta(&(i as u64).to_be_bytes())
                            .unwrap();
                        handles
                            .push_back(client.send(&session, msg, Linger::NoWait).expect("send"));
                    }
                    for h in handles {
                        h.wait(Some(Duration::from_secs(120)))
                            .expect("send completes");
                    }
                    receiver.join().expect("all replies verified");
                });
                client.disconnect(session).unwrap();
            });
        }
    });
    assert_eq!(delivered.load(Ordering::SeqCst), clients * messages);
    server.unbind().unwrap();
}

fn client_recv(client: &Transport, session: &Session) -> Message {
    client
        .recv(session, Linger::Timeout(Duration::from_secs(120)))
        .expect("recv")
        .expect("a reply within 120 s")
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn one_server_serves_64_sessions_at_once() {
    let (server, addr, delivered) = checksum_server(Config::default());
    let client = Transport::new(Config::default());
    let sessions: Vec<Session> = (0..64)
        .map(|_| client.connect(addr).expect("connect"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.sessions().len() < 64 {
        assert!(
            Instant::now() < deadline,
            "server has {} sessions",
            server.sessions().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every session at once: two messages each, one eager, one read.
    let mut handles = Vec::new();
    for s in &sessions {
        for (seq, len) in [(0u64, 100usize), (1, 100_000)] {
            let msg = Message::new(vec![seq as u8 + 1; len])
                .with_meta(&seq.to_be_bytes())
                .unwrap();
            handles.push(client.send(s, msg, Linger::NoWait).unwrap());
        }
    }
    for h in handles {
        h.wait(Some(Duration::from_secs(60))).unwrap();
    }
    for s in &sessions {
        for (seq, len) in [(0u64, 100usize), (1, 100_000)] {
            let reply = client_recv(&client, s);
            assert_eq!(reply.meta()[..8], seq.to_be_bytes());
            assert_eq!(
                reply.meta()[8..16],
                checksum(&vec![seq as u8 + 1; len]).to_be_bytes()
            );
        }
    }
    assert_eq!(delivered.load(Ordering::SeqCst), 128);
    client.set_session("first", &sessions[0]);
    assert_eq!(client.session("first").as_ref(), Some(&sessions[0]));
    for s in sessions {
        client.disconnect(s).unwrap();
    }
    server.unbind().unwrap();
    assert!(server.sessions().is_empty());
}

/// A peer that speaks the bootstrap correctly and then sends whatever it is told.
struct Hostile {
    tcp: TcpStream,
    qp: QueuePair<rdma_safe::qp::Rts>,
    cq: Arc<CompletionQueue>,
    mr: MemoryRegion,
}

impl Hostile {
    /// Connects; `tweak` may spoil the hello. `None` if the server refused it.
    fn connect(addr: SocketAddr, tweak: impl FnOnce(&mut [u8])) -> Option<Hostile> {
        let ctx = Context::open(std::env::var("RDMA_DEVICE").ok().as_deref()).unwrap();
        let gid_index = std::env::var("RDMA_GID_INDEX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| ctx.default_gid_index(1).unwrap());
        let gid = ctx.query_gid(1, gid_index).unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 16).unwrap();
        let qp = QueuePair::new(&pd, &QpConfig::rc(&cq))
            .unwrap()
            .to_init(&InitAttr::default())
            .unwrap();
        let mr = MemoryRegion::new(&pd, 65536, Access::ALL_REMOTE).unwrap();
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = Hello {
            qpn: qp.qp_num(),
            psn: 7,
            lid: 0,
            mtu: 3,
            gid: Some(gid.0),
            credits: 8,
            slot_size: 4200,
            max_message: 16 * MIB as u64,
            eager_threshold: 4096,
        }
        .encode();
        tweak(&mut hello);
        tcp.write_all(&hello).unwrap();
        let mut header = [0u8; HELLO_HEADER_LEN];
        tcp.read_exact(&mut header).ok()?;
        let len = Hello::decode_header(&header).unwrap();
        let mut body = vec![0u8; len];
        tcp.read_exact(&mut body).ok()?;
        let theirs = Hello::decode_body(&body).unwrap();
        let mut rtr = RtrAttr::new(theirs.endpoint(), rdma_safe::sys::ibv_mtu::IBV_MTU_1024);
        rtr.sgid_index = gid_index as u8;
        let qp = qp.to_rtr(&rtr).unwrap().to_rts(&RtsAttr::new(7)).unwrap();
        // A server that refused the hello may already have reset the connection.
        tcp.write_all(b"R").ok()?;
        let mut ready = [0u8; 1];
        tcp.read_exact(&mut ready).ok()?;
        Some(Hostile { tcp, qp, cq, mr })
    }

    /// SENDs `bytes` as a control message and waits for the local completion.
    fn send(&mut self, bytes: &[u8]) {
        self.mr.write_at(0, bytes).unwrap();
        let mut sge = [self.mr.local(0..bytes.len()).unwrap()];
        let mut wr = SendWr::send(1, &mut sge).signaled();
        // SAFETY: the region outlives the completion polled below.
        unsafe { self.qp.post_send(&mut wr) }.unwrap();
        let mut wcs = [WorkCompletion::default(); 4];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(wc) = self.cq.poll(&mut wcs).unwrap().first() {
                wc.result().unwrap();
                return;
            }
            assert!(Instant::now() < deadline);
        }
    }

    /// True once the server closed the bootstrap connection.
    fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.tcp.read(&mut b), Ok(0) | Err(_))
    }
}

fn control(kind: Kind, h: Control) -> Vec<u8> {
    let mut v = vec![0u8; CONTROL_HEADER_LEN];
    h.write_header(kind, &mut v);
    v
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_peers_are_cut_off_and_everyone_else_is_served() {
    let (server, addr, delivered) = checksum_server(Config::default());
    let (logged, log) = logged_server(Config {
        max_message: MIB as u64,
        ..Config::default()
    });
    logged
        .register_callback(|_, _, _| panic!("a hostile message was delivered"))
        .unwrap();
    let hostile_addr = logged.bind((server_ip().as_str(), 0)).unwrap();
    for (what, bytes, reason) in hostile_messages() {
        hostile_is_cut_off(hostile_addr, &log, what, &bytes, reason);
    }
    // A protocol version the server does not speak: refused at the hello.
    assert!(Hostile::connect(hostile_addr, |b| b[5] = 9).is_none());
    wait_log(&log, "protocol version mismatch: the peer speaks version 9");
    assert!(logged.sessions().is_empty(), "hostile sessions released");

    // Meanwhile both servers go on serving honest clients.
    honest_clients_are_served(addr, hostile_addr);
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
    server.unbind().unwrap();
    logged.unbind().unwrap();
}

/// The hostile peers' messages: what each is, its bytes, and the reason the server
/// must log.
fn hostile_messages() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    vec![
        (
            "unknown type",
            {
                let mut m = control(Kind::Credit, Control::default());
                m[0] = 42;
                m
            },
            "unknown control message type 42",
        ),
        ("truncated", vec![2, 0, 0], "truncated"),
        (
            "over the limit",
            control(
                Kind::Data,
                Control {
                    msg_id: 1,
                    len: 2 * MIB as u64,
                    addr: 0x1000,
                    rkey: 1,
                    ..Default::default()
                },
            ),
            "exceeds the limit",
        ),
        (
            "out of range",
            control(
                Kind::Data,
                Control {
                    msg_id: 1,
                    len: 4096,
                    addr: u64::MAX - 100,
                    rkey: 1,
                    ..Default::default()
                },
            ),
            "wraps around",
        ),
        (
            "ack of nothing",
            control(
                Kind::Ack,
                Control {
                    msg_id: 999,
                    ..Default::default()
                },
            ),
            "acknowledgement of message 999, which is not in flight",
        ),
        (
            "message id not above the last one",
            control(Kind::Eager, Control::default()),
            "message id 0 repeats or goes backwards",
        ),
        (
            "bad descriptor key",
            control(
                Kind::Data,
                Control {
                    msg_id: 5,
                    len: 4096,
                    addr: 0x10_0000,
                    rkey: 0xdead,
                    ..Default::default()
                },
            ),
            "RDMA failed",
        ),
    ]
}

/// A hostile peer sends `bytes`: the server logs `reason` and closes the connection.
fn hostile_is_cut_off(
    hostile_addr: SocketAddr,
    log: &Mutex<Vec<String>>,
    what: &str,
    bytes: &[u8],
    reason: &str,
) {
    let mut h = Hostile::connect(hostile_addr, |_| {}).expect("handshake");
    h.send(bytes);
    let line = wait_log(log, reason);
    assert!(line.contains("closed"), "{what}: {line}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.closed_by_server() {
        assert!(Instant::now() < deadline, "{what}: connection left open");
    }
}

/// An honest client of each server is served (the checksum server answers).
fn honest_clients_are_served(addr: SocketAddr, hostile_addr: SocketAddr) {
    for target in [addr, hostile_addr] {
        let client = Transport::new(Config::default());
        let s = client.connect(target).unwrap();
        if target == addr {
            let msg = Message::new(vec![9u8; 300_000])
                .with_meta(&0u64.to_be_bytes())
                .unwrap();
            client.send(&s, msg, Linger::Block).unwrap();
            let reply = client_recv(&client, &s);
            assert_eq!(reply.meta()[8..16], checksum(&[9u8; 300_000]).to_be_bytes());
        }
        client.disconnect(s).unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_dripping_or_silent_client_is_cut_off_at_the_handshake_deadline() {
    // The whole handshake gets `timeout`, however the client paces its bytes.
    const TIMEOUT: Duration = Duration::from_secs(1);
    const SLACK: Duration = Duration::from_secs(3);
    let (server, log) = logged_server(Config {
        timeout: TIMEOUT,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    // A valid hello: sent a byte every 100 ms, it would take 6 s.
    let hello = Hello {
        qpn: 0x1234,
        psn: 7,
        lid: 0,
        mtu: 3,
        gid: Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        credits: 8,
        slot_size: 4200,
        max_message: MIB as u64,
        eager_threshold: 4096,
    }
    .encode();
    for (what, drip) in [("dripping", true), ("silent", false)] {
        let start = Instant::now();
        let mut tcp = TcpStream::connect(addr).unwrap();
        let me = tcp.local_addr().unwrap();
        let mut writer = tcp.try_clone().unwrap();
        let client = std::thread::spawn(move || {
            for byte in hello.iter().take(if drip { hello.len() } else { 0 }) {
                // Once the server gave up, writes fail: stop there.
                if writer.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let line = wait_log(&log, &format!("connection from {me} refused"));
        let took = start.elapsed();
        assert!(line.contains("the peer was too slow"), "{what}: {line}");
        assert!(line.contains("1s allowed"), "{what}: {line}");
        assert!(took < TIMEOUT + SLACK, "{what}: cut off after {took:?}");
        // The server closed the connection (after its own hello).
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        let closed = tcp.read_to_end(&mut rest);
        assert!(
            closed.is_ok()
                || closed
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{what}: connection left open: {closed:?}"
        );
        client.join().unwrap();
    }
    assert!(server.sessions().is_empty());
    // An honest client is still served.
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
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

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_slow_receiver_slows_the_sender_and_loses_nothing() {
    // The callback takes 20 ms per message; 200 messages are sent without waiting.
    // Credits (8 here) hold the sender back; every message still arrives, in order.
    let server = Transport::new(Config {
        credits: 8,
        ..Config::default()
    });
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    server
        .register_callback(move |msg, _, _| {
            std::thread::sleep(Duration::from_millis(20));
            sink.lock()
                .push(u64::from_be_bytes(msg.meta()[..8].try_into().unwrap()));
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let rnr_before = rnr_naks();
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    let handles: Vec<_> = (0..200u64)
        .map(|i| {
            let size = if i % 3 == 0 { 20_000 } else { 100 };
            let msg = Message::new(vec![i as u8; size])
                .with_meta(&i.to_be_bytes())
                .unwrap();
            client.send(&s, msg, Linger::NoWait).unwrap()
        })
        .collect();
    // Soon after, the sender is still held back: most sends are not done yet.
    std::thread::sleep(Duration::from_millis(200));
    let done_early = handles.iter().filter(|h| h.is_done()).count();
    assert!(
        done_early < 100,
        "{done_early} of 200 done while the receiver is slow"
    );
    for h in &handles {
        h.wait(Some(Duration::from_secs(60))).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.lock().len() < 200 {
        assert!(
            Instant::now() < deadline,
            "only {} delivered",
            got.lock().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(*got.lock(), (0..200).collect::<Vec<u64>>());
    assert_eq!(
        rnr_naks(),
        rnr_before,
        "a SEND found no posted receive: a credit went back too early"
    );
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_registered_region_is_sent_without_copying_and_configuration_round_trips() {
    let (server, addr, delivered) = checksum_server(Config::default());
    let client = Transport::new(Config::default());
    let mut config = client.configuration();
    config.eager_threshold = 1024;
    client.set_configuration(config.clone()).unwrap();
    assert_eq!(client.configuration(), config);
    client.set_context(Arc::new(String::from("user data")));
    let ctx = client.context().unwrap();
    assert_eq!(ctx.downcast_ref::<String>().unwrap(), "user data");

    let session = client.connect(addr).unwrap();
    assert!(
        client.set_configuration(Config::default()).is_err(),
        "configuration is fixed once connected"
    );
    let mut region = client.register(3 * MIB).unwrap();
    for (i, b) in region.as_mut_slice().unwrap().iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let region = Arc::new(region);
    let msg = Message::from_region(region.clone(), MIB..3 * MIB)
        .unwrap()
        .with_meta(&0u64.to_be_bytes())
        .unwrap();
    client.send(&session, msg, Linger::Block).unwrap();
    let reply = client_recv(&client, &session);
    assert_eq!(
        reply.meta()[8..16],
        checksum(&region.as_slice().unwrap()[MIB..3 * MIB]).to_be_bytes()
    );
    assert_eq!(
        Arc::strong_count(&region),
        1,
        "the region was released after the ack"
    );
    assert!(Message::from_region(region, 0..4 * MIB).is_err());
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_blocked_callback_holds_up_its_own_session_only() {
    // A callback that blocks (here, on the first message of session "slow") stalls
    // that session, not the others: another runner stands in for the blocked one.
    let server = Transport::new(Config::default());
    let (release, blocked) = std::sync::mpsc::channel::<()>();
    let blocked = Mutex::new(blocked);
    server
        .register_callback(move |msg, session, transport| {
            if msg.meta() == b"block" {
                let _ = blocked.lock().recv_timeout(Duration::from_secs(60));
            }
            let reply = Message::new(msg.bytes().to_vec())
                .with_meta(msg.meta())
                .unwrap();
            transport.send(session, reply, Linger::NoWait).unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let slow = client.connect(addr).unwrap();
    let fast = client.connect(addr).unwrap();
    let block = Message::new(vec![1u8; 64]).with_meta(b"block").unwrap();
    client.send(&slow, block, Linger::Block).unwrap();
    // The slow session's callback is now blocked; the fast one is served throughout.
    for i in 0..50u32 {
        let payload: Vec<u8> = (0..1000 + i).map(|b| (b ^ i) as u8).collect();
        let sum = checksum(&payload);
        let msg = Message::new(payload).with_meta(b"fast").unwrap();
        client.send(&fast, msg, Linger::Block).unwrap();
        let echo = client_recv(&client, &fast);
        assert_eq!(checksum(echo.bytes()), sum, "echo {i} intact");
    }
    assert!(
        client.recv(&slow, Linger::NoWait).unwrap().is_none(),
        "the blocked callback has not answered yet"
    );
    release.send(()).unwrap();
    let echo = client_recv(&client, &slow);
    assert_eq!(echo.meta(), b"block");
    client.disconnect(slow).unwrap();
    client.disconnect(fast).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_zero_length_message_of_a_registered_region_is_delivered_both_ways() {
    // Issue 13, 5(b): an empty slice of a registered region travels (eager: a read
    // needs at least one byte) and is delivered; the session goes on.
    let server = Transport::new(Config::default());
    let region = Arc::new(server.register(4096).unwrap());
    let answer = region.clone();
    server
        .register_callback(move |msg, session, transport| {
            let reply = Message::from_region(answer.clone(), 0..msg.len())
                .expect("a slice of the region")
                .with_meta(msg.meta())
                .unwrap();
            transport.send(session, reply, Linger::NoWait).unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let mut mine = client.register(4096).unwrap();
    mine.as_mut_slice().unwrap().fill(7);
    let mine = Arc::new(mine);
    let session = client.connect(addr).unwrap();
    for (i, range) in [0..0, 0..100, 4096..4096, 10..10].into_iter().enumerate() {
        let len = range.len();
        let msg = Message::from_region(mine.clone(), range)
            .unwrap()
            .with_meta(&[i as u8])
            .unwrap();
        client.send(&session, msg, Linger::Block).unwrap();
        let reply = client_recv(&client, &session);
        assert_eq!((reply.meta(), reply.len()), (&[i as u8][..], len));
    }
    assert!(session.closed().is_none(), "the session lives");
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_callback_that_waits_on_a_send_gets_a_clear_error() {
    // Issue 13, 5(c): callbacks run on the callback runner threads only; a wait
    // there (a blocking or timed send, or waiting on a handle) is refused at once
    // with the reason, and nothing was sent by the refused call.
    let server = Transport::new(Config::default());
    server
        .register_callback(move |msg, session, transport| {
            let thread = std::thread::current().name().unwrap_or("").to_string();
            let echo = || Message::new(msg.bytes().to_vec());
            let blocking = transport.send(session, echo(), Linger::Block).err();
            let timed = transport
                .send(session, echo(), Linger::Timeout(Duration::from_secs(5)))
                .err();
            let handle = transport.send(session, echo(), Linger::NoWait).unwrap();
            let waited = handle.wait(Some(Duration::from_secs(5))).err();
            let report = format!("{thread}\n{blocking:?}\n{timed:?}\n{waited:?}");
            let reply = Message::new(report.into_bytes())
                .with_meta(b"report")
                .unwrap();
            transport.send(session, reply, Linger::NoWait).unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let session = client.connect(addr).unwrap();
    let payload = vec![9u8; 100_000];
    client
        .send(
            &session,
            payload.clone(),
            Linger::Timeout(Duration::from_secs(60)),
        )
        .unwrap();
    // Only the NoWait echo went out, then the report.
    let echo = client_recv(&client, &session);
    assert_eq!(
        checksum(echo.bytes()),
        checksum(&payload),
        "the echo is intact"
    );
    let report = client_recv(&client, &session);
    assert_eq!(report.meta(), b"report", "one echo only, then the report");
    let report = String::from_utf8(report.bytes().to_vec()).unwrap();
    let lines: Vec<&str> = report.lines().collect();
    assert!(
        lines[0].starts_with("kiara-runner-"),
        "the callback ran on a callback runner thread: {report}"
    );
    for (what, line) in ["Linger::Block", "Linger::Timeout", "SendHandle::wait"]
        .iter()
        .zip(&lines[1..])
    {
        assert!(
            line.contains("Usage") && line.contains("must not wait on a send"),
            "{what} in a callback: {line}"
        );
    }
    assert!(
        client
            .recv(&session, Linger::Timeout(Duration::from_millis(500)))
            .unwrap()
            .is_none(),
        "nothing else was sent"
    );
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_steady_stream_of_one_size_registers_no_memory() {
    // Read messages (64 KiB, over the eager threshold) both ways, 220 of them: the
    // pool buffers, the READ targets and the exact views the windows are bound to
    // are reused, so what each side registers is bounded by what it can hold at
    // once, not by the number of messages.
    //
    // A registration is a pool buffer or a buffer's exact view (a message sent
    // from a buffer gets one, kept for the next message of that length). The
    // client is strictly sequential (each round waits until its message's buffer
    // is free again and drops the echo), so it holds at most two buffers at once
    // (message, echo's READ target): at most 4 registrations. Whether it needs one
    // buffer or two, and which of them carry views, is timing (the invalidation
    // may finish before or after the echo arrives), so fewer are fine. The server
    // may hold round i's reply and message while round i + 1's message arrives:
    // four buffers, at most 8. A leak per message would pass these bounds within
    // the first few dozen messages.
    let server = Transport::new(Config::default());
    server
        .register_callback(|msg, session, transport| {
            let reply = Message::new(msg.bytes().to_vec());
            transport.send(session, reply, Linger::NoWait).unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let session = client.connect(addr).unwrap();
    let mut most = (0, 0);
    for i in 0..220usize {
        let payload: Vec<u8> = (0..64 * 1024).map(|b| (b ^ i) as u8).collect();
        let sum = checksum(&payload);
        let sent = client.send(&session, payload, Linger::NoWait).unwrap();
        let echo = client_recv(&client, &session);
        assert_eq!(checksum(echo.bytes()), sum, "echo {i} intact");
        sent.wait(Some(Duration::from_secs(30))).unwrap();
        drop(echo);
        most = (
            most.0.max(client.registrations()),
            most.1.max(server.registrations()),
        );
        assert!(
            most.0 <= 4 && most.1 <= 8,
            "after {} messages: client {} (at most 4), server {} (at most 8) registrations",
            i + 1,
            most.0,
            most.1
        );
    }
    assert!(most.0 >= 2 && most.1 >= 2, "nothing registered? {most:?}");
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}
