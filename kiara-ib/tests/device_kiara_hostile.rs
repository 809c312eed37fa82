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
//! them, and no more than the credits' worth waits for the application.

use kiara_ib::message::checksum;
use kiara_ib::protocol::{Control, Hello, Kind, Limits, CONTROL_HEADER_LEN, HELLO_HEADER_LEN};
use kiara_ib::{Config, Linger, Message, SendHandle, Session, Transport};
use parking_lot::{Condvar, Mutex};
use rdma_safe::lease::{Lease, LeasedQp, SendOp};
use rdma_safe::sys::{ibv_qp_state, ibv_wc_status};
use rdma_safe::{
    Access, CompletionChannel, CompletionQueue, Context, Gid, InitAttr, MemoryRegion,
    ProtectionDomain, QpConfig, QueuePair, RemoteSlice, RtrAttr, RtsAttr, WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// How long any single step may take before the test gives up (generous: the guest
/// shares two cores with other work).
const STEP: Duration = Duration::from_secs(60);

/// The server's address in the guest.
fn server_ip() -> String {
    std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

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

// ---------------------------------------------------------------------------------
// The attacker: a raw KIARA peer on rdma-safe.
// ---------------------------------------------------------------------------------

/// Receive slots the attacker posts (its credits in the hello).
const RAW_CREDITS: u32 = 8;
/// Bytes per receive slot: header, metadata and a 4096-byte eager payload.
const RAW_SLOT: usize = CONTROL_HEADER_LEN + 64 + 4096;
/// The attacker's eager threshold and largest message, as its hello says.
const RAW_LIMITS: Limits = Limits {
    max_message: 16 << 20,
    eager_threshold: 4096,
};

/// Tags of the attacker's work requests (its own `wr_id`s in the lease).
const WR_RECV: u64 = 1 << 40;
const WR_SEND: u64 = 2 << 40;
const WR_READ: u64 = 3 << 40;

/// The device objects all attacker sessions share: one context and protection
/// domain, as one attacking process would have.
struct Device {
    ctx: Arc<Context>,
    pd: Arc<ProtectionDomain>,
    gid: Gid,
    gid_index: u32,
}

impl Device {
    fn open() -> Arc<Device> {
        let ctx = Context::open(std::env::var("RDMA_DEVICE").ok().as_deref()).unwrap();
        let gid_index = std::env::var("RDMA_GID_INDEX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| ctx.default_gid_index(1).unwrap());
        let gid = ctx.query_gid(1, gid_index).unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        Arc::new(Device {
            ctx,
            pd,
            gid,
            gid_index,
        })
    }
}

/// A control message the server sent the attacker.
#[derive(Debug)]
struct Received {
    kind: Kind,
    header: Control,
    meta: Vec<u8>,
}

/// A DATA descriptor the server announced: what it grants to read.
#[derive(Clone, Copy, Debug)]
struct Descriptor {
    msg_id: u64,
    addr: u64,
    len: u64,
    rkey: u32,
}

impl Descriptor {
    /// Exactly the announced bytes.
    fn remote(&self) -> RemoteSlice {
        RemoteSlice {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }
}

/// What one READ of the attacker got: its completion status and the bytes of its
/// target buffer afterwards (all zero unless something was written).
struct ReadOutcome {
    status: ibv_wc_status,
    bytes: Vec<u8>,
}

/// An attacker's session: a raw RC queue pair connected to a kiara server through the
/// real handshake, speaking the control protocol by hand.
struct RawPeer {
    dev: Arc<Device>,
    tcp: TcpStream,
    conn: LeasedQp,
    cq: Arc<CompletionQueue>,
    /// Send buffers not in use.
    spare: Vec<MemoryRegion>,
    /// Control messages received and not yet looked at.
    inbox: VecDeque<Received>,
    /// Finished sends and READs, by our work request id: status and buffer.
    done: HashMap<u64, (ibv_wc_status, Lease)>,
    next_wr: u64,
    /// Our next message id.
    next_id: u64,
    /// Credits we owe the server (slots reposted since our last control message).
    owed: u32,
    /// SENDs the server's posted receives allow.
    credits: u32,
    /// The highest message id the server sent us.
    seen: u64,
    /// The last message of the server's that we acknowledged.
    last_acked: u64,
    /// The status of the first failed receive (the queue pair is in error then).
    failed: Option<ibv_wc_status>,
}

impl RawPeer {
    /// Connects to `server` through the full handshake.
    fn connect(dev: &Arc<Device>, server: SocketAddr) -> RawPeer {
        RawPeer::try_connect(dev, server, |_| {})
            .unwrap_or_else(|me| panic!("the server refused the handshake of {me}"))
    }

    /// Connects; `tweak` may spoil the hello. If the server refused it: our end of
    /// the bootstrap connection, which the server's log names. Greets the server
    /// over RDMA, as a KIARA client does (protocol version 5).
    fn try_connect(
        dev: &Arc<Device>,
        server: SocketAddr,
        tweak: impl FnOnce(&mut [u8]),
    ) -> Result<RawPeer, SocketAddr> {
        let mut peer = RawPeer::handshake(dev, server, tweak, |_| {})?;
        peer.send_control(Kind::Credit, Control::default(), &[], &[]);
        Ok(peer)
    }

    /// [`RawPeer::try_connect`], running `before_ready` once our queue pair is ready
    /// to send and before we send the ready byte (it may send, and spoil the ready
    /// byte by writing one of its own first).
    fn handshake(
        dev: &Arc<Device>,
        server: SocketAddr,
        tweak: impl FnOnce(&mut [u8]),
        before_ready: impl FnOnce(&mut RawPeer),
    ) -> Result<RawPeer, SocketAddr> {
        let channel = CompletionChannel::new(&dev.ctx).unwrap();
        let cq = CompletionQueue::with_channel(&dev.ctx, 256, &channel, 0).unwrap();
        let qp = QueuePair::new(&dev.pd, &QpConfig::rc(&cq))
            .unwrap()
            .to_init(&InitAttr::default())
            .unwrap();
        let mut tcp = TcpStream::connect(server).unwrap();
        tcp.set_read_timeout(Some(STEP)).unwrap();
        let me = tcp.local_addr().unwrap();
        let mut hello = Hello {
            qpn: qp.qp_num(),
            psn: 7,
            lid: 0,
            mtu: 3,
            gid: Some(dev.gid.0),
            credits: RAW_CREDITS,
            slot_size: RAW_SLOT as u32,
            max_message: RAW_LIMITS.max_message,
            eager_threshold: RAW_LIMITS.eager_threshold,
        }
        .encode();
        tweak(&mut hello);
        tcp.write_all(&hello).unwrap();
        let mut header = [0u8; HELLO_HEADER_LEN];
        tcp.read_exact(&mut header).map_err(|_| me)?;
        let len = Hello::decode_header(&header).unwrap();
        let mut body = vec![0u8; len];
        tcp.read_exact(&mut body).map_err(|_| me)?;
        let theirs = Hello::decode_body(&body).unwrap();
        let mut rtr = RtrAttr::new(theirs.endpoint(), rdma_safe::sys::ibv_mtu::IBV_MTU_1024);
        rtr.sgid_index = dev.gid_index as u8;
        // Three transport retries, not 7: rxe retries 7 times forever, and a READ
        // sent to a session the server has destroyed must fail, not hang.
        let rts = RtsAttr {
            retry_cnt: 3,
            ..RtsAttr::new(7)
        };
        let qp = qp.to_rtr(&rtr).unwrap().to_rts(&rts).unwrap();
        let conn = LeasedQp::new(qp).map_err(|t| t.error).unwrap();
        let mut peer = RawPeer {
            dev: dev.clone(),
            tcp,
            conn,
            cq,
            spare: Vec::new(),
            inbox: VecDeque::new(),
            done: HashMap::new(),
            next_wr: 0,
            next_id: 1,
            owed: 0,
            credits: theirs.credits,
            seen: 0,
            last_acked: 0,
            failed: None,
        };
        for slot in 0..u64::from(RAW_CREDITS) {
            let mr = MemoryRegion::new(&dev.pd, RAW_SLOT, Access::LOCAL_WRITE).unwrap();
            peer.conn
                .post_recv(WR_RECV | slot, mr, 0..RAW_SLOT)
                .map_err(|e| e.error)
                .unwrap();
        }
        before_ready(&mut peer);
        // A server that refused the hello may already have reset the connection.
        peer.tcp.write_all(b"R").map_err(|_| me)?;
        let mut ready = [0u8; 1];
        peer.tcp.read_exact(&mut ready).map_err(|_| me)?;
        assert_eq!(ready, *b"R");
        Ok(peer)
    }

    /// Our end of the bootstrap connection: how the server's log names this session.
    fn me(&self) -> SocketAddr {
        self.tcp.local_addr().unwrap()
    }

    /// Handles every completion there is; waits up to `timeout` for one if there is
    /// none. Returns whether one was handled.
    fn pump(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.poll_once() {
                return true;
            }
            self.cq.req_notify(false).unwrap();
            // A completion that came before the request raises no event.
            if self.poll_once() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.cq.wait(Some(left)).unwrap() {
                return self.poll_once();
            }
        }
    }

    /// Polls one batch of completions and handles it.
    fn poll_once(&mut self) -> bool {
        let mut scratch = [WorkCompletion::default(); 16];
        let completions: Vec<_> = self.cq.poll_completions(&mut scratch).unwrap().collect();
        let any = !completions.is_empty();
        for c in completions {
            let wc = c.work_completion();
            let released: Vec<(u64, Lease)> = self
                .conn
                .complete(c)
                .expect("a completion of the attacker's own queue pair")
                .collect();
            for (wr_id, lease) in released {
                self.finished(wr_id, &wc, lease);
            }
        }
        any
    }

    /// A work request finished: a receive is decoded (and its slot posted again, its
    /// credit owed), a send or READ is kept for its waiter.
    fn finished(&mut self, wr_id: u64, wc: &WorkCompletion, lease: Lease) {
        if wr_id & !0xff_ffff_ffff != WR_RECV {
            self.done.insert(wr_id, (wc.status(), lease));
            return;
        }
        if !wc.is_ok() {
            self.failed.get_or_insert(wc.status());
            return;
        }
        let Lease::Owned(mr) = lease else {
            unreachable!("receives are leased exclusively")
        };
        let mut bytes = vec![0u8; wc.byte_len() as usize];
        mr.read_at(0, &mut bytes).unwrap();
        inspect(&bytes, "a control message the server sent");
        let d = Control::decode(&bytes, &RAW_LIMITS)
            .unwrap_or_else(|e| panic!("the server sent a malformed control message: {e}"));
        self.credits += d.header.credits;
        if matches!(d.kind, Kind::Data | Kind::Eager) {
            self.seen = self.seen.max(d.header.msg_id);
        }
        self.inbox.push_back(Received {
            kind: d.kind,
            header: d.header,
            meta: d.meta.to_vec(),
        });
        self.conn
            .post_recv(wr_id, mr, 0..RAW_SLOT)
            .map_err(|e| e.error)
            .unwrap();
        self.owed += 1;
    }

    /// Waits for work request `wr_id` to finish.
    fn wait_request(&mut self, wr_id: u64, what: &str) -> (ibv_wc_status, Lease) {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(done) = self.done.remove(&wr_id) {
                return done;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{what} did not complete within {STEP:?}");
            self.pump(left);
        }
    }

    /// SENDs `bytes` as they are; returns the SEND's completion status.
    fn send_raw(&mut self, bytes: &[u8]) -> ibv_wc_status {
        self.send_raw_as(bytes, SendOp::Send)
    }

    /// [`RawPeer::send_raw`] with operation `op` (a SEND of some kind).
    fn send_raw_as(&mut self, bytes: &[u8], op: SendOp) -> ibv_wc_status {
        let wr_id = self.post_raw(bytes, op);
        let (status, lease) = self.wait_request(wr_id, "a SEND");
        if let Lease::Owned(mr) = lease {
            self.spare.push(mr);
        }
        status
    }

    /// Posts `bytes` as a SEND of kind `op` (spending a credit) without waiting;
    /// returns its work request id.
    fn post_raw(&mut self, bytes: &[u8], op: SendOp) -> u64 {
        let mut mr = match self.spare.pop() {
            Some(mr) if mr.len() >= bytes.len() => mr,
            _ => MemoryRegion::new(&self.dev.pd, bytes.len().max(RAW_SLOT), Access::LOCAL_WRITE)
                .unwrap(),
        };
        mr.write_at(0, bytes).unwrap();
        self.next_wr += 1;
        let wr_id = WR_SEND | self.next_wr;
        self.conn
            .post_send(wr_id, op, Lease::Owned(mr), 0..bytes.len(), true)
            .map_err(|e| e.error)
            .unwrap();
        self.credits = self.credits.saturating_sub(1);
        wr_id
    }

    /// SENDs a flood keeps in flight at most (within the send queue, 128 deep).
    const FLOOD_DEPTH: usize = 120;

    /// Keeps the server's completion queue busy while keeping every rule: CREDIT
    /// messages back to back, each returning what we owe, as many in flight as the
    /// server's credits allow, until `stop` is set or the session fails. `sent`
    /// counts those that completed. Stops at `until` whatever happens.
    fn flood(&mut self, stop: &AtomicBool, sent: &AtomicU64, until: Instant) {
        let mut in_flight = VecDeque::new();
        while !stop.load(Ordering::SeqCst) && self.failed.is_none() && Instant::now() < until {
            while self.credits > 0 && in_flight.len() < Self::FLOOD_DEPTH {
                let h = Control {
                    credits: std::mem::take(&mut self.owed),
                    seen: self.seen as u32,
                    ..Control::default()
                };
                let mut bytes = vec![0u8; CONTROL_HEADER_LEN];
                h.write_header(Kind::Credit, &mut bytes);
                in_flight.push_back(self.post_raw(&bytes, SendOp::Send));
            }
            self.poll_once();
            self.inbox.clear();
            while let Some(done) = in_flight.front().and_then(|id| self.done.remove(id)) {
                in_flight.pop_front();
                if done.0 != ibv_wc_status::IBV_WC_SUCCESS {
                    return;
                }
                if let Lease::Owned(mr) = done.1 {
                    self.spare.push(mr);
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// SENDs every message of `burst` back to back, ignoring credits, then waits
    /// for them all; returns how many completed successfully.
    fn send_burst(&mut self, burst: &[Vec<u8>]) -> usize {
        let mut ids = Vec::with_capacity(burst.len());
        for bytes in burst {
            let mut mr = MemoryRegion::new(&self.dev.pd, RAW_SLOT, Access::LOCAL_WRITE).unwrap();
            mr.write_at(0, bytes).unwrap();
            self.next_wr += 1;
            let wr_id = WR_SEND | self.next_wr;
            self.conn
                .post_send(wr_id, SendOp::Send, Lease::Owned(mr), 0..bytes.len(), true)
                .map_err(|e| e.error)
                .unwrap();
            ids.push(wr_id);
        }
        ids.into_iter()
            .filter(|&id| {
                self.wait_request(id, "a SEND of a burst").0 == ibv_wc_status::IBV_WC_SUCCESS
            })
            .count()
    }

    /// Sends a well-formed control message (waiting for a credit), returning the
    /// credits owed and saying what it has seen. Panics if the SEND fails.
    fn send_control(&mut self, kind: Kind, h: Control, meta: &[u8], payload: &[u8]) {
        let status = self.send_control_as(kind, h, meta, payload, SendOp::Send);
        assert_eq!(status, ibv_wc_status::IBV_WC_SUCCESS, "{kind:?} not sent");
    }

    /// [`RawPeer::send_control`] with operation `op`, returning the SEND's status.
    fn send_control_as(
        &mut self,
        kind: Kind,
        mut h: Control,
        meta: &[u8],
        payload: &[u8],
        op: SendOp,
    ) -> ibv_wc_status {
        let deadline = Instant::now() + STEP;
        while self.credits == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the server returned no credit");
            self.pump(left);
            self.check_alive("waiting for a credit");
        }
        h.credits = std::mem::take(&mut self.owed);
        h.seen = self.seen as u32;
        h.meta_len = meta.len() as u8;
        let mut bytes = vec![0u8; CONTROL_HEADER_LEN];
        h.write_header(kind, &mut bytes);
        bytes.extend_from_slice(meta);
        bytes.extend_from_slice(payload);
        self.send_raw_as(&bytes, op)
    }

    /// Our next message id.
    fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    /// Panics if the session failed (a receive was flushed).
    fn check_alive(&self, what: &str) {
        if let Some(status) = self.failed {
            panic!(
                "the attacker's session failed while {what}: {}",
                rdma_safe::cq::status_text(status)
            );
        }
    }

    /// The first received control message for which `pred` holds (others stay, but
    /// CREDIT messages are dropped: their credits were counted).
    fn recv(&mut self, what: &str, pred: impl Fn(&Received) -> bool) -> Received {
        let deadline = Instant::now() + STEP;
        loop {
            // Credit returns carry nothing more (their credits were counted).
            self.inbox.retain(|m| m.kind != Kind::Credit);
            if let Some(at) = self.inbox.iter().position(&pred) {
                return self.inbox.remove(at).expect("found");
            }
            self.check_alive(&format!("waiting for {what}"));
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {what} within {STEP:?}");
            self.pump(left);
        }
    }

    /// Asks the server for a bait message of `len` bytes, tagged `tag`, without
    /// waiting for it.
    fn ask_bait(&mut self, mode: Mode, len: usize, tag: u64) {
        let mut meta = b"GIVE".to_vec();
        meta.push(mode as u8);
        meta.extend_from_slice(&(len as u32).to_be_bytes());
        meta.extend_from_slice(&tag.to_be_bytes());
        let h = Control {
            msg_id: self.take_id(),
            ..Control::default()
        };
        self.send_control(Kind::Eager, h, &meta, &[]);
    }

    /// The DATA descriptor of bait `tag`.
    fn bait_descriptor(&mut self, tag: u64) -> Descriptor {
        let mut want = b"BAIT".to_vec();
        want.extend_from_slice(&tag.to_be_bytes());
        let m = self.recv(&format!("the descriptor of bait {tag}"), |m| {
            m.kind == Kind::Data && m.meta == want
        });
        Descriptor {
            msg_id: m.header.msg_id,
            addr: m.header.addr,
            len: m.header.len,
            rkey: m.header.rkey,
        }
    }

    /// Asks for bait and returns its descriptor.
    fn request_bait(&mut self, mode: Mode, len: usize, tag: u64) -> Descriptor {
        self.ask_bait(mode, len, tag);
        self.bait_descriptor(tag)
    }

    /// Acknowledges the server's message `msg_id` (delivered).
    fn ack(&mut self, msg_id: u64) {
        let h = Control {
            msg_id,
            ..Control::default()
        };
        self.send_control(Kind::Ack, h, &[], &[]);
        self.last_acked = msg_id;
    }

    /// Acknowledges the server's message `msg_id` as kiara-ib does: a SEND_WITH_INV
    /// of the message's key `rkey`, which the ACK also names.
    fn ack_invalidating(&mut self, msg_id: u64, rkey: u32) {
        let h = Control {
            msg_id,
            rkey,
            ..Control::default()
        };
        let status = self.send_control_as(Kind::Ack, h, &[], &[], SendOp::SendWithInvalidate(rkey));
        assert_eq!(
            status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "invalidating ACK not sent"
        );
        self.last_acked = msg_id;
    }

    /// Returns the credits we owe with a CREDIT message, if any.
    fn return_credits(&mut self) {
        if self.owed > 0 {
            self.send_control(Kind::Credit, Control::default(), &[], &[]);
        }
    }

    /// READs `remote` into a fresh zeroed buffer.
    fn read(&mut self, remote: RemoteSlice) -> ReadOutcome {
        let len = remote.len as usize;
        let mr = MemoryRegion::new(&self.dev.pd, len.max(1), Access::LOCAL_WRITE).unwrap();
        self.next_wr += 1;
        let wr_id = WR_READ | self.next_wr;
        self.conn
            .post_send(wr_id, SendOp::Read(remote), Lease::Owned(mr), 0..len, true)
            .map_err(|e| e.error)
            .unwrap();
        let (status, lease) = self.wait_request(wr_id, "an RDMA READ");
        let bytes = lease.region().to_vec();
        ReadOutcome { status, bytes }
    }

    /// The positive control: the READ a live descriptor grants succeeds and returns
    /// exactly the bait.
    fn read_granted(&mut self, d: &Descriptor, what: &str) {
        let got = self.read(d.remote());
        assert_eq!(
            got.status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "{what}: the READ the descriptor grants failed ({}): the harness is broken",
            rdma_safe::cq::status_text(got.status)
        );
        assert!(
            got.bytes == bait(d.len as usize),
            "{what}: the bait read back differs"
        );
    }

    /// Attempts `remote`, which no descriptor grants. Refused as it must be (the READ
    /// completes with a remote error, nothing lands in the buffer, the queue pair
    /// goes to the error state): `None`. Otherwise the breach, described.
    fn probe(&mut self, remote: RemoteSlice, what: &str) -> Option<String> {
        let got = self.read(remote);
        if got.status == ibv_wc_status::IBV_WC_SUCCESS {
            return Some(format!(
                "{what}: the READ of {remote:x?} succeeded and got {}",
                classify(&got.bytes)
            ));
        }
        if got.bytes.iter().any(|&b| b != 0) {
            return Some(format!(
                "{what}: the READ of {remote:x?} failed but wrote {}",
                classify(&got.bytes)
            ));
        }
        assert!(
            [
                ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
                ibv_wc_status::IBV_WC_REM_INV_REQ_ERR
            ]
            .contains(&got.status),
            "{what}: the READ failed, but not with a remote access error: {}",
            rdma_safe::cq::status_text(got.status)
        );
        self.wait_qp_error(what);
        eprintln!(
            "refused at the attacker: {what}: {}",
            rdma_safe::cq::status_text(got.status)
        );
        None
    }

    /// Waits until the attacker's queue pair is in the error state (the provider may
    /// report the completion just before it moves the state).
    fn wait_qp_error(&self, what: &str) {
        let deadline = Instant::now() + STEP;
        loop {
            let state = self.conn.qp().query_state().unwrap();
            if state == ibv_qp_state::IBV_QPS_ERR {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the attacker's queue pair did not go to the error state"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// True once the server closed the bootstrap connection (waits up to [`STEP`]).
    fn closed_by_server(&mut self) -> bool {
        self.tcp.set_read_timeout(Some(STEP)).unwrap();
        let mut b = [0u8; 1];
        match self.tcp.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ),
        }
    }
}

/// Panics if `bytes` hold any of the planted secret or of the bytes around the
/// region's messages: the attacker must never get either.
fn inspect(bytes: &[u8], what: &str) {
    if find(bytes, &SECRET_MAGIC).is_some() || find(bytes, &NEIGHBOUR_MAGIC).is_some() {
        panic!("VULNERABLE: {what} holds {}", classify(bytes));
    }
}

/// What bytes an attacker got are, for the report of a breach.
fn classify(bytes: &[u8]) -> String {
    if let Some(at) = find(bytes, &SECRET_MAGIC) {
        return format!(
            "the planted secret (at offset {at} of {} bytes)",
            bytes.len()
        );
    }
    if let Some(at) = find(bytes, &NEIGHBOUR_MAGIC) {
        return format!(
            "bytes next to a message, never announced (at offset {at} of {})",
            bytes.len()
        );
    }
    let nonzero = bytes.iter().filter(|&&b| b != 0).count();
    if nonzero == 0 {
        return format!("{} zero bytes", bytes.len());
    }
    let from_bait = bytes.len() >= 16 && find(&bait(BAIT_MAX), &bytes[..16]).is_some();
    format!(
        "{} bytes, {nonzero} non-zero ({})",
        bytes.len(),
        if from_bait {
            "starting with bait"
        } else {
            "not the bait: other memory"
        }
    )
}

/// Connects a fresh attacker session, has it take bait `tag` of `len` bytes and read
/// it as the descriptor grants (the positive control); returns both.
fn baited(
    dev: &Arc<Device>,
    server: &Server,
    mode: Mode,
    len: usize,
    tag: u64,
) -> (RawPeer, Descriptor) {
    let mut peer = RawPeer::connect(dev, server.addr);
    let d = peer.request_bait(mode, len, tag);
    assert_eq!(
        d.len, len as u64,
        "the descriptor announces the bait's length"
    );
    peer.read_granted(&d, &format!("bait {tag} ({mode:?})"));
    (peer, d)
}

/// The breaches of one test: accesses that should have been refused and were not.
/// The test goes on after one (on a fresh session) and fails at the end, listing
/// them all.
#[derive(Default)]
struct Breaches {
    found: Vec<String>,
    tried: usize,
}

impl Breaches {
    /// Has `peer` attempt `remote`. A refusal must also end the session on the
    /// server, which logs why (its queue pair went to the error state with the
    /// attacker's, as the responder that refused the READ: the log says so, not
    /// only that a receive was flushed), and closes the bootstrap connection. A
    /// breach is kept (and the breaching session dropped).
    fn attempt(&mut self, server: &Server, mut peer: RawPeer, remote: RemoteSlice, what: &str) {
        self.tried += 1;
        match peer.probe(remote, what) {
            None => {
                let line = server.closed(peer.me(), "the peer's RDMA READ or WRITE was refused");
                assert!(
                    peer.closed_by_server(),
                    "{what}: the connection was left open"
                );
                eprintln!("server log: {line}");
            }
            Some(breach) => {
                eprintln!("VULNERABLE: {breach}");
                self.found.push(breach);
            }
        }
    }

    /// Fails the test if any access succeeded.
    fn check(self) {
        assert!(
            self.found.is_empty(),
            "VULNERABLE: {} of {} accesses that no descriptor grants succeeded:\n{}",
            self.found.len(),
            self.tried,
            self.found.join("\n")
        );
    }
}

/// When and how the secret is planted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plant {
    /// Before the attack; the server keeps it.
    Keep,
    /// Before the attack; the server drops it (its buffer goes back to the pool).
    Drop,
    /// The attack plants it itself.
    Later,
}

/// Runs `attack` against a server serving good clients (the secret planted as
/// `plant` says), then checks that the good clients were served intact throughout
/// (even when the attack failed the test) and that a client arriving afterwards is
/// served too.
fn with_victims(config: Config, plant: Plant, attack: impl FnOnce(&Server, &Arc<Device>)) {
    let server = Server::start(config);
    let planted = match plant {
        Plant::Keep => Some(server.plant_secret(b"KEEP")),
        Plant::Drop => Some(server.plant_secret(b"DROP")),
        Plant::Later => None,
    };
    let good = GoodClients::start(server.addr, 3);
    let dev = Device::open();
    // A breach fails the test, but only after the good clients were checked: they
    // must have been served intact whatever the attacker managed.
    let attacked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        attack(&server, &dev);
    }));
    let served = good.finish();
    assert!(
        served >= 3 * (GOOD_MIN_ROUNDS + 1),
        "only {served} good round trips"
    );
    // A client arriving after the attack is served too.
    let late = GoodClients::start(server.addr, 1);
    late.finish();
    if let Some((client, session)) = planted {
        client.disconnect(session).unwrap();
    }
    server.finish();
    if let Err(breach) = attacked {
        std::panic::resume_unwind(breach);
    }
}

// ---------------------------------------------------------------------------------
// The attacks.
// ---------------------------------------------------------------------------------

/// (a) A message cannot be read again once acknowledged: the attacker takes a bait
/// message, reads it, acknowledges it properly, waits until the server's send of it
/// has finished, and READs the same address with the same key again. Both ways the
/// server sends: a pooled buffer (which the pool hands out again) and a registered
/// region (which stays registered). Both ways to acknowledge: a plain SEND (the
/// server then invalidates the window itself) and kiara-ib's own SEND_WITH_INV of
/// the message's key.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_a_a_message_is_unreadable_after_its_ack() {
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        let mut breaches = Breaches::default();
        for (tag, mode, invalidating) in [
            (1, Mode::Pooled, false),
            (2, Mode::Region, false),
            (3, Mode::WholeRegion, false),
            (4, Mode::Pooled, true),
            (5, Mode::Region, true),
        ] {
            let how = if invalidating { "invalidating " } else { "" };
            let what = format!("re-reading bait {tag} ({mode:?}) after its {how}ACK");
            let (mut peer, d) = baited(dev, server, mode, 48 * KIB, tag);
            if invalidating {
                peer.ack_invalidating(d.msg_id, d.rkey);
            } else {
                peer.ack(d.msg_id);
            }
            server.wait_bait_done(tag);
            breaches.attempt(server, peer, d.remote(), &what);
        }
        breaches.check();
    });
}

