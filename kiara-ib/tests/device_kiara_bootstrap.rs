//! Device tests of the KIARA bootstrap against hostile clients and servers, run in
//! the Soft-RoCE guest by `cargo xtask test`: connections that never finish the
//! handshake, a hello dripped a byte at a time, and a thousand idle connections,
//! while well-behaved clients are served (every reply's checksum checked). The
//! server hears a client's hello before it creates anything, runs at most
//! `max_handshakes` handshakes at once (and, if set, `max_sessions_per_address` for
//! one address) and refuses the excess with a logged reason: its threads and pinned
//! memory stay bounded. Also: a server whose queue pair never answers the client's
//! greeting, a session woken by its completions right after `connect`, and the
//! rate of the log lines about refused connections and closed sessions.

use kiara_ib::message::checksum;
use kiara_ib::protocol::{Hello, HELLO_BODY_LEN, HELLO_HEADER_LEN};
use kiara_ib::{CloseReason, Config, Error, Linger, Message, Transport};
use parking_lot::Mutex;
use rdma_safe::{
    CompletionQueue, Context, InitAttr, ProtectionDomain, QpConfig, QueuePair, RtrAttr,
};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn server_ip() -> String {
    std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

/// A server whose log lines are kept for the test to read, answering every message
/// with (sequence, checksum of its bytes) as metadata. Returns the messages delivered.
fn checksum_server(config: Config) -> (Transport, Arc<Mutex<Vec<String>>>, Arc<AtomicUsize>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let t = Transport::with_logger(config, Arc::new(move |l: &str| sink.lock().push(l.into())));
    let delivered = Arc::new(AtomicUsize::new(0));
    let count = delivered.clone();
    t.register_callback(move |msg, session, transport| {
        count.fetch_add(1, Ordering::SeqCst);
        let mut meta = [0u8; 16];
        meta[..8].copy_from_slice(&msg.meta()[..8]);
        meta[8..].copy_from_slice(&checksum(msg.bytes()).to_be_bytes());
        let reply = Message::new(Vec::new()).with_meta(&meta).expect("16 bytes");
        transport
            .send(session, reply, Linger::NoWait)
            .expect("reply queued");
    })
    .unwrap();
    (t, log, delivered)
}

/// A well-behaved client: `rounds` sessions one after the other (each connect retried
/// while the server refuses it, for at most `patience`), each sending `messages`
/// messages of sizes up to `max_size` and checking every reply's checksum. Returns
/// how many connection attempts were refused.
fn good_client(
    addr: SocketAddr,
    seed: u64,
    rounds: usize,
    messages: usize,
    max_size: usize,
    patience: Duration,
) -> usize {
    let client = Transport::new(Config {
        timeout: Duration::from_secs(5),
        ..Config::default()
    });
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut refused = 0;
    for round in 0..rounds {
        let start = Instant::now();
        let session = loop {
            match client.connect(addr) {
                Ok(s) => break s,
                Err(e) => {
                    refused += 1;
                    assert!(
                        start.elapsed() < patience,
                        "client {seed} round {round}: never served within {patience:?}: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        for seq in 0..messages as u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x as usize) % (max_size + 1);
            let bytes: Vec<u8> = (0..len).map(|i| (i as u64 ^ x) as u8).collect();
            let sum = checksum(&bytes);
            let msg = Message::new(bytes)
                .with_meta(&seq.to_be_bytes())
                .expect("8 bytes");
            client.send(&session, msg, Linger::Block).expect("send");
            let reply = client
                .recv(&session, Linger::Timeout(Duration::from_secs(10)))
                .expect("recv")
                .expect("a reply within 10 s");
            assert_eq!(reply.meta()[..8], seq.to_be_bytes(), "reply out of order");
            assert_eq!(
                reply.meta()[8..16],
                sum.to_be_bytes(),
                "client {seed}: message {seq} of {len} bytes corrupted"
            );
        }
        client.disconnect(session).unwrap();
    }
    refused
}

/// A field of /proc/self/status, in its unit (kB for memory).
fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Pinned memory (memory registrations count here) in KiB.
fn pinned_kib() -> u64 {
    status("VmPin") + status("VmLck")
}

/// Records the peaks of the process's threads and pinned memory until dropped.
struct Peaks {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(u64, u64)>>,
}

impl Peaks {
    fn start() -> Peaks {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut threads, mut pinned) = (0, 0);
            while !flag.load(Ordering::SeqCst) {
                threads = threads.max(status("Threads"));
                pinned = pinned.max(pinned_kib());
                std::thread::sleep(Duration::from_millis(5));
            }
            (threads, pinned)
        });
        Peaks {
            stop,
            thread: Some(thread),
        }
    }

    /// (threads, pinned KiB) at their highest.
    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A valid hello (the QPN needs no queue pair behind it: nobody gets that far).
fn some_hello() -> [u8; HELLO_HEADER_LEN + HELLO_BODY_LEN] {
    Hello {
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
    .encode()
}

/// A client that sends a valid hello for a real queue pair, reads the server's and
/// then never sends its ready byte.
struct NeverReady {
    tcp: TcpStream,
    _qp: QueuePair<rdma_safe::qp::Init>,
    _cq: Arc<CompletionQueue>,
}

/// A queue pair in INIT (the device drops what is sent to it) and a valid hello
/// for it.
struct Silent {
    hello: Hello,
    qp: QueuePair<rdma_safe::qp::Init>,
    cq: Arc<CompletionQueue>,
    gid_index: u32,
}

impl Silent {
    /// Ready to receive from the peer whose hello is `theirs`, with no receive
    /// posted: every SEND gets a receiver-not-ready NAK, which an RC requester
    /// with RNR retry 7 (kiara's) retries for ever, on any device.
    fn receiving_nothing(
        self,
        theirs: &Hello,
    ) -> (QueuePair<rdma_safe::qp::Rtr>, Arc<CompletionQueue>) {
        let mut rtr = RtrAttr::new(theirs.endpoint(), rdma_safe::sys::ibv_mtu::IBV_MTU_1024);
        rtr.sgid_index = self.gid_index as u8;
        (self.qp.to_rtr(&rtr).unwrap(), self.cq)
    }
}

impl NeverReady {
    fn connect(addr: SocketAddr) -> NeverReady {
        let silent = NeverReady::queue_pair();
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tcp.write_all(&silent.hello.encode()).unwrap();
        // The server answers only after it has checked ours.
        let mut header = [0u8; HELLO_HEADER_LEN];
        tcp.read_exact(&mut header).expect("the server's hello");
        let len = Hello::decode_header(&header).unwrap();
        let mut body = vec![0u8; len];
        tcp.read_exact(&mut body).unwrap();
        Hello::decode_body(&body).unwrap();
        NeverReady {
            tcp,
            _qp: silent.qp,
            _cq: silent.cq,
        }
    }

    /// A queue pair in INIT on the test's device, and its hello.
    fn queue_pair() -> Silent {
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
        let hello = Hello {
            qpn: qp.qp_num(),
            psn: 7,
            lid: 0,
            mtu: 3,
            gid: Some(gid.0),
            credits: 8,
            slot_size: 4200,
            max_message: MIB as u64,
            eager_threshold: 4096,
        };
        Silent {
            hello,
            qp,
            cq,
            gid_index,
        }
    }
}

/// Reads `tcp` until the server closes it, within `within`; returns the bytes the
/// server sent first. Fails if it stays open.
fn closed_by_server(tcp: &mut TcpStream, within: Duration, what: &str) -> Vec<u8> {
    tcp.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("{what}: connection left open ({e})"),
        }
    }
}

/// The latest log line about a connection from `local`, if any. (With a thousand
/// connections the kernel may hand a closed connection's port to a later one, so an
/// address can have more than one line.)
fn line_about(log: &[String], local: SocketAddr) -> Option<String> {
    let needle = format!("connection from {local} refused: ");
    log.iter().rev().find(|l| l.contains(&needle)).cloned()
}

/// Waits until the log has a line about every address of `locals`.
fn wait_lines(log: &Mutex<Vec<String>>, locals: &[SocketAddr], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let log = log.lock();
        let missing: Vec<_> = locals
            .iter()
            .filter(|a| line_about(&log, **a).is_none())
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no log line about {} connections, e.g. {:?}: {:?}",
            missing.len(),
            missing[0],
            log.iter().rev().take(5).collect::<Vec<_>>()
        );
        drop(log);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the server has no session left.
fn wait_no_sessions(server: &Transport) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.sessions().is_empty() {
        assert!(Instant::now() < deadline, "sessions left: {server:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn f_unfinished_handshakes_pin_nothing_until_the_hello_and_are_cut() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    const SLACK: Duration = Duration::from_secs(3);
    const SILENT: usize = 10;
    const HALF: usize = 10;
    const NEVER_READY: usize = 4;
    // Every refusal logged: the 24 handshakes are cut within a second, and each
    // one's line is checked.
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        max_handshakes: 32,
        log_lines_per_second: 0,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let pinned_before = pinned_kib();
    let threads_before = status("Threads");
    let start = Instant::now();

    // 1. Connections that say nothing, or half a hello: a thread each, no device
    //    resource (before the server heard the hello first, each pinned ~270 KiB).
    let mut quiet = quiet_connections(addr, SILENT, HALF);
    std::thread::sleep(Duration::from_millis(300));
    let pinned_quiet = pinned_kib();
    let threads_quiet = status("Threads");
    assert!(
        pinned_quiet <= pinned_before + 64,
        "{} idle connections pinned {} KiB",
        SILENT + HALF,
        pinned_quiet - pinned_before
    );
    assert!(
        threads_quiet <= threads_before + (SILENT + HALF) as u64,
        "threads {threads_before} -> {threads_quiet}"
    );

    // 2. Clients that send a valid hello and never their ready byte: the server built
    //    their queue pairs and buffers, and holds them until the deadline.
    let mut never: Vec<NeverReady> = (0..NEVER_READY)
        .map(|_| NeverReady::connect(addr))
        .collect();
    let pinned_hellos = pinned_kib();
    assert!(
        pinned_hellos >= pinned_quiet + NEVER_READY as u64 * 200,
        "a valid hello must get the server's buffers (pinned {pinned_quiet} -> {pinned_hellos} \
         KiB): is VmPin measuring registrations?"
    );

    // 3. Meanwhile, well-behaved clients are served (no refusal: 24 + 4 < 32).
    let refused: usize = std::thread::scope(|s| {
        let clients: Vec<_> = (0..4)
            .map(|c| s.spawn(move || good_client(addr, c, 2, 20, 4 * KIB, TIMEOUT)))
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    });
    assert_eq!(refused, 0, "a good client was refused");
    assert_eq!(delivered.load(Ordering::SeqCst), 4 * 2 * 20);

    // 4. Every unfinished handshake is cut at the deadline, with the part it was on.
    quiet_connections_are_cut(&log, &mut quiet, TIMEOUT + SLACK, SLACK);
    for n in &mut never {
        let local = n.tcp.local_addr().unwrap();
        closed_by_server(&mut n.tcp, TIMEOUT + SLACK, "never ready");
        wait_lines(&log, &[local], SLACK);
        let line = line_about(&log.lock(), local).unwrap();
        assert!(
            line.contains("too slow") && line.contains("ready byte"),
            "{line}"
        );
    }
    assert!(
        start.elapsed() < TIMEOUT + 2 * SLACK,
        "{:?}",
        start.elapsed()
    );
    drop(never);
    wait_no_sessions(&server);
    // Everything the handshakes held is released (the good clients' messages were
    // eager: the server's pool registered nothing).
    wait_unpinned(pinned_before);
    server.unbind().unwrap();
}

/// `silent` connections that say nothing and `half` that send half a hello, each
/// with the part of the hello the server waits for.
fn quiet_connections(
    addr: SocketAddr,
    silent: usize,
    half: usize,
) -> Vec<(TcpStream, &'static str)> {
    let hello = some_hello();
    let mut quiet: Vec<(TcpStream, &str)> = Vec::new();
    for i in 0..silent + half {
        let mut tcp = TcpStream::connect(addr).unwrap();
        if i >= silent {
            tcp.write_all(&hello[..30]).unwrap();
            quiet.push((tcp, "hello body"));
        } else {
            quiet.push((tcp, "hello header"));
        }
    }
    quiet
}

/// Each quiet connection is closed `within` without a byte from the server, and
/// logged (within `slack`) as too slow on the part it was on.
fn quiet_connections_are_cut(
    log: &Mutex<Vec<String>>,
    quiet: &mut [(TcpStream, &str)],
    within: Duration,
    slack: Duration,
) {
    for (tcp, part) in quiet {
        let local = tcp.local_addr().unwrap();
        let sent = closed_by_server(tcp, within, part);
        assert!(sent.is_empty(), "the server answered an incomplete hello");
        wait_lines(log, &[local], slack);
        let line = line_about(&log.lock(), local).unwrap();
        assert!(
            line.contains("the peer was too slow") && line.contains(*part),
            "{part}: {line}"
        );
    }
}

/// Waits (5 s at most) until the process pins no more than 64 KiB above `before`.
fn wait_unpinned(before: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pinned_kib() > before + 64 {
        assert!(
            Instant::now() < deadline,
            "pinned {before} -> {} KiB after every handshake ended",
            pinned_kib()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn h_a_dripped_hello_is_cut_at_the_deadline_while_others_are_served() {
    const TIMEOUT: Duration = Duration::from_millis(1500);
    const SLACK: Duration = Duration::from_secs(2);
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let hello = some_hello();
    std::thread::scope(|s| {
        // Three clients drip a valid hello a byte per 100 ms (6 s for all of it).
        let drippers: Vec<_> = (0..3)
            .map(|_| {
                let log = &log;
                s.spawn(move || {
                    let start = Instant::now();
                    let mut tcp = TcpStream::connect(addr).unwrap();
                    let local = tcp.local_addr().unwrap();
                    let mut writer = tcp.try_clone().unwrap();
                    let drip = std::thread::spawn(move || {
                        for byte in hello {
                            // Once the server gave up, writes fail: stop there.
                            if writer.write_all(&[byte]).is_err() {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    });
                    // The server never answers a hello it has not read whole.
                    let sent = closed_by_server(&mut tcp, TIMEOUT + SLACK, "dripper");
                    let took = start.elapsed();
                    assert!(sent.is_empty(), "the server answered a partial hello");
                    assert!(took < TIMEOUT + SLACK, "cut off after {took:?}");
                    assert!(
                        took + Duration::from_millis(200) >= TIMEOUT,
                        "cut early: {took:?}"
                    );
                    wait_lines(log, &[local], SLACK);
                    let line = line_about(&log.lock(), local).unwrap();
                    assert!(line.contains("the peer was too slow"), "{line}");
                    assert!(line.contains("1.5s allowed"), "{line}");
                    drip.join().unwrap();
                })
            })
            .collect();
        // Meanwhile two clients exchange messages of up to 1 MiB (read ones too).
        let clients: Vec<_> = (0..2)
            .map(|c| s.spawn(move || good_client(addr, 100 + c, 3, 10, MIB, TIMEOUT)))
            .collect();
        for c in clients {
            assert_eq!(c.join().unwrap(), 0, "a good client was refused");
        }
        for d in drippers {
            d.join().unwrap();
        }
    });
    assert_eq!(delivered.load(Ordering::SeqCst), 2 * 3 * 10);
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// Raises this process's open file limit to at least `n` (root may raise the hard
/// limit too).
fn allow_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur >= n {
        return;
    }
    lim.rlim_max = lim.rlim_max.max(n);
    lim.rlim_cur = n;
    // SAFETY: `lim` is a valid rlimit; the call only reads it.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(
        rc,
        0,
        "cannot allow {n} open files: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn i_a_thousand_idle_connections_are_refused_or_cut_and_good_clients_served() {
    const IDLE: usize = 1000;
    const TIMEOUT: Duration = Duration::from_secs(2);
    const SLACK: Duration = Duration::from_secs(4);
    const MAX_HANDSHAKES: usize = 16;
    allow_files(4096);
    // Every refusal logged, to check each connection's reason (the rate of the
    // lines is the next test's).
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        max_handshakes: MAX_HANDSHAKES,
        log_lines_per_second: 0,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let threads_before = status("Threads");
    let pinned_before = pinned_kib();
    let peaks = Peaks::start();
    let start = Instant::now();

    let (idle, refused) = idle_connections_beside_good_clients(addr, IDLE);
    assert_eq!(delivered.load(Ordering::SeqCst), 4 * 3 * 10);

    // Every idle connection is closed without a byte, refused at once or cut at the
    // deadline, and logged once with its reason.
    let mut idle = idle;
    let locals: Vec<SocketAddr> = idle.iter().map(|(t, _)| t.local_addr().unwrap()).collect();
    for (tcp, opened) in &mut idle {
        let left = (*opened + TIMEOUT + SLACK).saturating_duration_since(Instant::now());
        let sent = closed_by_server(tcp, left.max(Duration::from_millis(1)), "idle");
        assert!(
            sent.is_empty(),
            "the server wrote to a client that said nothing"
        );
    }
    wait_lines(&log, &locals, SLACK);
    let (threads_peak, pinned_peak) = peaks.finish();
    let reasons = idle_reasons(&log.lock(), &locals, MAX_HANDSHAKES);
    eprintln!(
        "{IDLE} idle connections: {reasons:?}; good clients refused {refused} times; \
         threads {threads_before} -> peak {threads_peak}; pinned {pinned_before} -> peak \
         {pinned_peak} KiB; {:?}",
        start.elapsed()
    );
    assert!(
        reasons.get("in progress").copied().unwrap_or(0) > 0,
        "{reasons:?}"
    );
    assert!(reasons.get("cut").copied().unwrap_or(0) > 0, "{reasons:?}");
    assert!(
        reasons.get("gave way").copied().unwrap_or(0) > 0,
        "{reasons:?}"
    );
    // Threads: the handshakes (those holding a place, and at most as many again
    // that gave theirs up and are ending), the clients' and the test's own (4
    // openers, 4 clients, the peak sampler, each client's poller, each session's
    // dispatcher): nowhere near one per connection.
    assert!(
        threads_peak <= threads_before + 2 * MAX_HANDSHAKES as u64 + 24,
        "threads {threads_before} -> peak {threads_peak}"
    );
    // Pinned memory: at most the handshakes' buffers and the good clients' sessions
    // and pools, not 270 KiB per connection (270 MiB).
    assert!(
        pinned_peak <= pinned_before + 24 * 1024,
        "pinned {pinned_before} -> peak {pinned_peak} KiB"
    );
    assert!(
        start.elapsed() < Duration::from_secs(40),
        "{:?}",
        start.elapsed()
    );
    drop(idle);
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// A flood of connections refused at once (`max_sessions` reached) is logged at
/// most `Config::log_lines_per_second` lines a second, and the summaries count
/// every refusal that was not logged on its own line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn k_a_flood_of_refused_connections_is_logged_at_a_bounded_rate() {
    const FLOOD: usize = 400;
    const PER_SECOND: usize = 20;
    allow_files(4096);
    let (server, log, delivered) = checksum_server(Config {
        max_sessions: 1,
        ..Config::default()
    });
    assert_eq!(Config::default().log_lines_per_second as usize, PER_SECOND);
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();

    let start = Instant::now();
    for _ in 0..FLOOD {
        let mut tcp = TcpStream::connect(addr).unwrap();
        let sent = closed_by_server(&mut tcp, Duration::from_secs(5), "refused");
        assert!(sent.is_empty(), "the server wrote to a refused connection");
    }
    let flood = start.elapsed();
    // The last window's summary comes within a second and the accept loop's look.
    let count = |log: &[String]| {
        let lines = log
            .iter()
            .filter(|l| l.contains("refused: max_sessions (1) reached"));
        let held = held_in_summaries(log, SUMMARY_END);
        (lines.count(), held)
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let (lines, held) = loop {
        let (lines, held) = count(&log.lock());
        if lines + held >= FLOOD || Instant::now() > deadline {
            break (lines, held);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let windows = flood.as_secs() as usize + 1;
    eprintln!("{FLOOD} refusals in {flood:?}: {lines} lines, {held} counted in summaries");
    assert_eq!(lines + held, FLOOD, "every refusal is logged or counted");
    assert!(
        held > 0,
        "a flood of {FLOOD} in {flood:?} was logged line by line"
    );
    assert!(
        lines <= PER_SECOND * windows,
        "{lines} lines in {flood:?}: over {PER_SECOND} a second"
    );
    // The session and the server still serve.
    let last = Message::new(b"after the flood".to_vec())
        .with_meta(&[7; 8])
        .unwrap();
    client.send(&s, last, Linger::Block).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.load(Ordering::SeqCst) < 1 {
        assert!(
            Instant::now() < deadline,
            "the message after the flood did not arrive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    client.disconnect(s).unwrap();
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// Sessions that all close at once (their client transport went away) are
/// logged at most `Config::log_lines_per_second` lines a second, and the summary
/// counts every close that was not logged on its own line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn n_sessions_closing_at_once_are_logged_at_a_bounded_rate() {
    const SESSIONS: usize = 60;
    const PER_SECOND: usize = 20;
    let (server, log, _) = checksum_server(Config::default());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let sessions: Vec<_> = (0..SESSIONS)
        .map(|_| client.connect(addr).unwrap())
        .collect();
    let before = log.lock().len();
    let start = Instant::now();
    drop(sessions);
    drop(client);
    wait_no_sessions(&server);
    let closing = start.elapsed();
    let count = |log: &[String]| {
        let lines = log[before..]
            .iter()
            .filter(|l| l.starts_with("session ") && l.contains(") closed: "))
            .count();
        let held = held_in_summaries(&log[before..], SESSION_SUMMARY_END);
        (lines, held)
    };
    // The last window's summary comes within a second and a sweep.
    let deadline = Instant::now() + Duration::from_secs(3);
    let (lines, held) = loop {
        let (lines, held) = count(&log.lock());
        if lines + held >= SESSIONS || Instant::now() > deadline {
            break (lines, held);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("{SESSIONS} sessions closed in {closing:?}: {lines} lines, {held} in summaries");
    assert_eq!(
        lines + held,
        SESSIONS,
        "every close is logged or counted: {:?}",
        &log.lock()[before..]
    );
    assert!(
        held > 0,
        "{SESSIONS} closes in {closing:?} were logged line by line"
    );
    // Every close line is written before the session leaves the engine.
    assert!(
        lines <= PER_SECOND * (closing.as_secs() as usize + 1),
        "{lines} lines in {closing:?}: over {PER_SECOND} a second"
    );
    if closing < Duration::from_secs(1) {
        assert_eq!((lines, held), (PER_SECOND, SESSIONS - PER_SECOND));
    }
    server.unbind().unwrap();
}

/// With `max_sessions_per_address`, one address holds at most that many sessions
/// and handshakes: its next connection is refused with the reason, while a client
/// from another address (here the loopback one) is served, and a session that
/// ends makes room again.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn o_one_address_holds_at_most_its_share_of_sessions() {
    const CAP: usize = 2;
    let (server, log, delivered) = checksum_server(Config {
        max_sessions_per_address: CAP,
        ..Config::default()
    });
    let port = server.bind(("0.0.0.0", 0)).unwrap().port();
    let ip: std::net::IpAddr = server_ip().parse().unwrap();
    let here = SocketAddr::new(ip, port);
    let loopback = SocketAddr::from(([127, 0, 0, 1], port));
    let client = Transport::new(Config::default());
    let mut held: Vec<_> = (0..CAP).map(|_| client.connect(here).unwrap()).collect();
    // A silent connection from the same address: refused at once, not held.
    let mut third = TcpStream::connect(here).unwrap();
    let sent = closed_by_server(&mut third, Duration::from_secs(5), "over the cap");
    assert!(sent.is_empty(), "the server wrote to a refused connection");
    let line = wait_line(&log, &third.local_addr().unwrap());
    // At least CAP (a session whose handshake just ended may count twice for a
    // moment, as a session and as a handshake).
    let counted: usize = line
        .split("refused: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        counted >= CAP
            && line.contains(&format!("sessions and handshakes from {ip}"))
            && line.contains("Config::max_sessions_per_address"),
        "{line}"
    );
    assert!(
        client.connect(here).is_err(),
        "a third session from one address"
    );
    // Another address is served.
    let other = client
        .connect(loopback)
        .expect("a client from another address");
    let msg = Message::new(vec![5u8; 100]).with_meta(&[1; 8]).unwrap();
    client.send(&other, msg, Linger::Block).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.load(Ordering::SeqCst) < 1 {
        assert!(
            Instant::now() < deadline,
            "the other address was not served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A session that ends makes room for its address.
    client.disconnect(held.pop().unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match client.connect(here) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "no room after a disconnect: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for s in held.into_iter().chain([other, again]) {
        client.disconnect(s).unwrap();
    }
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// The first log line about a connection from `local`, waiting up to 5 s for it.
fn wait_line(log: &Mutex<Vec<String>>, local: &SocketAddr) -> String {
    wait_lines(log, std::slice::from_ref(local), Duration::from_secs(5));
    line_about(&log.lock(), *local).unwrap()
}

/// How a summary line of session lines not logged one by one ends.
const SESSION_SUMMARY_END: &str =
    " more lines about sessions within a second, not logged one by one (at most 20 lines \
     a second: Config::log_lines_per_second)";

/// The lines not logged one by one, as the summary lines of `log` ending in `end`
/// count them ("N more ... within a second, ...").
fn held_in_summaries(log: &[String], end: &str) -> usize {
    log.iter()
        .filter_map(|l| l.strip_suffix(end))
        .map(|l| l.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum()
}

/// How a summary line of refusals not logged one by one ends.
const SUMMARY_END: &str =
    " more connections refused within a second, not logged one by one (at most 20 lines a \
     second: Config::log_lines_per_second)";

/// A session that has just connected, whose waits do not spin (`busy_poll` 0),
/// is woken by its completions: round trips take about a millisecond each in the
/// guest. (The poller used to read the event of a session that joined after its
/// last look without clearing the session's mark of being armed, so its queue was
/// never armed again and only the poller's sweeps, every 50 ms, reaped it; the
/// wait for the greeting made that the case of nearly every such session.)
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn m_a_session_that_just_connected_is_woken_by_its_completions() {
    const ROUND_TRIPS: u64 = 40;
    let (server, _log, delivered) = checksum_server(Config::default());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        busy_poll: Duration::ZERO,
        ..Config::default()
    });
    let s = client.connect(addr).unwrap();
    let mut times: Vec<Duration> = (0..ROUND_TRIPS)
        .map(|i| {
            let start = Instant::now();
            let msg = Message::new(vec![i as u8; 64])
                .with_meta(&i.to_be_bytes())
                .unwrap();
            client.send(&s, msg, Linger::NoWait).unwrap();
            let reply = client
                .recv(&s, Linger::Timeout(Duration::from_secs(5)))
                .unwrap()
                .expect("the echo");
            assert_eq!(reply.meta()[..8], i.to_be_bytes(), "echo {i}");
            start.elapsed()
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    eprintln!("{ROUND_TRIPS} round trips right after connect, not spinning: median {median:?}");
    // Reaped only by sweeps, nearly every one waits for one (up to 50 ms; 45 ms
    // typical in the guest): the median tells, whatever a few slow ones do.
    assert!(
        median < Duration::from_millis(10),
        "round trips took {median:?} (median): the session's completions woke no one"
    );
    assert_eq!(delivered.load(Ordering::SeqCst), ROUND_TRIPS as usize);
    client.disconnect(s).unwrap();
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// A server whose queue pair never takes anything (it posts no receive, so every
/// SEND is refused as not ready, and retried for ever): `connect` fails once
/// `timeout` has passed, with the reason, instead of returning a session whose
/// sends would wait for ever.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn l_connect_fails_when_the_servers_queue_pair_never_answers() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let listener = TcpListener::bind((server_ip().as_str(), 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut header = [0u8; HELLO_HEADER_LEN];
        tcp.read_exact(&mut header).expect("the client's hello");
        let mut body = vec![0u8; Hello::decode_header(&header).unwrap()];
        tcp.read_exact(&mut body).unwrap();
        let theirs = Hello::decode_body(&body).unwrap();
        let silent = NeverReady::queue_pair();
        tcp.write_all(&silent.hello.encode()).unwrap();
        let mut ready = [0u8; 1];
        tcp.read_exact(&mut ready).expect("the client's ready byte");
        let silent = silent.receiving_nothing(&theirs);
        tcp.write_all(b"R").unwrap();
        // Until the client gives up and closes its bootstrap connection.
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        drop(silent);
    });
    let client = Transport::new(Config {
        timeout: TIMEOUT,
        ..Config::default()
    });
    let start = Instant::now();
    match client.connect(addr) {
        Err(Error::Closed(CloseReason::Silent { after })) => assert_eq!(after, TIMEOUT),
        Err(e) => panic!("connect failed for another reason: {e}"),
        Ok(_) => panic!("connect returned a session whose server never answered"),
    }
    let took = start.elapsed();
    assert!(
        took >= TIMEOUT && took < TIMEOUT + Duration::from_secs(3),
        "connect gave up after {took:?}"
    );
    fake.join()
        .expect("the client closed its bootstrap connection");
    wait_no_sessions(&client);
}

/// Four threads open `idle` connections in all, as fast as they can, and keep them
/// open, while four well-behaved clients send (retrying while refused). Returns the
/// idle connections with the time each was opened, and the clients' refusals.
fn idle_connections_beside_good_clients(
    addr: SocketAddr,
    idle: usize,
) -> (Vec<(TcpStream, Instant)>, usize) {
    std::thread::scope(|s| {
        let openers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(move || {
                    (0..idle / 4)
                        .map(|_| {
                            let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                                .expect("connect");
                            (tcp, Instant::now())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let clients: Vec<_> = (0..4)
            .map(|c| {
                s.spawn(move || {
                    good_client(addr, 200 + c, 3, 10, 64 * KIB, Duration::from_secs(30))
                })
            })
            .collect();
        let idle: Vec<_> = openers
            .into_iter()
            .flat_map(|o| o.join().unwrap())
            .collect();
        let refused: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
        (idle, refused)
    })
}

/// How many idle connections the log says were refused ("in progress": the
/// `max_handshakes` limit), cut ("cut": too slow on the hello header) or cut for a
/// newer connection ("gave way": silent past the grace with every place taken);
/// any other reason fails the test.
fn idle_reasons(
    log: &[String],
    locals: &[SocketAddr],
    max_handshakes: usize,
) -> HashMap<&'static str, usize> {
    let mut reasons: HashMap<&str, usize> = HashMap::new();
    for local in locals {
        let line = line_about(log, *local).unwrap();
        let reason = if line.contains(&format!("refused: {max_handshakes} handshakes in progress"))
        {
            "in progress"
        } else if line.contains("the peer was too slow") && line.contains("hello header") {
            "cut"
        } else if line.contains("no hello within") && line.contains("went to a newer connection") {
            "gave way"
        } else {
            panic!("unexpected reason: {line}");
        };
        *reasons.entry(reason).or_default() += 1;
    }
    reasons
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_message_over_the_peers_limit_fails_locally_and_the_session_lives() {
    let (server, _log, delivered) = checksum_server(Config {
        max_message: 64 * KIB as u64,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    match client.send(&s, vec![1u8; 64 * KIB + 1], Linger::Block) {
        Err(Error::Usage(text)) => assert!(text.contains("65536"), "{text}"),
        other => panic!("a message over the server's limit: {:?}", other.map(|_| ())),
    }
    assert!(
        s.closed().is_none(),
        "the session was closed: {:?}",
        s.closed()
    );
    let bytes = vec![2u8; 64 * KIB];
    let msg = Message::new(bytes.clone())
        .with_meta(&0u64.to_be_bytes())
        .unwrap();
    client.send(&s, msg, Linger::Block).unwrap();
    let reply = client
        .recv(&s, Linger::Timeout(Duration::from_secs(10)))
        .unwrap()
        .expect("a reply");
    assert_eq!(reply.meta()[8..16], checksum(&bytes).to_be_bytes());
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}

/// Whether `tcp` is still open with nothing to read (the server neither wrote to
/// nor closed it).
fn still_open(tcp: &mut TcpStream) -> bool {
    tcp.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let open = matches!(tcp.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    tcp.set_nonblocking(false).unwrap();
    open
}

/// Every handshake place is held. By clients that sent their hello: a newcomer is
/// refused, however long they have held them. By connections that said nothing
/// for longer than the grace (a quarter of `timeout`): a client that speaks takes
/// the oldest one's place and is served at once, that connection is closed
/// without a byte and logged with the reason, and the others keep theirs.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn j_a_silent_connection_gives_its_place_to_a_client_that_speaks() {
    // The grace is a quarter of it, 4 s; the silent connections that stay are cut
    // at 16 s, long after the client that spoke is done.
    const TIMEOUT: Duration = Duration::from_secs(16);
    const PAST_GRACE: Duration = Duration::from_millis(4500);
    const PLACES: usize = 4;
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        max_handshakes: PLACES,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let in_progress = |log: &Mutex<Vec<String>>| {
        let needle = format!("refused: {PLACES} handshakes in progress");
        log.lock().iter().filter(|l| l.contains(&needle)).count()
    };

    // 1. Clients that sent their hello keep their places past the grace.
    let mut never: Vec<NeverReady> = (0..PLACES).map(|_| NeverReady::connect(addr)).collect();
    std::thread::sleep(PAST_GRACE);
    let client = Transport::new(Config {
        timeout: Duration::from_secs(5),
        ..Config::default()
    });
    let refused = client.connect(addr);
    assert!(
        refused.is_err(),
        "a place was given up by a client that spoke"
    );
    assert_eq!(in_progress(&log), 1, "{:?}", log.lock());
    for n in &mut never {
        assert!(
            still_open(&mut n.tcp),
            "a client that sent its hello was cut"
        );
    }
    let locals: Vec<SocketAddr> = never.iter().map(|n| n.tcp.local_addr().unwrap()).collect();
    drop(never);
    wait_lines(&log, &locals, Duration::from_secs(5));

    // 2. Silent connections, the oldest first, give way to a client that speaks.
    let mut silent: Vec<TcpStream> = (0..PLACES)
        .map(|_| {
            let tcp = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            tcp
        })
        .collect();
    std::thread::sleep(PAST_GRACE);
    let refused = good_client(addr, 300, 1, 10, 64 * KIB, Duration::from_secs(1));
    assert_eq!(refused, 0, "the client that spoke was refused");
    assert_eq!(delivered.load(Ordering::SeqCst), 10);
    let oldest = silent[0].local_addr().unwrap();
    let sent = closed_by_server(&mut silent[0], Duration::from_secs(2), "the oldest silent");
    assert!(
        sent.is_empty(),
        "the server wrote to a client that said nothing"
    );
    wait_lines(&log, &[oldest], Duration::from_secs(2));
    let line = line_about(&log.lock(), oldest).unwrap();
    assert!(
        line.contains("no hello within 4s") && line.contains("went to a newer connection"),
        "{line}"
    );
    for tcp in &mut silent[1..] {
        assert!(still_open(tcp), "a younger silent connection was cut");
    }
    assert_eq!(in_progress(&log), 1, "{:?}", log.lock());
    drop(silent);
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn max_sessions_refuses_the_next_client_with_the_reason() {
    let (server, log, _) = checksum_server(Config {
        max_sessions: 2,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let a = client.connect(addr).unwrap();
    let b = client.connect(addr).unwrap();
    assert!(
        client.connect(addr).is_err(),
        "a third session was accepted"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log
        .lock()
        .iter()
        .any(|l| l.contains("refused: max_sessions (2) reached"))
    {
        assert!(Instant::now() < deadline, "{:?}", log.lock());
        std::thread::sleep(Duration::from_millis(20));
    }
    // A session that ends makes room.
    client.disconnect(a).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match client.connect(addr) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no room after a disconnect: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The cap holds on the connecting side too.
    let capped = Transport::new(Config {
        max_sessions: 1,
        ..Config::default()
    });
    let only = capped.connect(addr);
    assert!(only.is_err(), "the server had room for a third session");
    client.disconnect(b).unwrap();
    client.disconnect(c).unwrap();
    wait_no_sessions(&server);
    let first = capped.connect(addr).unwrap();
    match capped.connect(addr) {
        Err(Error::Usage(text)) => assert!(text.contains("max_sessions (1) reached"), "{text}"),
        other => panic!(
            "a second session past max_sessions 1: {:?}",
            other.map(|_| ())
        ),
    }
    capped.disconnect(first).unwrap();
    server.unbind().unwrap();
}
