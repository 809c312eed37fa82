//! Hostile-peer device tests of the KIARA transport (issue 13, parts 6 and 7g), run
//! in the Soft-RoCE guest by `cargo xtask test`.
//!
//! Each test runs one KIARA server (a [`Transport`] with a callback, [`Server`])
//! that serves several well-behaved clients ([`GoodClients`], ordinary kiara
//! clients echoing checksummed messages of every size class but one) while an
//! attacker works on it. The attacker ([`RawPeer`]) is built on rdma-safe alone: it
//! speaks the real bootstrap (hello each way, RTR/RTS, the ready byte) and the
//! control messages of `docs/kiara-protocol.md`, and posts whatever RDMA READs it
//! likes on its own queue pair.
//!
//! What every test asserts, whatever the attack:
//! - every access beyond what a DATA descriptor grants fails at the attacker: its
//!   READ completes with a remote error, nothing lands in its buffer, and its queue
//!   pair goes to the error state;
//! - a planted secret (64 KiB of a distinctive pattern that a good client sent to
//!   the server, which keeps it) and the bytes around the messages the server sends
//!   from a registered region never appear in anything the attacker received;
//! - the server logs why it closed the attacker's session (its log hook);
//! - every good client's message arrives intact, both ways (checksums compared with
//!   [`kiara_ib::message::checksum`]), during the attack and after it.
//!
//! Every attack is preceded by a positive control on the same queue pair: the READ
//! a descriptor does grant succeeds and returns the announced bytes, so a refusal
//! is the server's doing, not a broken attacker.
//!
//! The attacks: (a) reading a message again after acknowledging it; (b) reading
//! outside the announced bytes; (c) using the address and key announced to another
//! session; (d) sweeping keys near the attacker's own for the planted secret; (e)
//! malformed, truncated, oversize and out-of-order control messages (and hellos);
//! (g) never acknowledging: the server's pinned memory stays under
//! `max_outstanding_bytes` and the session closes after `ack_timeout`; (h) the
//! same kinds of attack on a server whose sessions share one receive queue: no
//! slot of it is lost, and a peer holds no more of them than its credits, even
//! before its session starts; (i) sending past its credits while the server's
//! application takes nothing: the session closes at the first message beyond
//! them, and no more than the credits' worth waits for the application; (o) a
//! memlock limit below the budgets: a message no buffer can be registered for
//! is refused as busy, and no session closes; (p) a peer that grants credits
//! and posts no receives: the session closes after `ack_timeout`.
//!
//! Where they are: the server, the good clients and the patterns here; the
//! attacker in `raw_peer`; the attacks in `reads` (a-d), `malformed` (e),
//! `shared_queue` (h), `budgets` (i, j, k, m), `deadlines` (g, l, n, p) and
//! `memlock` (o).

#[path = "../support/mod.rs"]
mod support;

mod budgets;
mod deadlines;
mod malformed;
mod memlock;
mod raw_peer;
mod reads;
mod shared_queue;

use raw_peer::*;