/// A READ beyond a live descriptor, built from it.
type Probe = fn(&Descriptor) -> RemoteSlice;

/// (b) Nothing outside the announced bytes can be read: before them, straddling
/// either end, after them, with a larger length, the rest of the page. Each probe
/// runs on a fresh session (a refused READ ends it) whose live descriptor is read as
/// granted first. The bait is 40 000 bytes: pooled, it sits at the start of a
/// 64 KiB buffer; from the region, between marked neighbours.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_b_bytes_outside_the_announced_range_are_unreadable() {
    let probes: [(&str, Probe); 7] = [
        ("64 bytes before", |d| RemoteSlice {
            addr: d.addr - 64,
            len: 64,
            ..d.remote()
        }),
        ("straddling the start", |d| RemoteSlice {
            addr: d.addr - 64,
            len: 128,
            ..d.remote()
        }),
        ("64 bytes after", |d| RemoteSlice {
            addr: d.addr + d.len,
            len: 64,
            ..d.remote()
        }),
        ("straddling the end", |d| RemoteSlice {
            addr: d.addr + d.len - 64,
            len: 128,
            ..d.remote()
        }),
        ("one byte more", |d| RemoteSlice {
            len: d.len + 1,
            ..d.remote()
        }),
        ("twice the length", |d| RemoteSlice {
            len: 2 * d.len,
            ..d.remote()
        }),
        ("the page after", |d| RemoteSlice {
            addr: (d.addr + d.len + 4095) & !4095,
            len: 4096,
            ..d.remote()
        }),
    ];
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        let mut breaches = Breaches::default();
        let mut tag = 100;
        for mode in [Mode::Region, Mode::Pooled, Mode::WholeRegion] {
            for (name, probe) in &probes {
                tag += 1;
                let what = format!("reading {name} bait {tag} ({mode:?})");
                let (peer, d) = baited(dev, server, mode, 40_000, tag);
                breaches.attempt(server, peer, probe(&d), &what);
            }
        }
        breaches.check();
    });
}

