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
//!
//! Where they are: the shared server, clients and peers here; the tests in
//! `handshakes`, `idle`, `log_rates` and `sessions`.

#[path = "../support/mod.rs"]
mod support;

mod handshakes;
mod idle;
mod log_rates;
mod sessions;

use kiara_ib::message::checksum;
use kiara_ib::protocol::{Hello, HELLO_HEADER_LEN};
use kiara_ib::{CloseReason, Config, Error, Linger, Message, Transport};
use parking_lot::Mutex;
use rdma_safe::{CompletionQueue, QueuePair, RtrAttr};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{held_in_summaries, server_ip, some_hello, Device, SESSION_SUMMARY_END};

const KIB: usize = 1 << 10;

const MIB: usize = 1 << 20;

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
        let dev = Device::open();
        let (gid, gid_index) = (dev.gid, dev.gid_index);
        let (cq, qp) = dev.rc_qp_in_init();
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