use kiara_ib::message::checksum;
use kiara_ib::protocol::{Control, Hello, Kind, Limits, CONTROL_HEADER_LEN, HELLO_HEADER_LEN};
use kiara_ib::{Config, Linger, Message, SendHandle, Session, Transport};
use parking_lot::{Condvar, Mutex};
use rdma_safe::lease::{Lease, LeasedQp, SendOp};
use rdma_safe::sys::{ibv_qp_state, ibv_wc_status};
use rdma_safe::{
    Access, CompletionChannel, CompletionQueue, InitAttr, MemoryRegion, QpConfig, QueuePair,
    RemoteSlice, RtrAttr, RtsAttr, WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::{server_ip, Device};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// How long any single step may take before the test gives up (generous: the guest
/// shares two cores with other work).
const STEP: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------
// Patterns: what must never leak, and what may be read.
// ---------------------------------------------------------------------------------

/// Marks every 16-byte block of the planted secret.
const SECRET_MAGIC: [u8; 8] = [0x5e, 0xc7, 0x3e, 0x7a, 0xfe, 0xed, 0xc0, 0xde];
/// Marks every 16-byte block of the registered region around the messages the
/// server sends from it (bytes no descriptor ever announces).
const NEIGHBOUR_MAGIC: [u8; 8] = [0x4e, 0x31, 0x9b, 0x0b, 0x0a, 0xce, 0xfa, 0x11];
/// Size of the planted secret: a read (DATA) message, of the pool's 64 KiB class.
const SECRET_LEN: usize = 64 * KIB;

/// `len` bytes of 16-byte blocks: `magic`, then the block's index.
fn marked(magic: [u8; 8], len: usize) -> Vec<u8> {
    (0..len.div_ceil(16))
        .flat_map(|i| magic.into_iter().chain((i as u64).to_be_bytes()))
        .take(len)
        .collect()
}

/// The planted secret.
fn secret() -> Vec<u8> {
    marked(SECRET_MAGIC, SECRET_LEN)
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `len` pseudo-random bytes from `seed` (never containing either magic).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Longest bait message.
const BAIT_MAX: usize = MIB;

/// The bytes of a bait message of `len` bytes (at most [`BAIT_MAX`]), whichever way
/// the server sends it: a prefix of one pseudo-random sequence, computed once.
fn bait(len: usize) -> Vec<u8> {
    static BAIT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BAIT.get_or_init(|| noise(0xba17, BAIT_MAX))[..len].to_vec()
}

// ---------------------------------------------------------------------------------
// The server's log, waited on through a condition variable.
// ---------------------------------------------------------------------------------

/// Every line the server logged.
#[derive(Default)]
struct Log {
    lines: Mutex<Vec<String>>,
    cond: Condvar,
}

impl Log {
    /// The transport's logging hook, filling this log.
    fn sink(self: &Arc<Self>) -> Arc<dyn Fn(&str) + Send + Sync> {
        let log = self.clone();
        Arc::new(move |line: &str| {
            log.lines.lock().push(line.to_string());
            log.cond.notify_all();
        })
    }

    /// The first line for which `pred` holds, waiting up to [`STEP`] for it.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + STEP;
        let mut lines = self.lines.lock();
        loop {
            if let Some(l) = lines.iter().find(|l| pred(l)) {
                return l.clone();
            }
            if self.cond.wait_until(&mut lines, deadline).timed_out() {
                panic!("the server logged no line {what} within {STEP:?}: {lines:#?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The server under attack.
// ---------------------------------------------------------------------------------

/// Size of the server's registered region; bait sent from it starts at
/// [`REGION_BAIT`], and everything around the bait is marked with
/// [`NEIGHBOUR_MAGIC`].
const REGION_LEN: usize = 3 * 64 * KIB;
/// Offset of the bait in the registered region.
const REGION_BAIT: usize = 64 * KIB;

/// How the server sends a bait message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Copied into a pooled buffer (the common path).
    Pooled = 0,
    /// Zero-copy from a slice of a registered region (`Message::from_region`): the
    /// bytes before and after the message are the region's, marked as neighbours.
    Region = 1,
    /// Zero-copy from a region of exactly the message's length, registered for it
    /// (`Transport::register`): nothing of the region lies outside the message.
    WholeRegion = 2,
}

/// What the server's callback shares with the test.
struct ServerState {
    /// The registered region bait is sent from in [`Mode::Region`].
    region: Arc<MemoryRegion>,
    /// The outcome of each bait reply's `send`, by the requester's tag.
    gives: Mutex<HashMap<u64, Result<SendHandle, String>>>,
    gives_cond: Condvar,
    /// The planted secrets, kept (their buffers stay allocated).
    kept: Mutex<Vec<Message>>,
    /// Replies to good clients that could not be sent.
    errors: Mutex<Vec<String>>,
}

/// A KIARA server whose callback answers three requests, told apart by the first
/// four bytes of the metadata:
/// - `ECHO` + sequence (8): the same bytes back, with the checksum it computed;
/// - `KEEP`: the message is kept (the planted secret); `KEPT` + checksum back;
/// - `DROP`: the message is dropped (its buffer back in the pool); `KEPT` + checksum;
/// - `GIVE` + mode (1) + length (4) + tag (8): a bait message of that length
///   (`BAIT` + tag as metadata), pooled or from the registered region.
struct Server {
    transport: Transport,
    addr: SocketAddr,
    log: Arc<Log>,
    state: Arc<ServerState>,
}

impl Server {
    /// Starts a server with `config` on the guest's address, logging every line
    /// (the tests check each session's reason; `Config::log_lines_per_second`).
    fn start(config: Config) -> Server {
        let config = Config {
            log_lines_per_second: 0,
            ..config
        };
        let log = Arc::new(Log::default());
        let transport = Transport::with_logger(config, log.sink());
        let mut region = transport.register(REGION_LEN).expect("register the region");
        {
            let bytes = region.as_mut_slice().expect("a region no peer can write");
            bytes.copy_from_slice(&marked(NEIGHBOUR_MAGIC, REGION_LEN));
            bytes[REGION_BAIT..2 * REGION_BAIT].copy_from_slice(&bait(64 * KIB));
        }
        let state = Arc::new(ServerState {
            region: Arc::new(region),
            gives: Mutex::new(HashMap::new()),
            gives_cond: Condvar::new(),
            kept: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
        });
        let shared = state.clone();
        transport
            .register_callback(move |msg, session, t| serve(&shared, msg, session, t))
            .unwrap();
        let addr = transport.bind((server_ip().as_str(), 0)).unwrap();
        Server {
            transport,
            addr,
            log,
            state,
        }
    }

    /// The outcome of the bait reply tagged `tag`, waiting for the callback to send it.
    fn give(&self, tag: u64) -> Result<SendHandle, String> {
        let deadline = Instant::now() + STEP;
        let mut gives = self.state.gives.lock();
        loop {
            if let Some(r) = gives.remove(&tag) {
                return r;
            }
            if self
                .state
                .gives_cond
                .wait_until(&mut gives, deadline)
                .timed_out()
            {
                panic!("the server never answered bait request {tag}");
            }
        }
    }

    /// Waits until the server's send of bait `tag` finished: the peer acknowledged it
    /// and the server is done with it (on the fixed transport: its window invalidated
    /// and its buffer back in the pool).
    fn wait_bait_done(&self, tag: u64) {
        let handle = self.give(tag).expect("the bait reply was sent");
        handle
            .wait(Some(STEP))
            .expect("the server's send of the bait finished after the ACK");
    }

    /// The line the server logged when it closed the session of the peer whose
    /// bootstrap socket is `peer`; asserts that it names `reason`.
    fn closed(&self, peer: SocketAddr, reason: &str) -> String {
        let tag = format!("({peer})");
        let line = self
            .log
            .wait_for(&format!("closing the session of {peer}"), |l| {
                l.contains(&tag) && (l.contains(" closed: ") || l.contains(" ended: "))
            });
        assert!(
            line.contains(reason),
            "the server closed the session of {peer}, but not for {reason:?}: {line}"
        );
        line
    }

    /// Plants the secret: a good client sends it (64 KiB, a read message) with
    /// `verb` (`KEEP`: the server keeps it; `DROP`: the server drops it before it
    /// answers). Returns the client and its session, to disconnect at the end.
    fn plant_secret(&self, verb: &[u8; 4]) -> (Transport, Session) {
        let client = Transport::new(Config::default());
        let s = client
            .connect(self.addr)
            .expect("the secret's client connects");
        let msg = Message::new(secret()).with_meta(verb).unwrap();
        client
            .send(&s, msg, Linger::Timeout(STEP))
            .expect("secret sent");
        let reply = client
            .recv(&s, Linger::Timeout(STEP))
            .expect("recv")
            .expect("the server confirms the secret");
        assert_eq!(reply.meta()[..4], *b"KEPT");
        assert_eq!(
            reply.meta()[4..12],
            checksum(&secret()).to_be_bytes(),
            "the secret arrived intact"
        );
        (client, s)
    }

    /// Checks that the server kept the secrets intact and answered every good client,
    /// then shuts it down.
    fn finish(self) {
        for kept in self.state.kept.lock().iter() {
            assert_eq!(
                checksum(kept.bytes()),
                checksum(&secret()),
                "secret kept intact"
            );
        }
        let errors = self.state.errors.lock().clone();
        assert!(errors.is_empty(), "the server failed to reply: {errors:?}");
        self.transport.unbind().unwrap();
    }
}

/// The server's callback (see [`Server`]).
fn serve(state: &ServerState, msg: Message, session: &Session, t: &Transport) {
    let meta = msg.meta().to_vec();
    match meta.get(..4) {
        Some(b"ECHO") if meta.len() >= 12 => {
            let mut m = meta[..12].to_vec();
            m.extend_from_slice(&checksum(msg.bytes()).to_be_bytes());
            let reply = Message::new(msg.bytes().to_vec()).with_meta(&m).unwrap();
            if let Err(e) = t.send(session, reply, Linger::NoWait) {
                state
                    .errors
                    .lock()
                    .push(format!("echo to session {}: {e}", session.id()));
            }
        }
        Some(verb @ (b"KEEP" | b"DROP")) => {
            let mut m = b"KEPT".to_vec();
            m.extend_from_slice(&checksum(msg.bytes()).to_be_bytes());
            if verb == b"KEEP" {
                state.kept.lock().push(msg);
            } else {
                // Back to the pool before the answer can lead to anything else.
                drop(msg);
            }
            let reply = Message::new(Vec::new()).with_meta(&m).unwrap();
            if let Err(e) = t.send(session, reply, Linger::NoWait) {
                state
                    .errors
                    .lock()
                    .push(format!("KEPT to session {}: {e}", session.id()));
            }
        }
        Some(b"GIVE") if meta.len() >= 17 => {
            let len = u32::from_be_bytes(meta[5..9].try_into().unwrap()) as usize;
            let tag = u64::from_be_bytes(meta[9..17].try_into().unwrap());
            let mut m = b"BAIT".to_vec();
            m.extend_from_slice(&tag.to_be_bytes());
            let reply = if meta[4] == Mode::Region as u8 {
                Message::from_region(state.region.clone(), REGION_BAIT..REGION_BAIT + len)
            } else if meta[4] == Mode::WholeRegion as u8 {
                t.register(len).and_then(|mut mr| {
                    mr.write_at(0, &bait(len))?;
                    Message::from_region(Arc::new(mr), 0..len)
                })
            } else {
                Ok(Message::new(bait(len)))
            };
            let sent = reply
                .and_then(|r| r.with_meta(&m))
                .and_then(|r| t.send(session, r, Linger::NoWait))
                .map_err(|e| e.to_string());
            state.gives.lock().insert(tag, sent);
            state.gives_cond.notify_all();
        }
        _ => state
            .errors
            .lock()
            .push(format!("unexpected message with metadata {meta:02x?}")),
    }
}

// ---------------------------------------------------------------------------------
// Good clients: ordinary kiara clients, checked end to end.
// ---------------------------------------------------------------------------------

/// Sizes the good clients send, eager and read, of every pool class up to 1 MiB
/// except 64 KiB (the class of the secret and of the bait that (d) recycles, so that
/// the good clients' traffic does not decide which buffer the secret lands in).
const GOOD_SIZES: [usize; 10] = [
    0, 1, 100, 4000, 4096, 4097, 20_000, 100_000, 300_000, 1_000_000,
];

/// Round trips each good client makes at least, after the attack started.
const GOOD_MIN_ROUNDS: usize = 3;

/// Good clients that echo checksummed messages through the server until stopped.
struct GoodClients {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<usize>>,
}

impl GoodClients {
    /// Starts `n` clients of `server`; returns once each has made a round trip of
    /// every size (so the pools of every class it uses are warm on both sides).
    fn start(server: SocketAddr, n: usize) -> GoodClients {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(Barrier::new(n + 1));
        let client = Transport::new(Config::default());
        let threads = (0..n)
            .map(|c| {
                let (stop, started, client) = (stop.clone(), started.clone(), client.clone());
                std::thread::spawn(move || good_client(&client, server, c, &stop, &started))
            })
            .collect();
        started.wait();
        GoodClients { stop, threads }
    }

    /// Stops the clients (each first makes [`GOOD_MIN_ROUNDS`] round trips) and
    /// returns how many messages came back intact.
    fn finish(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let mut total = 0;
        for (c, t) in self.threads.into_iter().enumerate() {
            match t.join() {
                Ok(n) => total += n,
                Err(e) => std::panic::resume_unwind(Box::new(format!(
                    "good client {c} failed: {}",
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                ))),
            }
        }
        total
    }
}

/// One good client: sends message after message, each checked when echoed.
fn good_client(
    client: &Transport,
    server: SocketAddr,
    c: usize,
    stop: &AtomicBool,
    started: &Barrier,
) -> usize {
    let s = client.connect(server).expect("a good client connects");
    let mut seq = 0u64;
    let mut after_start = 0;
    loop {
        let len = GOOD_SIZES[(seq as usize + c) % GOOD_SIZES.len()];
        let payload = noise((c as u64) << 32 | seq, len);
        let sum = checksum(&payload);
        let mut meta = b"ECHO".to_vec();
        meta.extend_from_slice(&seq.to_be_bytes());
        let msg = Message::new(payload).with_meta(&meta).unwrap();
        client
            .send(&s, msg, Linger::Timeout(STEP))
            .unwrap_or_else(|e| panic!("good client {c}: message {seq} not sent: {e}"));
        let reply = client
            .recv(&s, Linger::Timeout(STEP))
            .unwrap_or_else(|e| panic!("good client {c}: no echo of {seq}: {e}"))
            .unwrap_or_else(|| panic!("good client {c}: no echo of {seq} within {STEP:?}"));
        assert_eq!(
            reply.meta()[..12],
            meta[..],
            "good client {c}: echo out of order"
        );
        assert_eq!(
            reply.meta()[12..20],
            sum.to_be_bytes(),
            "good client {c}: message {seq} ({len} bytes) corrupted on the way in"
        );
        assert_eq!(reply.len(), len, "good client {c}: echo {seq} length");
        assert_eq!(
            checksum(reply.bytes()),
            sum,
            "good client {c}: echo {seq} ({len} bytes) corrupted on the way back"
        );
        seq += 1;
        if seq == GOOD_SIZES.len() as u64 {
            started.wait();
        } else {
            after_start += 1;
        }
        if stop.load(Ordering::SeqCst) && after_start >= GOOD_MIN_ROUNDS {
            break;
        }
    }
    client.disconnect(s).unwrap();
    seq as usize
}

/// Pages of memory the kernel holds pinned for this process (`VmPin`), in bytes:
/// every registered region.
fn pinned_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmPin:"))
        .expect("VmPin in /proc/self/status");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a number of kB");
    kb * 1024
}