/// (b, recycled) What a pooled buffer held before is not readable past a new
/// message: a good client's 64 KiB secret goes through the server, which reads it
/// into a pooled buffer and drops it; the attacker then takes a 40 000-byte bait,
/// which the server copies into a buffer of that class (the good clients' traffic
/// avoids it, so it is the secret's), and READs the rest of the buffer with the
/// live descriptor's key.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_b_a_recycled_buffer_shows_nothing_past_the_message() {
    with_victims(Config::default(), Plant::Drop, |server, dev| {
        let mut breaches = Breaches::default();
        let (peer, d) = baited(dev, server, Mode::Pooled, 40_000, 150);
        let rest = RemoteSlice {
            addr: d.addr + d.len,
            len: SECRET_LEN as u64 - d.len,
            ..d.remote()
        };
        breaches.attempt(
            server,
            peer,
            rest,
            "reading past bait 150 to the buffer's end",
        );
        breaches.check();
    });
}

/// (c) A key announced to one session is useless on another. The simplest honest
/// way to learn a key announced to someone else: the victim is a second session of
/// the same harness (to the server, a client like any other) that takes a bait
/// message and holds it unacknowledged, so its window is live; the attacker, on its
/// own session and queue pair, READs exactly the victim's address, length and key.
/// The victim reads its message before and after the attempt (it was readable to
/// its owner all along), acknowledges it, and the attacker then tries the stale key
/// as well.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_c_a_key_announced_to_another_session_is_useless() {
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        let mut breaches = Breaches::default();
        let mut tag = 200;
        for mode in [Mode::Pooled, Mode::Region, Mode::WholeRegion] {
            tag += 1;
            let (mut victim, d) = baited(dev, server, mode, 60_000, tag);
            let what = format!("reading the victim's live bait {tag} ({mode:?})");
            let thief = RawPeer::connect(dev, server.addr);
            breaches.attempt(server, thief, d.remote(), &what);
            victim.read_granted(&d, "the victim, after the attempt");
            victim.ack(d.msg_id);
            server.wait_bait_done(tag);
            let what = format!("reading the victim's acknowledged bait {tag} ({mode:?})");
            let thief = RawPeer::connect(dev, server.addr);
            breaches.attempt(server, thief, d.remote(), &what);
            // The victim was not harmed: it still gets (and reads) what it asks for.
            let again = victim.request_bait(mode, 60_000, tag + 50);
            victim.read_granted(&again, "the victim, afterwards");
            victim.ack(again.msg_id);
            server.wait_bait_done(tag + 50);
        }
        breaches.check();
    });
}

/// (d) A key sweep finds nothing. The secret is planted where the attacker has the
/// best chance: the attacker takes a 64 KiB pooled bait, reads and acknowledges it,
/// and only once the server is done with that buffer does a good client send the
/// 64 KiB secret, which the server reads into a buffer of that same class (the
/// good clients' traffic avoids it) and keeps. Then the attacker tries, one fresh
/// session per probe (a refused READ ends a session):
/// - its own key and the keys 1..=64 either side (rxe gives a type 2 window's key
///   a new low byte per bind, one up: these are the window's past and future
///   keys), at the announced address;
/// - the same low byte at the 8 neighbouring indices either side (rxe keys are
///   index << 8 | byte: other windows' and memory regions' slots) and key 0 (what
///   rxe gives a region registered without remote access), at the announced address;
/// - its own key, the next one and key 0 at the likely addresses of the
///   neighbouring 64 KiB buffers.
///
/// The low byte of a fresh rxe key is random, so a sweep cannot cover every key of a
/// neighbouring index; (c) shows that even the exact key of another session is
/// useless, and (a) that the exact key of a finished message is.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_d_a_key_sweep_finds_no_secret() {
    with_victims(Config::default(), Plant::Later, |server, dev| {
        let (mut peer, d) = baited(dev, server, Mode::Pooled, SECRET_LEN, 300);
        peer.ack(d.msg_id);
        server.wait_bait_done(300);
        drop(peer);
        let planted = server.plant_secret(b"KEEP");
        let own = d.rkey;
        let mut keys: Vec<u32> = (-64i64..=64).map(|k| own.wrapping_add(k as u32)).collect();
        keys.extend((1..=8u32).flat_map(|j| [own.wrapping_add(j << 8), own.wrapping_sub(j << 8)]));
        keys.push(0);
        let mut probes: Vec<RemoteSlice> = keys
            .iter()
            .map(|&rkey| RemoteSlice {
                addr: d.addr,
                len: 4096,
                rkey,
            })
            .collect();
        for rkey in [own, own.wrapping_add(1), 0] {
            for delta in [-0x11000i64, -0x10000, 0x10000, 0x11000] {
                probes.push(RemoteSlice {
                    addr: d.addr.wrapping_add(delta as u64),
                    len: 4096,
                    rkey,
                });
            }
        }
        let mut breaches = Breaches::default();
        for (i, probe) in probes.iter().enumerate() {
            let what = format!("sweep probe {i} of {} ({probe:x?})", probes.len());
            let peer = RawPeer::connect(dev, server.addr);
            breaches.attempt(server, peer, *probe, &what);
        }
        planted.0.disconnect(planted.1).unwrap();
        breaches.check();
    });
}

/// A control message, as bytes.
fn control(kind: Kind, h: Control, meta: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; CONTROL_HEADER_LEN];
    Control {
        meta_len: meta.len() as u8,
        ..h
    }
    .write_header(kind, &mut v);
    v.extend_from_slice(meta);
    v.extend_from_slice(payload);
    v
}

/// Builds a control message's bytes for a session that has done its prelude.
type Build = Box<dyn Fn(&mut RawPeer) -> Vec<u8>>;

/// A broken control message and what the server must say about it.
struct Malformed {
    name: &'static str,
    bytes: Build,
    /// Takes bait (and acknowledges it) first, so that ACKs have something to name.
    acked_bait_first: bool,
    reason: &'static str,
}

/// A malformed message case.
fn case(
    name: &'static str,
    reason: &'static str,
    bytes: impl Fn(&mut RawPeer) -> Vec<u8> + 'static,
) -> Malformed {
    Malformed {
        name,
        bytes: Box::new(bytes),
        acked_bait_first: false,
        reason,
    }
}

/// (e) Malformed, truncated, oversize and out-of-order control messages (and broken
/// hellos, and bytes on the bootstrap connection) close the session with the named
/// reason, while the good clients go on being served.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_e_malformed_control_messages_close_the_session_with_a_reason() {
    let cases = malformed_cases();
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        for (i, c) in cases.iter().enumerate() {
            malformed_closes_the_session(server, dev, i, c);
        }
        stray_byte_closes_the_session(server, dev);
        broken_hellos_are_refused(server, dev);
        stray_invalidations_close_the_session(server, dev);
    });
}

/// Invalidations other than an ACK's of its own message's key: an ACK of one bait
/// that invalidates another bait's window, a CREDIT that invalidates a window, and
/// an ACK with a key that is no window of the session (which fails at the server's
/// queue pair). Each closes the session with the reason, and the server's sends of
/// the baits fail rather than finish: their buffers are never handed back while the
/// attacker might still reach them. Before protocol version 3 the server answered
/// the first two with a LOCAL_INV of the window the attacker had invalidated, a
/// second invalidation, which panics an rxe (Linux 6.1) kernel.
fn stray_invalidations_close_the_session(server: &Server, dev: &Arc<Device>) {
    type Attack = fn(&mut RawPeer, &Descriptor, &Descriptor) -> ibv_wc_status;
    let attacks: [(&str, Attack, &str); 3] = [
        (
            "an ACK invalidating another message's window",
            |p, a, b| {
                let h = Control {
                    msg_id: a.msg_id,
                    rkey: a.rkey,
                    ..Control::default()
                };
                let op = SendOp::SendWithInvalidate(b.rkey);
                p.send_control_as(Kind::Ack, h, &[], &[], op)
            },
            "not that message's window",
        ),
        (
            "a CREDIT invalidating a window",
            |p, a, _| {
                let op = SendOp::SendWithInvalidate(a.rkey);
                p.send_control_as(Kind::Credit, Control::default(), &[], &[], op)
            },
            "its Credit about message 0 invalidated key",
        ),
        (
            "an ACK invalidating a key that is no window",
            |p, a, _| {
                // Another index: no window of the device has it.
                let op = SendOp::SendWithInvalidate(a.rkey ^ 0x00ff_ff00);
                p.send_control_as(
                    Kind::Ack,
                    Control {
                        msg_id: a.msg_id,
                        ..Control::default()
                    },
                    &[],
                    &[],
                    op,
                )
            },
            "remote invalid request error",
        ),
    ];
    for (i, (name, attack, reason)) in attacks.into_iter().enumerate() {
        let mut peer = RawPeer::connect(dev, server.addr);
        let tags = (600 + 2 * i as u64, 601 + 2 * i as u64);
        let a = peer.request_bait(Mode::Pooled, 10_000, tags.0);
        let b = peer.request_bait(Mode::Pooled, 10_000, tags.1);
        let status = attack(&mut peer, &a, &b);
        eprintln!("{name}: the attacker's SEND completed with {status:?}");
        let line = server.closed(peer.me(), reason);
        assert!(line.contains(" closed: "), "{name}: {line}");
        eprintln!("{name}: server log: {line}");
        for tag in [tags.0, tags.1] {
            let handle = server.give(tag).expect("the bait reply was sent");
            assert!(
                handle.wait(Some(STEP)).is_err(),
                "{name}: the send of bait {tag} finished as delivered"
            );
        }
        assert!(peer.closed_by_server(), "{name}: connection left open");
    }
}

/// An eager message announcing `len` bytes and carrying `payload`, with the credits
/// the attacker owes.
fn eager(p: &mut RawPeer, id: u64, len: u64, payload: usize) -> Vec<u8> {
    let h = Control {
        msg_id: id,
        len,
        credits: std::mem::take(&mut p.owed),
        ..Control::default()
    };
    control(Kind::Eager, h, &[], &vec![7u8; payload])
}

/// Every malformed control message of (e).
fn malformed_cases() -> Vec<Malformed> {
    let mut cases = vec![
        case("empty", "truncated: 0 of 40", |_| Vec::new()),
        case("header cut short", "truncated: 39 of 40", |_| {
            control(Kind::Credit, Control::default(), &[], &[])[..39].to_vec()
        }),
        case("unknown type", "unknown control message type 0", |_| {
            let mut m = control(Kind::Credit, Control::default(), &[], &[]);
            m[0] = 0;
            m
        }),
        case(
            "metadata too long",
            "metadata of 65 bytes exceeds 64",
            |p| {
                let h = Control {
                    msg_id: p.take_id(),
                    len: 1,
                    ..Control::default()
                };
                control(Kind::Eager, h, &[1; 65], &[2])
            },
        ),
        case("metadata cut short", "5 of 10 metadata bytes", |_| {
            let mut m = control(Kind::Credit, Control::default(), &[], &[]);
            m[1] = 10;
            m.extend_from_slice(&[0; 5]);
            m
        }),
        case(
            "eager over the threshold",
            "exceeds the eager threshold",
            |p| {
                let id = p.take_id();
                eager(p, id, 4097, 4097)
            },
        ),
        case(
            "eager shorter than announced",
            "announces 100 bytes but carries 50",
            |p| {
                let id = p.take_id();
                eager(p, id, 100, 50)
            },
        ),
        case("oversize SEND", "RDMA failed", |p| {
            let id = p.take_id();
            eager(p, id, 8192, 8192)
        }),
    ];
    cases.extend(descriptor_cases());
    cases.extend(ack_and_id_cases());
    cases
}

/// Data descriptors that are empty, too long, wrapping, followed by bytes, or lying.
fn descriptor_cases() -> Vec<Malformed> {
    vec![
        case("empty descriptor", "data descriptor of 0 bytes", |p| {
            let h = Control {
                msg_id: p.take_id(),
                addr: 0x1000,
                rkey: 1,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
        case("descriptor over the limit", "exceeds the limit", |p| {
            let h = Control {
                msg_id: p.take_id(),
                len: 1 << 40,
                addr: 0x1000,
                rkey: 1,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
        case("descriptor wrapping around", "wraps around", |p| {
            let h = Control {
                msg_id: p.take_id(),
                len: 4096,
                addr: u64::MAX - 100,
                rkey: 1,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
        case(
            "bytes after a descriptor",
            "stray bytes after a data descriptor",
            |p| {
                let h = Control {
                    msg_id: p.take_id(),
                    len: 8192,
                    addr: 0x1000,
                    rkey: 1,
                    ..Control::default()
                };
                control(Kind::Data, h, &[], &[1, 2, 3])
            },
        ),
        case("lying descriptor key", "RDMA failed", |p| {
            let h = Control {
                msg_id: p.take_id(),
                len: 8192,
                addr: 0x10_0000,
                rkey: 0xdead,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
    ]
}

/// Stray bytes, credits never spent, ids out of order, ACKs of nothing.
fn ack_and_id_cases() -> Vec<Malformed> {
    let mut cases = vec![
        case(
            "bytes after an ACK",
            "Ack message carries 1 unexpected bytes",
            |_| control(Kind::Ack, Control::default(), &[], &[9]),
        ),
        case(
            "metadata on a BYE",
            "Bye message carries 3 unexpected bytes",
            |_| control(Kind::Bye, Control::default(), &[1, 2, 3], &[]),
        ),
        case(
            "credits never spent",
            "returned 1000000 credits but owed",
            |_| {
                let h = Control {
                    credits: 1_000_000,
                    ..Control::default()
                };
                control(Kind::Credit, h, &[], &[])
            },
        ),
        case("id jumping ahead", "message id 1000 jumps ahead", |p| {
            eager(p, 1000, 1, 1)
        }),
        case("id zero", "message id 0 repeats or goes backwards", |p| {
            eager(p, 0, 1, 1)
        }),
        case(
            "ACK of a message never sent",
            "acknowledgement of message 77",
            |_| {
                let h = Control {
                    msg_id: 77,
                    ..Control::default()
                };
                control(Kind::Ack, h, &[], &[])
            },
        ),
    ];
    let mut twice = case(
        "the same ACK twice",
        "which is not in flight",
        |p: &mut RawPeer| {
            let h = Control {
                msg_id: p.last_acked,
                credits: std::mem::take(&mut p.owed),
                ..Control::default()
            };
            control(Kind::Ack, h, &[], &[])
        },
    );
    twice.acked_bait_first = true;
    cases.push(twice);
    let mut repeat = case(
        "an id used before",
        "repeats or goes backwards (last 1)",
        |p: &mut RawPeer| eager(p, 1, 1, 1),
    );
    repeat.acked_bait_first = true;
    cases.push(repeat);

    cases
}

/// Case `i` (`c`): a fresh attacker sends it; the server closes the session with the
/// case's reason and the connection.
fn malformed_closes_the_session(server: &Server, dev: &Arc<Device>, i: usize, c: &Malformed) {
    let mut peer = RawPeer::connect(dev, server.addr);
    if c.acked_bait_first {
        let tag = 400 + i as u64;
        let d = peer.request_bait(Mode::Pooled, 10_000, tag);
        peer.ack(d.msg_id);
        server.wait_bait_done(tag);
    }
    let bytes = (c.bytes)(&mut peer);
    // The oversize SEND fails at the attacker too (the server's receive cannot hold
    // it); every other one is delivered.
    let status = peer.send_raw(&bytes);
    if c.name != "oversize SEND" {
        assert_eq!(status, ibv_wc_status::IBV_WC_SUCCESS, "{}: SEND", c.name);
    }
    let line = server.closed(peer.me(), c.reason);
    assert!(line.contains(" closed: "), "{}: {line}", c.name);
    assert!(peer.closed_by_server(), "{}: connection left open", c.name);
    eprintln!("{}: server log: {line}", c.name);
}

/// A byte on the bootstrap connection after the handshake closes the session.
fn stray_byte_closes_the_session(server: &Server, dev: &Arc<Device>) {
    let mut peer = RawPeer::connect(dev, server.addr);
    peer.tcp.write_all(b"X").unwrap();
    server.closed(peer.me(), "unexpected bytes on the bootstrap connection");
    assert!(peer.closed_by_server(), "stray byte: connection left open");
}

/// Broken hellos: refused before any session exists. The reason must name the field
/// (its wording is the protocol code's).
fn broken_hellos_are_refused(server: &Server, dev: &Arc<Device>) {
    // the field (its wording is the protocol code's).
    type Tweak = fn(&mut [u8]);
    let hellos: [(&str, Tweak, &str); 3] = [
        ("no credits", |h| h[36..40].fill(0), "credits"),
        (
            "tiny slots",
            |h| h[40..44].copy_from_slice(&50u32.to_be_bytes()),
            "slot",
        ),
        ("unknown flags", |h| h[19] |= 0x80, "flags"),
    ];
    for (name, tweak, field) in hellos {
        let me = match RawPeer::try_connect(dev, server.addr, tweak) {
            Ok(_) => panic!("{name}: the hello was accepted"),
            Err(me) => me,
        };
        let refused = format!("connection from {me} refused");
        let line = server
            .log
            .wait_for(&format!("refusing the hello of {me} ({name})"), |l| {
                l.contains(&refused)
            });
        assert!(
            line.contains(field),
            "{name}: the reason does not name the {field}: {line}"
        );
        eprintln!("{name}: server log: {line}");
    }
}

/// (h) A server whose sessions share one small receive queue (8 slots, fewer than
/// one session's credits) loses no slot to an attacker: SENDs longer than a slot
/// (by many packets, or by one byte in one packet) and an eager message over the
/// threshold the server announced for its shared slots each close the attacker's
/// session with a reason, 18 times in all; a client that fills every slot during
/// the handshake and then fails it gets nothing kept; a client whose MTU is smaller
/// than the server's is refused at the hello. The good clients (whose bursts overrun the
/// queue, so the device makes them retry) are served intact throughout and after,
/// which they could not be had the attacks taken 8 slots, and the transport holds
/// none of them back.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_h_a_shared_receive_queue_loses_no_slot_to_an_attacker() {
    const SLOTS: u32 = 8;
    let config = Config {
        shared_receive_slots: SLOTS,
        ..Config::default()
    };
    with_victims(config, Plant::Keep, |server, dev| {
        // At rxe's 1,024-byte MTU a shared slot holds 1,023 bytes: 919 of payload.
        let cases = [
            case("many packets", "RDMA failed", |p| {
                let id = p.take_id();
                eager(p, id, 8192, 8192)
            }),
            case("one byte over a slot", "RDMA failed", |p| {
                let id = p.take_id();
                eager(p, id, 984, 984)
            }),
            case(
                "eager over the shared threshold",
                "exceeds the eager threshold 919",
                |p| {
                    let id = p.take_id();
                    eager(p, id, 920, 920)
                },
            ),
        ];
        // The failing SENDs run more times than there are slots: had any of them
        // kept its slot, the queue would run dry and the good clients, and the late
        // one `with_victims` starts afterwards, would wait for ever (and time out).
        let runs = cases.iter().cycle().take(2 * SLOTS as usize + 2);
        for (i, c) in runs.enumerate() {
            let mut peer = RawPeer::connect(dev, server.addr);
            let bytes = (c.bytes)(&mut peer);
            let status = peer.send_raw(&bytes);
            let fits = bytes.len() <= 1023;
            assert_eq!(status == ibv_wc_status::IBV_WC_SUCCESS, fits, "{}", c.name);
            let line = server.closed(peer.me(), c.reason);
            assert!(peer.closed_by_server(), "{i} {}: left open", c.name);
            eprintln!("{}: server log: {line}", c.name);
        }
        // A client that tries to fill the slots before the handshake is over, then
        // spoils its ready byte: the server's queue pair cannot receive before that
        // byte, so the SEND fails and takes no slot, and the session never starts.
        let credit = control(Kind::Credit, Control::default(), &[], &[]);
        let failed = RawPeer::handshake(
            dev,
            server.addr,
            |_| {},
            |p| {
                let status = p.send_raw(&credit);
                assert_ne!(
                    status,
                    ibv_wc_status::IBV_WC_SUCCESS,
                    "a SEND before the ready byte reached the server"
                );
                p.tcp.write_all(b"X").unwrap();
            },
        );
        // The server reads our ready byte before it writes its own, so neither
        // side finishes.
        let me = match &failed {
            Ok(peer) => peer.me(),
            Err(me) => *me,
        };
        let line = server
            .log
            .wait_for(&format!("refusing {me} (bad ready byte)"), |l| {
                l.contains(&me.to_string()) && l.contains("ready byte")
            });
        eprintln!("bad ready byte: server log: {line}");
        drop(failed);
        // A smaller MTU than the server's (1,024 bytes, code 3): refused.
        let me = match RawPeer::try_connect(dev, server.addr, |h| h[18] = 2) {
            Ok(_) => panic!("a client with a 512-byte MTU was accepted"),
            Err(me) => me,
        };
        let line = server
            .log
            .wait_for(&format!("refusing {me} (small MTU)"), |l| {
                l.contains(&me.to_string()) && l.contains("MTU")
            });
        eprintln!("small MTU: server log: {line}");
        let deadline = Instant::now() + STEP;
        loop {
            let q = server.transport.shared_receives().unwrap();
            if q.posted == SLOTS {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {SLOTS} shared slots came back",
                q.posted
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// (h, bursts) On a server whose sessions share a receive queue of 128 slots, an
/// attacker sends 100 control messages back to back, ignoring its credits, with a
/// malformed one in the middle: its session closes while the messages behind the
/// malformed one arrive, so their completions are polled after the close or are
/// still on the CQ when the queue pair is destroyed. Every SEND the attacker saw
/// succeed consumed a shared slot, so the server must count exactly as many
/// receives handed back (`SharedReceives::received`), four bursts in a row, and
/// hold no slot back.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_h_bursts_over_the_credits_lose_no_shared_slot() {
    const SLOTS: u32 = 128;
    let server = Server::start(Config {
        shared_receive_slots: SLOTS,
        ..Config::default()
    });
    let dev = Device::open();
    let mut sent = 0;
    for round in 0..4 {
        let mut peer = RawPeer::connect(&dev, server.addr);
        let burst: Vec<Vec<u8>> = (0..100)
            .map(|i| match i {
                40 => control(Kind::Credit, Control::default(), &[], &[9]),
                _ => control(Kind::Credit, Control::default(), &[], &[]),
            })
            .collect();
        let delivered = peer.send_burst(&burst);
        let line = server.closed(peer.me(), "the peer broke the protocol");
        eprintln!("burst {round}: {delivered} of 100 delivered; server log: {line}");
        assert!(
            delivered > 40,
            "burst {round}: only {delivered} SENDs arrived"
        );
        // The burst, and the greeting before it.
        sent += delivered as u64 + 1;
    }
    every_receive_back(&server, sent, SLOTS);
    // And the queue still serves.
    GoodClients::start(server.addr, 2).finish();
    server.finish();
}

/// (h) on a shared receive queue: a peer that sends before its ready byte lands
/// nothing, since the server's queue pair cannot receive until that byte. (When
/// the server moved to RTR before reading it, each such half-open handshake held
/// up to `credits` slots, with no session to cut it off: a few of them could take
/// every slot.) Its SEND fails, the shared queue counts no receive and keeps every
/// slot posted, and once the peer sends its ready byte the session starts as any
/// other.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_h_a_half_open_handshake_holds_no_slot() {
    const SLOTS: u32 = 64;
    const CREDITS: u32 = 8;
    let server = Server::start(Config {
        shared_receive_slots: SLOTS,
        credits: CREDITS,
        ..Config::default()
    });
    let dev = Device::open();
    let credit = control(Kind::Credit, Control::default(), &[], &[]);
    let peer = RawPeer::handshake(
        &dev,
        server.addr,
        |_| {},
        |p| {
            let status = p.send_raw(&credit);
            assert_ne!(
                status,
                ibv_wc_status::IBV_WC_SUCCESS,
                "a SEND before the ready byte reached the server"
            );
            eprintln!(
                "a SEND before the ready byte: {}",
                rdma_safe::cq::status_text(status)
            );
            let q = server.transport.shared_receives().unwrap();
            assert_eq!(q.received, 0, "receives counted during the handshake");
            assert_eq!(q.posted, SLOTS, "slots held during the handshake");
        },
    )
    .expect("the handshake completes");
    // The session started; the peer's queue pair failed, so it leaves.
    let deadline = Instant::now() + STEP;
    while server.transport.sessions().is_empty() {
        assert!(Instant::now() < deadline, "the session never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(peer);
    every_receive_back(&server, 0, SLOTS);
    GoodClients::start(server.addr, 2).finish();
    server.finish();
}

/// Waits until `server`'s shared queue has counted `sent` receives (each of which
/// gave its slot back) and all its `slots` are posted again.
fn every_receive_back(server: &Server, sent: u64, slots: u32) {
    let deadline = Instant::now() + STEP;
    loop {
        let q = server.transport.shared_receives().unwrap();
        if q.received == sent && q.posted == slots {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sent} SENDs succeeded, but {} receives came back ({} of {slots} slots posted)",
            q.received,
            q.posted
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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

/// (i) A peer that ignores its credits while the server's application takes
/// nothing. The server posts each receive slot again once it has copied the
/// message out, before the application takes it, so the device would accept
/// SEND after SEND; the credits are what bound the messages waiting. The peer is
/// cut off at the first message past them, and the application finds exactly the
/// credits' worth waiting, each intact.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_i_a_peer_past_its_credits_is_cut_off_while_nothing_is_taken() {
    const PAYLOAD: usize = 200; // over the in-place size: each takes a pool buffer
    let credits = Config::default().credits as u64;
    let log = Arc::new(Log::default());
    let server = Transport::with_logger(Config::default(), log.sink());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let dev = Device::open();
    let mut peer = RawPeer::connect(&dev, addr);
    let deadline = Instant::now() + STEP;
    let session = loop {
        if let Some(s) = server.sessions().pop() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server has no session");
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut arrived = 0;
    for _ in 0..3 * credits {
        let id = peer.take_id();
        let bytes = eager(&mut peer, id, PAYLOAD as u64, PAYLOAD);
        if peer.send_raw(&bytes) != ibv_wc_status::IBV_WC_SUCCESS {
            break;
        }
        arrived += 1;
    }
    let tag = format!("({})", peer.me());
    let line = log.wait_for("closing the attacker's session", |l| {
        l.contains(&tag) && l.contains(" closed: ")
    });
    assert!(
        line.contains("the peer sent more control messages than its credits"),
        "{line}"
    );
    assert!(peer.closed_by_server(), "the attacker's session left open");
    // The greeting took one credit, which the server owes until it sends.
    let allowed = credits - 1;
    assert!(
        arrived > allowed,
        "only {arrived} SENDs reached the server: the attack did not go past the credits"
    );
    let mut waiting = 0;
    while let Ok(Some(msg)) = server.recv(&session, Linger::NoWait) {
        assert_eq!(msg.bytes(), &[7u8; PAYLOAD][..], "message {waiting} intact");
        waiting += 1;
    }
    assert_eq!(waiting, allowed, "messages waiting for the application");
    server.unbind().unwrap();
}

/// (j) A peer that keeps its queue busy while keeping every rule: CREDIT messages
/// back to back, as many in flight as its credits allow, each credit it gets back
/// spent at once, so that the server's completion queue is seldom empty. A thread
/// that drained a queue until it found it empty was held for as long as the peer
/// went on: no other session's callback ran, and `unbind` waited for the peer.
/// Now a good client's round trips are answered during the flood, and `unbind`
/// returns while it still goes on.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_j_a_peer_that_keeps_its_queue_busy_holds_no_thread() {
    const ROUNDS: u64 = 20;
    const WAIT: Duration = Duration::from_secs(20);
    // Many credits: the peer may keep a whole send queue in flight, and the server
    // gives credits back only after a quarter of them.
    let server = Server::start(Config {
        credits: 1024,
        // Room in each session's floor for 1,024 held eager messages of 4 KiB.
        max_receiving_bytes_total: 2 << 30,
        ..Config::default()
    });
    let dev = Device::open();
    let mut peer = RawPeer::connect(&dev, server.addr);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, sent) = (stop.clone(), sent.clone());
        let until = Instant::now() + 3 * STEP;
        std::thread::spawn(move || {
            peer.flood(&stop, &sent, until);
            peer
        })
    };
    let flowing = |from: u64, what: &str| {
        let deadline = Instant::now() + STEP;
        while sent.load(Ordering::SeqCst) < from + 500 {
            assert!(Instant::now() < deadline, "the flood stalled {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    flowing(0, "before the good client");
    let client = Transport::new(Config::default());
    let s = client.connect(server.addr).expect("a good client connects");
    for seq in 0..ROUNDS {
        let payload = noise(seq, 64);
        let mut meta = b"ECHO".to_vec();
        meta.extend_from_slice(&seq.to_be_bytes());
        let msg = Message::new(payload.clone()).with_meta(&meta).unwrap();
        client.send(&s, msg, Linger::Timeout(WAIT)).unwrap();
        let reply = client
            .recv(&s, Linger::Timeout(WAIT))
            .unwrap()
            .unwrap_or_else(|| {
                panic!(
                    "no echo of round trip {seq} within {WAIT:?} while a peer kept its \
                     queue busy ({} CREDIT messages so far)",
                    sent.load(Ordering::SeqCst)
                )
            });
        assert_eq!(reply.meta()[..12], meta[..], "echo {seq} in order");
        assert_eq!(reply.bytes(), &payload[..], "echo {seq} intact");
    }
    client.disconnect(s).unwrap();
    // The round trips were served during the flood, not after it.
    let during = sent.load(Ordering::SeqCst);
    flowing(during, "after the good client");
    let unbound = Instant::now();
    let finished = std::thread::spawn(move || {
        server.transport.unbind().unwrap();
        Instant::now()
    });
    let deadline = Instant::now() + WAIT;
    while !finished.is_finished() {
        assert!(
            Instant::now() < deadline,
            "unbind did not return within {WAIT:?} while a peer kept its queue busy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let returned = finished.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    drop(flood.join().unwrap());
    eprintln!(
        "{} CREDIT messages; unbind took {:?}",
        sent.load(Ordering::SeqCst),
        returned.duration_since(unbound)
    );
}

/// (k) Many sessions cannot pin more than the transport allows: four clients each
/// send 1 MiB messages (16 each, 64 MiB asked for) to a server whose application
/// takes nothing, with each session's own budget (64 MiB) far above the
/// transport's (`max_receiving_bytes_total`, 8 MiB). Exactly 7 messages are held
/// (each session's floor keeps 128 KiB of its 1 MiB for the eager messages it may
/// hold, 32 credits of 4 KiB, so the 8 MiB hold 7.5 MiB of read messages);
/// every other send is refused as busy, the session staying open; the memory the
/// process pinned grows by far less than what was asked for. Once the application
/// takes a message, a send fits again.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_many_sessions_pin_no_more_than_the_transport_allows() {
    const TOTAL: u64 = 8 * MIB as u64;
    const CLIENTS: usize = 4;
    const EACH: usize = 16;
    let server = Transport::new(Config {
        max_receiving_bytes_total: TOTAL,
        // Half of TOTAL is the four sessions' floors of 1 MiB, half is shared;
        // a session holds 5 MiB at most, so messages are 1 MiB at most.
        max_sessions: CLIENTS,
        max_message: MIB as u64,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let pinned_before = pinned_bytes();
    let client = Transport::new(Config::default());
    let sessions: Vec<Session> = (0..CLIENTS)
        .map(|_| client.connect(addr).expect("a client connects"))
        .collect();
    let payload = noise(11, MIB);
    let (mut held, mut busy) = (0u64, 0u64);
    for _ in 0..EACH {
        for s in &sessions {
            match client.send(s, payload.clone(), Linger::Timeout(STEP)) {
                Ok(_) => held += 1,
                Err(e) if e.is_busy() => busy += 1,
                Err(e) => panic!("a send failed other than busy: {e}"),
            }
        }
    }
    // A session's first message takes its 896 KiB of floor and 128 KiB of the
    // shared 4 MiB; three more fit in what is shared.
    const HELD: u64 = 7;
    assert_eq!(held, HELD, "messages the server holds");
    assert_eq!(busy, (CLIENTS * EACH) as u64 - held, "refused as busy");
    assert_eq!(
        server.receiving_bytes(),
        HELD * MIB as u64,
        "bytes the server counts"
    );
    let grown = pinned_bytes().saturating_sub(pinned_before);
    eprintln!(
        "{held} held, {busy} refused; pinned grew by {} MiB",
        grown / MIB as u64
    );
    assert!(
        grown < 3 * TOTAL,
        "pinned memory grew by {grown} bytes for {} MiB asked",
        CLIENTS * EACH
    );
    for s in &sessions {
        assert!(s.closed().is_none(), "a refused sender's session closed");
    }
    // The application takes one message: its bytes leave the budget, and the next
    // send fits.
    let with_one = server
        .sessions()
        .into_iter()
        .find_map(|s| server.recv(&s, Linger::NoWait).unwrap().map(|m| (s, m)))
        .expect("a held message");
    assert_eq!(
        with_one.1.bytes(),
        &payload[..],
        "the held message is intact"
    );
    drop(with_one);
    assert_eq!(server.receiving_bytes(), (HELD - 1) * MIB as u64);
    client
        .send(&sessions[0], payload.clone(), Linger::Timeout(STEP))
        .expect("a send fits once a message was taken");
    for s in sessions {
        client.disconnect(s).unwrap();
    }
    server.unbind().unwrap();
}

/// (k) A read message is charged the buffer it pins, not its length: a peer that
/// sends 1-byte read messages (its `eager_threshold` at 0) to a server allowing
/// 64 KiB for all sessions gets 16 held (4 KiB each) and every other refused as
/// busy, its session open. Counted by length, all 32 would be held.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_tiny_read_messages_are_charged_what_they_pin() {
    const TOTAL: u64 = 64 << 10;
    let server = Transport::new(Config {
        max_receiving_bytes_total: TOTAL,
        // One session: its floor (half of TOTAL) and the shared half are all its;
        // eager messages of 128 bytes pin no pool buffer, so none of the floor is
        // kept for them.
        max_sessions: 1,
        max_message: TOTAL,
        eager_threshold: 128,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        eager_threshold: 0,
        ..Config::default()
    });
    let session = client.connect(addr).expect("the client connects");
    let (mut held, mut busy) = (0u64, 0u64);
    for i in 0..32u8 {
        match client.send(&session, vec![i], Linger::Timeout(STEP)) {
            Ok(_) => held += 1,
            Err(e) if e.is_busy() => busy += 1,
            Err(e) => panic!("a send failed other than busy: {e}"),
        }
    }
    assert_eq!((held, busy), (16, 16), "4 KiB charged per 1-byte message");
    assert_eq!(server.receiving_bytes(), TOTAL, "bytes the server counts");
    assert!(
        session.closed().is_none(),
        "a refused sender's session closed"
    );
    let s = server.sessions().pop().expect("the server's session");
    let first = server
        .recv(&s, Linger::NoWait)
        .unwrap()
        .expect("a held message");
    assert_eq!(first.bytes(), &[0u8][..], "the first message, intact");
    drop(first);
    assert_eq!(server.receiving_bytes(), TOTAL - 4096);
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

/// (k) A peer that holds all it may of the transport's shared receiving budget
/// does not keep another session from its floor: with 8 MiB for four sessions,
/// each session's floor is 1 MiB and 4 MiB are shared. The attacker's session,
/// whose application takes nothing, gets its floor and all that is shared (5
/// messages of 1 MiB), then is refused as busy; an honest session's message still
/// fits in its own floor.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_a_session_that_holds_the_shared_budget_leaves_others_their_floor() {
    const TOTAL: u64 = 8 * MIB as u64;
    let server = Transport::new(Config {
        max_receiving_bytes_total: TOTAL,
        max_sessions: 4,
        max_message: MIB as u64,
        // Eager messages of 128 bytes pin no pool buffer: the floors are all for
        // read messages.
        eager_threshold: 128,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let attacker = client.connect(addr).expect("the attacker connects");
    let payload = noise(17, MIB);
    let send = |s: &Session| client.send(s, payload.clone(), Linger::Timeout(STEP));
    let mut held = 0;
    loop {
        match send(&attacker) {
            Ok(_) => held += 1,
            Err(e) if e.is_busy() => break,
            Err(e) => panic!("a send failed other than busy: {e}"),
        }
        assert!(held <= 8, "the attacker was never refused");
    }
    assert_eq!(held, 5, "its floor and all that is shared");
    assert_eq!(server.receiving_bytes(), 5 * MIB as u64);
    let honest = client.connect(addr).expect("an honest client connects");
    send(&honest).expect("the honest message fits in its session's floor");
    let e = send(&honest)
        .err()
        .expect("beyond its floor, nothing is shared left");
    assert!(e.is_busy(), "{e}");
    assert!(attacker.closed().is_none() && honest.closed().is_none());
    client.disconnect(attacker).unwrap();
    client.disconnect(honest).unwrap();
    server.unbind().unwrap();
}

/// `n` sessions of `client` to `server` at `addr`, once the server has them all:
/// the client's handles and the server's.
fn connected(
    server: &Transport,
    client: &Transport,
    addr: SocketAddr,
    n: usize,
) -> (Vec<Session>, Vec<Session>) {
    let ours: Vec<Session> = (0..n)
        .map(|_| client.connect(addr).expect("a client connects"))
        .collect();
    let deadline = Instant::now() + STEP;
    while server.sessions().len() < n {
        assert!(
            Instant::now() < deadline,
            "the server never saw {n} sessions"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (ours, server.sessions())
}

/// (k) Peers that take nothing cannot make a transport hold more of its own read
/// messages than it allows for all sessions (`max_outstanding_bytes_total`, 8 MiB
/// here, against 64 MiB per session): four clients (8 credits each) never take
/// what the server sends them, so their credits stop coming back and the server's
/// 1 MiB messages queue. Sends beyond the 8 MiB fail with `Full`, the count never
/// passes it, and the sessions stay open. A send that waits for room gets it once
/// another session's client takes its messages, and the close gives every byte back.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_peers_that_take_nothing_hold_no_more_than_the_transport_sends() {
    const TOTAL: u64 = 8 * MIB as u64;
    let server = Transport::new(Config {
        max_outstanding_bytes_total: TOTAL,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        credits: 8,
        ..Config::default()
    });
    let (sessions, theirs) = connected(&server, &client, addr, 4);
    let deadline = Instant::now() + STEP;
    let payload = noise(13, MIB);
    // Send until every session has been refused for a while in a row: the clients'
    // credits are gone and the server holds what it may.
    let (mut sent, mut full, mut quiet_since) = (0u64, 0u64, None::<Instant>);
    while quiet_since.is_none_or(|t| t.elapsed() < Duration::from_secs(2)) {
        assert!(Instant::now() < deadline, "sent {sent}, refused {full}");
        let mut any = false;
        for s in &theirs {
            match server.send(s, payload.clone(), Linger::NoWait) {
                Ok(_) => (sent, any) = (sent + 1, true),
                Err(kiara_ib::Error::Full) => full += 1,
                Err(e) => panic!("a send failed other than full: {e}"),
            }
            let held = server.sending_bytes();
            assert!(held <= TOTAL, "the server holds {held} bytes of its own");
        }
        if any {
            quiet_since = None;
        } else {
            quiet_since.get_or_insert_with(Instant::now);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("{sent} sent, {full} refused as full");
    assert!(full > 0 && sent >= 8, "{sent} sent, {full} refused");
    assert!(
        server.sending_bytes() > TOTAL / 2,
        "the stuck messages count"
    );
    for s in &theirs {
        assert!(s.closed().is_none(), "a session closed");
    }
    std::thread::scope(|scope| {
        // Waits for room on the transport: the last session's own traffic is stuck,
        // so only the first's can free it.
        let waiter = scope.spawn(|| {
            server.send(
                &theirs[3],
                payload.clone(),
                Linger::Timeout(Duration::from_secs(10)),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiter.is_finished(), "the send waits for room");
        // The first client takes what it got: its credits come back, the server's
        // queued messages to it go out and complete, and their bytes come back.
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            while let Some(m) = client.recv(&sessions[0], Linger::NoWait).unwrap() {
                assert_eq!(m.bytes(), &payload[..], "intact");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Room came: the message went, or waits for the last client's credits.
        match waiter.join().unwrap() {
            Ok(_) | Err(kiara_ib::Error::Timeout(..)) => {}
            Err(e) => panic!("expected room on the transport: {e}"),
        }
    });
    for s in sessions {
        client.disconnect(s).unwrap();
    }
    let until = Instant::now() + STEP;
    while server.sending_bytes() > 0 {
        assert!(
            Instant::now() < until,
            "{} bytes still held",
            server.sending_bytes()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.unbind().unwrap();
}

/// (k) A peer that accepts no eager messages (its hello offers an eager limit of
/// 0) makes every message to it a read message: a 1-byte message sent from a
/// slice is copied into a 4 KiB pool buffer, and is charged those 4 KiB, not its
/// one byte, against `max_outstanding_bytes_total` (64 KiB here). The client
/// takes nothing, so after its 8 credits the server's messages queue: the count
/// stays a whole number of buffers within the total, and sends beyond it fail
/// with `Full` (charged a byte each, 256 would have queued per session).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_tiny_messages_to_a_peer_without_eager_are_charged_their_buffers() {
    const TOTAL: u64 = 64 * 1024;
    const BUFFER: u64 = 4096;
    let server = Transport::new(Config {
        max_outstanding_bytes_total: TOTAL,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        credits: 8,
        eager_threshold: 0,
        ..Config::default()
    });
    let (mut ours, mut theirs) = connected(&server, &client, addr, 1);
    let (session, theirs) = (ours.remove(0), theirs.remove(0));
    let deadline = Instant::now() + STEP;
    let (mut sent, mut quiet_since) = (0u64, None::<Instant>);
    while quiet_since.is_none_or(|t| t.elapsed() < Duration::from_secs(1)) {
        assert!(Instant::now() < deadline, "sent {sent}");
        match server.send(&theirs, &[sent as u8][..], Linger::NoWait) {
            Ok(_) => (sent, quiet_since) = (sent + 1, None),
            Err(kiara_ib::Error::Full) => {
                quiet_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("a send failed other than full: {e}"),
        }
        let held = server.sending_bytes();
        assert!(held <= TOTAL, "{held} bytes held after {sent} sends");
    }
    let held = server.sending_bytes();
    eprintln!("{sent} sent, {held} bytes held");
    assert_eq!(held % BUFFER, 0, "charged whole buffers: {held}");
    assert!(held > TOTAL / 2, "the queued messages count: {held}");
    assert!(
        sent <= 8 + TOTAL / BUFFER,
        "{sent} one-byte messages went: more than the credits and the total's buffers"
    );
    // The client takes them all, in order and intact; every byte comes back.
    let mut got = 0u64;
    while got < sent {
        assert!(Instant::now() < deadline, "took {got} of {sent}");
        match client.recv(&session, Linger::Timeout(Duration::from_secs(5))) {
            Ok(Some(m)) => {
                assert_eq!(m.bytes(), &[got as u8][..], "message {got}");
                got += 1;
            }
            Ok(None) => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    while server.sending_bytes() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still held",
            server.sending_bytes()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

/// (l) A peer that announces a read message and then stops answering READs: its
/// queue pair is destroyed while its bootstrap connection stays open, so its host
/// looks alive, and Soft-RoCE retries the server's READ for ever (retry count 7).
/// The message holds 1 MiB of the transport's budget meanwhile. The session closes
/// once the READ has taken `ack_timeout`, naming the message, and the budget comes
/// back.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_l_a_message_that_cannot_be_read_times_out() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let log = Arc::new(Log::default());
    let server = Transport::with_logger(
        Config {
            ack_timeout: TIMEOUT,
            ..Config::default()
        },
        log.sink(),
    );
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let dev = Device::open();
    let mut peer = RawPeer::connect(&dev, addr);
    let me = peer.me();
    // A real region, so that a READ that comes before the queue pair goes is not
    // refused (which would close the session at once): 1 MiB takes the guest far
    // longer to read than the peer takes to destroy its queue pair.
    let region =
        MemoryRegion::new(&dev.pd, MIB, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let h = Control {
        msg_id: peer.take_id(),
        len: MIB as u64,
        addr: region.addr(),
        rkey: region.rkey(),
        ..Control::default()
    };
    // The peer's queue pair goes while the server reads; its socket stays.
    let tcp = peer.tcp.try_clone().unwrap();
    peer.send_control(Kind::Data, h, &[], &[]);
    drop(peer);
    let deadline = Instant::now() + STEP;
    while server.receiving_bytes() != MIB as u64 {
        assert!(
            Instant::now() < deadline,
            "the descriptor was never charged (held {} bytes); the server logged {:#?}",
            server.receiving_bytes(),
            log.lines.lock()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let charged = Instant::now();
    let tag = format!("({me})");
    let line = log.wait_for("the stuck read's close", |l| {
        l.contains(&tag) && l.contains(" closed: ")
    });
    let after = charged.elapsed();
    eprintln!("after {after:?}: {line}");
    assert!(
        line.contains("message 1 could not be read within 3s"),
        "{line}"
    );
    // Timed from the server's first sweep after the charge (50 ms apart at most).
    assert!(
        after + Duration::from_millis(100) >= TIMEOUT,
        "closed before the timeout: {after:?}"
    );
    assert_eq!(server.receiving_bytes(), 0, "the budget came back");
    drop(tcp);
    server.unbind().unwrap();
}

/// (g) A peer that never acknowledges: it asks for 48 messages of 1 MiB (and
/// returns every credit, so credits are not what stops the server), reads one as
/// granted, and acknowledges none. The server may hold at most
/// `max_outstanding_bytes` of them (4 MiB here): its other sends fail with
/// `Error::Full`, the attacker is announced no more than that, and the memory this
/// process has pinned grows by far less than the 48 MiB asked for. After
/// `ack_timeout` the server closes the session, naming the message; the windows go
/// with it (a READ with a key that was live fails).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_g_a_peer_that_never_acks_is_capped_and_cut_off() {
    const ASKED: u64 = 48;
    const CAP: u64 = 4 * MIB as u64;
    const ACK_TIMEOUT: Duration = Duration::from_secs(20);
    let config = Config {
        max_outstanding_bytes: CAP,
        ack_timeout: ACK_TIMEOUT,
        ..Config::default()
    };
    with_victims(config, Plant::Keep, |server, dev| {
        let mut peer = RawPeer::connect(dev, server.addr);
        let pinned_before = pinned_bytes();
        // No descriptor can have been posted before this.
        let asked_at = Instant::now();
        // The first bait is read as granted at once (the positive control), long
        // before the ACK timeout.
        let first = peer.request_bait(Mode::Pooled, MIB, 500);
        peer.read_granted(&first, "an unacknowledged bait");
        for tag in 1..ASKED {
            peer.ask_bait(Mode::Pooled, MIB, 500 + tag);
            // Whatever arrived, its credits go back at once.
            while peer.poll_once() {}
            peer.return_credits();
        }
        let mut accepted = Vec::new();
        for tag in 0..ASKED {
            match server.give(500 + tag) {
                Ok(handle) => accepted.push((tag, handle)),
                Err(e) => assert!(
                    e.contains("full") || e.contains("did not acknowledge"),
                    "bait {tag}: {e}"
                ),
            }
        }
        eprintln!(
            "{} of {ASKED} messages taken, {:?} after the first request",
            accepted.len(),
            asked_at.elapsed()
        );
        let pinned_growth = pinned_bytes().saturating_sub(pinned_before);
        eprintln!("pinned memory grew by {pinned_growth} bytes");
        assert!(
            !accepted.is_empty() && accepted.len() as u64 * MIB as u64 <= CAP,
            "VULNERABLE: the server took {} messages of 1 MiB for a peer that acknowledges \
             none (cap {CAP} bytes)",
            accepted.len()
        );
        assert!(
            pinned_growth < 24 * MIB as u64,
            "VULNERABLE: pinned memory grew by {pinned_growth} bytes while the peer \
             acknowledged nothing (cap {CAP})"
        );
        // Every accepted message is announced (its credits returned); nothing more is.
        let mut announced = vec![first];
        for (tag, _) in &accepted[1..] {
            announced.push(peer.bait_descriptor(500 + tag));
            peer.return_credits();
        }
        let total: u64 = announced.iter().map(|d| d.len).sum();
        assert!(
            total <= CAP,
            "{total} bytes announced over the cap of {CAP}"
        );
        let line = server.closed(peer.me(), "did not acknowledge message");
        let waited = asked_at.elapsed();
        eprintln!("after {waited:?}: server log: {line}");
        assert!(
            waited >= ACK_TIMEOUT,
            "cut off {waited:?} after the first request, before the ACK timeout of \
             {ACK_TIMEOUT:?}: {line}"
        );
        for (tag, handle) in accepted {
            let r = handle.wait(Some(STEP));
            assert!(
                r.is_err(),
                "bait {tag} finished although never acknowledged"
            );
        }
        assert!(peer.closed_by_server(), "the connection was left open");
        // Nothing was announced beyond the accepted messages.
        while peer.poll_once() {}
        let extra = peer.inbox.iter().filter(|m| m.kind == Kind::Data).count();
        assert_eq!(extra, 0, "descriptors beyond the accepted messages");
        // The window died with the session.
        let got = peer.read(announced[0].remote());
        assert_ne!(
            got.status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "VULNERABLE: a window outlived its session"
        );
        eprintln!(
            "a READ through a window of the closed session: {}",
            rdma_safe::cq::status_text(got.status)
        );
    });
}

/// Issue 13, 5(a): a handshake that finishes after the transport shut down (`unbind`
/// does not wait for handshakes) leaves no session behind: the server refuses it
/// with the reason, closes the bootstrap connection, and its queue pair is gone
/// before the buffers its receives were posted into. A SEND to that queue pair finds
/// no one (transport retries exhausted): never a success into a session nobody
/// serves, and never a remote error from a receive into freed memory.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_handshake_finished_after_unbind_leaves_no_queue_pair_behind() {
    let dev = Device::open();
    let log = Arc::new(Log::default());
    let server = Transport::with_logger(Config::default(), log.sink());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let mut unbound = None;
    // The server has created its queue pair and posted its receives (its hello came),
    // and waits for our ready byte when it is unbound.
    let mut peer = RawPeer::handshake(&dev, addr, |_| {}, |_| unbound = Some(server.unbind()))
        .unwrap_or_else(|me| panic!("the server dropped {me} before the ready bytes"));
    unbound
        .expect("unbind ran")
        .expect("unbind with a handshake in progress");
    let me = peer.me();
    let line = log.wait_for(&format!("refusing {me}"), |l| {
        l.contains(&format!("connection from {me} refused"))
    });
    assert!(
        line.contains("shut down"),
        "the refusal names the shutdown: {line}"
    );
    assert!(
        peer.closed_by_server(),
        "the server closed the bootstrap connection"
    );
    assert!(server.sessions().is_empty(), "no session: {server:?}");
    let started = Instant::now();
    let status = peer.send_raw(&[0u8; CONTROL_HEADER_LEN]);
    assert_eq!(
        status,
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
        "a SEND to the refused session's queue pair must find no queue pair \
         (after {:?})",
        started.elapsed()
    );
}

/// (m) A peer that sends messages of every size class, one class after another,
/// leaves the server's registration cache no larger than `pool_keep_bytes` (4 MiB
/// here) for all classes together. It was a limit per class, at least two buffers
/// each, so sizes up to 16 MiB kept about 32 MiB registered for good, and with a
/// larger `max_message` gigabytes. Every message still arrives intact, those too
/// large to keep registered anew each time; the client's cache is bounded alike.
/// A cache that one size filled makes room for another: a steady stream of it
/// registers nothing after its first message.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_m_messages_of_every_size_keep_no_more_cached_than_the_pool_may() {
    const KEEP: usize = 4 * MIB;
    let config = Config {
        pool_keep_bytes: KEEP,
        ..Config::default()
    };
    let server = Transport::new(config.clone());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(config);
    let (mut ours, mut theirs) = connected(&server, &client, addr, 1);
    let (session, theirs) = (ours.remove(0), theirs.remove(0));
    // One message a class from 8 KiB to 16 MiB (each just over a power of two,
    // so that it takes the next class), twice over.
    let sizes: Vec<usize> = (12..24).map(|c| (1usize << c) + 1).collect();
    for round in 0..2u64 {
        for (i, &len) in sizes.iter().enumerate() {
            let payload = noise(round * 100 + i as u64, len);
            client
                .send(&session, payload.clone(), Linger::Block)
                .unwrap_or_else(|e| panic!("sending {len} bytes: {e}"));
            let got = server
                .recv(&theirs, Linger::Timeout(STEP))
                .unwrap_or_else(|e| panic!("receiving {len} bytes: {e}"))
                .unwrap_or_else(|| panic!("no message of {len} bytes"));
            assert_eq!(got.bytes(), &payload[..], "{len} bytes intact");
        }
    }
    // The buffers went back to the pools as the messages were taken and released.
    let settled = || {
        let until = Instant::now() + Duration::from_secs(5);
        while client.sending_bytes() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    settled();
    for (side, t) in [("server", &server), ("client", &client)] {
        let cached = t.pooled_bytes();
        eprintln!(
            "{side}: {cached} bytes in {} buffers cached",
            t.pooled_buffers()
        );
        assert!(cached <= KEEP, "the {side} caches {cached} bytes");
        assert!(
            cached > 0,
            "the {side} caches nothing: a steady size would register anew"
        );
    }
    // Two messages of 2 MiB buffers in flight at once fill both caches; a steady
    // stream of another size still registers nothing after its first message:
    // its buffer takes the room of one that the cache held.
    let big: Vec<Vec<u8>> = (0..2).map(|i| noise(300 + i, MIB + 1)).collect();
    for b in &big {
        client.send(&session, b.clone(), Linger::NoWait).unwrap();
    }
    // Both held at once, so that the second cannot reuse the first's buffer.
    let got: Vec<Message> = big
        .iter()
        .map(|b| {
            let got = server
                .recv(&theirs, Linger::Timeout(STEP))
                .unwrap()
                .unwrap();
            assert_eq!(got.bytes(), &b[..], "2 MiB buffer intact");
            got
        })
        .collect();
    drop(got);
    settled();
    assert_eq!(
        server.pooled_bytes(),
        KEEP,
        "the big buffers fill the cache"
    );
    let mut registered = (0, 0);
    for i in 0..20u64 {
        let payload = noise(400 + i, 5000);
        client
            .send(&session, payload.clone(), Linger::Block)
            .unwrap();
        let got = server
            .recv(&theirs, Linger::Timeout(STEP))
            .unwrap()
            .unwrap();
        assert_eq!(got.bytes(), &payload[..], "message {i} intact");
        drop(got);
        settled();
        let now = (server.registrations(), client.registrations());
        if i > 0 {
            assert_eq!(
                now, registered,
                "message {i} of a steady size registered memory"
            );
        }
        registered = now;
    }
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

/// Clients that finish the TCP handshake but whose queue pairs never speak (an
/// attacker holding sessions with nothing but TCP connections) are closed once the
/// handshake's `timeout` has passed without their greeting, and their session
/// places are free again; a client that greeted keeps its session.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_n_sessions_whose_queue_pairs_never_speak_are_closed() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let server = Server::start(Config {
        timeout: TIMEOUT,
        max_sessions: 3,
        ..Config::default()
    });
    let dev = Device::open();
    let mut greeted = RawPeer::connect(&dev, server.addr);
    let start = Instant::now();
    let mut silent: Vec<RawPeer> = (0..2)
        .map(|_| RawPeer::handshake(&dev, server.addr, |_| {}, |_| {}).expect("handshake"))
        .collect();
    let handshaken = Instant::now();
    // They hold every place meanwhile.
    let client = Transport::new(Config::default());
    let refused = client.connect(server.addr);
    assert!(refused.is_err(), "a fourth session was accepted");

    for peer in &mut silent {
        let line = server.closed(peer.me(), "did not answer over RDMA within 3s");
        assert!(
            peer.closed_by_server(),
            "{line}: bootstrap connection left open"
        );
    }
    let took = start.elapsed();
    let since = handshaken.elapsed();
    assert!(
        took >= TIMEOUT && since < TIMEOUT + Duration::from_secs(2),
        "closed {took:?} after the first handshake, {since:?} after the last: not at \
         the timeout"
    );

    // The places are free: a client connects and is served.
    let s = client
        .connect(server.addr)
        .expect("a client connects after them");
    let msg = Message::new(noise(1, 100))
        .with_meta(b"ECHO\0\0\0\0\0\0\0\x01")
        .unwrap();
    client.send(&s, msg, Linger::Timeout(STEP)).unwrap();
    let reply = client
        .recv(&s, Linger::Timeout(STEP))
        .unwrap()
        .expect("echo");
    assert_eq!(
        reply.bytes(),
        &noise(1, 100)[..],
        "the echo came back intact"
    );
    // The client that greeted still has its session, past the deadline.
    greeted.send_control(Kind::Credit, Control::default(), &[], &[]);
    assert!(
        !server
            .log
            .lines
            .lock()
            .iter()
            .any(|l| l.contains(&format!("({})", greeted.me()))),
        "the session that greeted was closed"
    );
    client.disconnect(s).unwrap();
    drop(greeted);
    server.finish();
}
