//! The device side of a transport: one device context and protection domain, the
//! buffer pool, the completion channel every session's CQ reports to, the poller
//! thread that reaps completions and watches the bootstrap sockets, and the
//! callback runners (see [`crate::runners`]).

use crate::budget::SharedBudget;
use crate::config::Config;
use crate::conn::{Conn, Drained, Event, Receives, INLINE_BYTES, READS_IN_FLIGHT, WINDOWS};
use crate::error::CloseReason;
use crate::error::{Error, Result};
use crate::line_limit::LineLimit;
use crate::message::Message;
use crate::pool::BufferPool;
use crate::protocol::{Hello, Limits, HELLO_HEADER_LEN, HELLO_MAX_BODY_LEN, SLOT_OVERHEAD};
use crate::shared_recv::SharedRecv;
use crate::slots::SlotSlab;
use crate::waiting::Ticker;
use parking_lot::Mutex;
use rdma_safe::qp::{Init, Rts};
use rdma_safe::Deadline;
use rdma_safe::{
    Access, CompletionChannel, CompletionQueue, Context, Gid, InitAttr, MemoryRegion,
    ProtectionDomain, QpConfig, QueuePair, RtrAttr, RtsAttr, WorkCompletion,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the deliveries a spinning thread reaps itself go.
#[derive(Clone, Copy)]
pub(crate) enum Catch<'a> {
    /// The usual way: the inbox, or the session's callback queue (a session that
    /// becomes scheduled goes on the runners' ready list).
    Route,
    /// A waiting `recv` takes the message, when nothing is queued ahead of it.
    Message(&'a RefCell<Option<Message>>),
    /// A spinning callback runner takes the session a delivery scheduled, and runs
    /// its callback itself: no trip through the ready list.
    Session(&'a RefCell<Option<Arc<Conn>>>),
}

/// Called for every message a session receives, when a callback is registered.
pub(crate) type Deliver = Arc<dyn Fn(Arc<Conn>, Message) + Send + Sync>;

/// What a wait's spin read of the clock: when it began and its last reading, and
/// whether the wait ended while spinning.
#[derive(Clone, Copy)]
struct Spun {
    began: Instant,
    last: Instant,
    ended_ready: bool,
}

impl Spun {
    /// A first reading, now.
    fn now(ended_ready: bool) -> Spun {
        let now = Instant::now();
        Spun {
            began: now,
            last: now,
            ended_ready,
        }
    }
}

/// Runs a callback, containing its panic so that delivery goes on for everyone else.
pub(crate) fn run_callback(deliver: &Deliver, conn: Arc<Conn>, msg: Message) {
    let id = conn.id;
    let run = std::panic::AssertUnwindSafe(|| deliver(conn, msg));
    if std::panic::catch_unwind(run).is_err() {
        eprintln!("kiara-ib: the callback panicked on a message of session {id}");
    }
}

/// Device objects and threads shared by all sessions of a transport.
pub(crate) struct Engine {
    /// This engine, for the runner threads it starts (they hold no strong reference
    /// while they sleep).
    pub(crate) me: std::sync::Weak<Engine>,
    /// Runners spinning over the completion queues right now (capped: see
    /// [`crate::waiting::max_spinners`]).
    pub(crate) spinners: AtomicUsize,
    /// The threads that run the callback.
    pub(crate) runners: Arc<crate::runners::Runners>,
    pub(crate) config: Config,
    ctx: Arc<Context>,
    pd: Arc<ProtectionDomain>,
    pub(crate) channel: Arc<CompletionChannel>,
    pub(crate) pool: Arc<BufferPool>,
    /// Bytes of the peers' read messages all sessions hold, against
    /// `Config::max_receiving_bytes_total`.
    pub(crate) receiving: Arc<SharedBudget>,
    /// Bytes of our read messages all sessions have queued or in flight, against
    /// `Config::max_outstanding_bytes_total`.
    pub(crate) sending: Arc<SharedBudget>,
    /// The shared receive queue accepted sessions receive into, if configured.
    pub(crate) shared_recv: Option<Arc<SharedRecv>>,
    gid: Gid,
    gid_index: u32,
    lid: u16,
    mtu: rdma_safe::sys::ibv_mtu,
    rd_atomic: u8,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Changed (under the `conns` lock) whenever `conns` is: runners refresh their
    /// list of sessions only then.
    conns_gen: AtomicU64,
    next_id: AtomicU64,
    pub(crate) stop: AtomicBool,
    poller: Mutex<Option<JoinHandle<()>>>,
    /// The callback, run by the runners; `None`: messages go to the session inbox
    /// (`recv`).
    deliver: Mutex<Option<Deliver>>,
    /// Counts the changes of `deliver` (made under its lock): a runner keeps the
    /// callback it read while this stays the same.
    deliver_gen: AtomicU64,
    /// Whether `deliver` was ever set (looked at without the lock).
    dispatching: AtomicBool,
    log: Log,
    /// Lines about sessions (closes and notes), at most `Config::log_lines_per_second`.
    session_lines: Arc<LineLimit>,
}

/// `config` with the choices left to the device made: resolved once, so every
/// session of the device does the same.
fn for_device(mut config: Config, soft_roce: bool) -> Config {
    config.serialize_binds = Some(config.serialize_binds.unwrap_or(soft_roce));
    config.invalidating_acks = Some(config.invalidating_acks.unwrap_or(!soft_roce));
    config.confirm_reads = Some(config.confirm_reads.unwrap_or(soft_roce));
    config
}

/// Where the transport's log lines go (`Transport::with_logger`).
pub(crate) type Log = Arc<dyn Fn(&str) + Send + Sync>;

impl Engine {
    /// Opens the device and starts the poller thread.
    pub(crate) fn start(config: Config, log: Log) -> Result<Arc<Engine>> {
        config.validate().map_err(|e| Error::Usage(e.into()))?;
        // From the configuration only: a library does not read the environment.
        let selection = rdma_safe::Selection {
            device: config.device.clone(),
            port: config.port,
            gid_index: config.gid_index,
        };
        let sel = selection.open()?;
        let (gid_index, gid) = match sel.gid {
            Some(pair) => pair,
            None => (0, sel.ctx.query_gid(config.port, 0)?),
        };
        let (ctx, port) = (sel.ctx, sel.port);
        let attr = ctx.query_device()?;
        let config = for_device(config, attr.is_soft_roce());
        let rd_atomic = attr
            .raw()
            .max_qp_rd_atom
            .min(attr.raw().max_qp_init_rd_atom)
            .clamp(1, READS_IN_FLIGHT as i32) as u8;
        let pd = ProtectionDomain::new(&ctx)?;
        let channel = CompletionChannel::new(&ctx)?;
        let pool = BufferPool::new(&pd, config.pool_keep_bytes);
        let mtu = port.active_mtu();
        let shared_recv = match config.shared_receive_slots {
            0 => None,
            n => Some(SharedRecv::new(
                &ctx,
                &channel,
                &pd,
                n,
                shared_slot_size(&config, mtu),
            )?),
        };
        let (shared, reserve) = config.receiving_split();
        let receiving = Arc::new(SharedBudget::with_reserve(shared, reserve));
        let sending = Arc::new(SharedBudget::new(config.max_outstanding_bytes_total));
        let session_lines = Arc::new(LineLimit::new(
            config.log_lines_per_second,
            "lines about sessions",
            log.clone(),
        ));
        let engine = Arc::new_cyclic(|me| Engine {
            me: me.clone(),
            receiving,
            sending,
            spinners: AtomicUsize::new(0),
            runners: crate::runners::Runners::new(),
            config,
            pool,
            shared_recv,
            gid,
            gid_index,
            lid: port.lid(),
            mtu,
            rd_atomic,
            ctx,
            pd,
            channel,
            conns: Mutex::new(HashMap::new()),
            conns_gen: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            poller: Mutex::new(None),
            deliver: Mutex::new(None),
            deliver_gen: AtomicU64::new(0),
            dispatching: AtomicBool::new(false),
            log,
            session_lines,
        });
        let weak = Arc::downgrade(&engine);
        let handle = std::thread::Builder::new()
            .name("kiara-poller".into())
            .spawn(move || crate::poller::poll_loop(weak))
            .map_err(|e| Error::io("starting the poller thread", e))?;
        *engine.poller.lock() = Some(handle);
        Ok(engine)
    }

    /// Logs a line through the configured logger.
    pub(crate) fn log(&self, line: &str) {
        (self.log)(line);
    }

    /// The configured logger, for lines that keep their own limit.
    pub(crate) fn logger(&self) -> Log {
        self.log.clone()
    }

    /// Logs a line about a session (a close, a note), within
    /// `Config::log_lines_per_second`.
    pub(crate) fn session_line(&self, line: &str) {
        self.session_lines.line(line);
    }

    /// Writes the summary of the session lines a window held once it has ended.
    pub(crate) fn look_at_session_lines(&self) {
        self.session_lines.look();
    }

    /// [`Engine::session_line`] as a logger, for a session's own lines. A session
    /// that outlives the engine (its handles are the application's) logs its lines
    /// as they come.
    fn session_log(&self) -> Log {
        let lines = Arc::downgrade(&self.session_lines);
        let log = self.log.clone();
        Arc::new(move |line: &str| match lines.upgrade() {
            Some(lines) => lines.line(line),
            None => log(line),
        })
    }

    /// Routes received messages to `deliver`, run by the callback runners.
    pub(crate) fn set_dispatcher(&self, deliver: Deliver) -> Result<()> {
        self.change_deliverer(Some(deliver));
        self.dispatching.store(true, Ordering::Release);
        self.runners.start(&self.me)
    }

    fn change_deliverer(&self, deliver: Option<Deliver>) {
        let mut slot = self.deliver.lock();
        *slot = deliver;
        self.deliver_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// The callback, if one is set, and the count of changes it is from.
    pub(crate) fn deliverer(&self) -> (u64, Option<Deliver>) {
        let slot = self.deliver.lock();
        (self.deliver_gen.load(Ordering::Acquire), slot.clone())
    }

    /// The count of changes of the callback (see [`Engine::deliverer`]).
    pub(crate) fn deliverer_gen(&self) -> u64 {
        self.deliver_gen.load(Ordering::Acquire)
    }

    /// Refills `out` with the live sessions if they changed since `seen` (which it
    /// updates): no lock and no allocation while they stay the same.
    pub(crate) fn sessions_into(&self, out: &mut Vec<Arc<Conn>>, seen: &mut u64) {
        if self.conns_gen.load(Ordering::Acquire) == *seen {
            return;
        }
        let conns = self.conns.lock();
        *seen = self.conns_gen.load(Ordering::Acquire);
        out.clear();
        out.extend(conns.values().cloned());
    }

    /// Memory registered in the transport's protection domain, for zero-copy sends:
    /// no remote access of its own; a peer reads a message of it through a window.
    pub(crate) fn register(&self, len: usize) -> Result<MemoryRegion> {
        crate::pool::registered(&self.pd, len)
    }

    /// The live sessions (a closed one leaves the engine at the poller's next
    /// sweep, but is not live from the moment it closed).
    pub(crate) fn conns(&self) -> Vec<Arc<Conn>> {
        let mut v: Vec<_> = self
            .conns
            .lock()
            .values()
            .filter(|c| c.closed().is_none())
            .cloned()
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Forgets a closed session.
    pub(crate) fn remove(&self, id: u64) {
        let mut conns = self.conns.lock();
        if conns.remove(&id).is_some() {
            self.conns_gen.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Lets the closed sessions leave (their users still hold them to ask why).
    pub(crate) fn forget_closed(&self) {
        let mut conns = self.conns.lock();
        let before = conns.len();
        conns.retain(|_, c| c.closed().is_none());
        if conns.len() != before {
            self.conns_gen.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The session whose completion queue is `cq`, if it has joined.
    pub(crate) fn conn_by_cq(&self, cq: *mut rdma_safe::sys::ibv_cq) -> Option<Arc<Conn>> {
        let conns = self.conns.lock();
        conns.values().find(|c| c.cq.as_raw() == cq).cloned()
    }

    /// Live (not closed) sessions: what `Config::max_sessions` caps.
    pub(crate) fn live_sessions(&self) -> usize {
        self.live_sessions_with(None).0
    }

    /// Live sessions, and of them those whose peer's address is `ip` (in its
    /// canonical form: what `Config::max_sessions_per_address` caps), in one pass
    /// that takes no session's lock.
    pub(crate) fn live_sessions_with(&self, ip: Option<IpAddr>) -> (usize, usize) {
        let conns = self.conns.lock();
        let live = conns.values().filter(|c| !c.is_closed());
        live.fold((0, 0), |(all, here), c| {
            let from_ip = Some(c.peer.ip().to_canonical()) == ip;
            (all + 1, here + usize::from(from_ip))
        })
    }

    /// Builds a session over a connected bootstrap socket: the hello exchange, queue
    /// pair, buffers, RTR/RTS, and a one-byte "ready" each way so that neither side
    /// sends before the other can receive. The accepting side reads and checks the
    /// client's hello before it creates anything (a client that never says a word
    /// costs it a socket, no device resource); the connecting side writes its hello
    /// first (docs/kiara-protocol.md, section 1).
    pub(crate) fn establish(
        self: &Arc<Self>,
        mut tcp: TcpStream,
        peer: SocketAddr,
        side: Side,
        heard: &dyn Fn(),
    ) -> Result<Arc<Conn>> {
        let c = &self.config;
        // One deadline for the whole handshake (hello and ready), not one per read: a
        // peer dripping a byte at a time is cut off when it has passed.
        let deadline = Deadline::after(c.timeout, "KIARA handshake");
        if side == Side::Connecting {
            self.room_for_a_session()?;
        }
        tcp.set_nodelay(true)
            .and_then(|()| crate::keepalive::enable(&tcp, c.peer_timeout))
            .map_err(|e| Error::io("configuring the bootstrap socket", e))?;
        // The server hears the client out first: nothing is allocated for a peer that
        // has not sent a valid hello.
        let early = match side {
            Side::Accepting => {
                let hello = read_hello(&mut tcp, &deadline)?;
                heard();
                Some(hello)
            }
            Side::Connecting => None,
        };
        // Accepted sessions receive into the shared queue, if there is one; its slots
        // must stay shorter than the path MTU (`shared_slot_size`), so a peer whose
        // MTU is smaller than ours is refused.
        let shared = match (&early, &self.shared_recv) {
            (Some(theirs), Some(pool)) => Some(self.shared_fits(theirs, pool)?),
            _ => None,
        };
        // The slabs before the queue pair: on an early return the QP goes first.
        let (send, send_slots) = SlotSlab::new(&self.pd, c.slot_size(), c.send_slots)?;
        let (recv, cq, qp) = self.new_queues(shared)?;
        // On the shared queue, the peer may have sent before the handshake failed:
        // the queue pair is gone by the time `handshake` returns, and its
        // completions give their slots back.
        let (qp, theirs) = match self.handshake(qp, &recv, &mut tcp, early, &deadline) {
            Ok(done) => done,
            Err(e) => {
                recv.drain();
                return Err(e);
            }
        };
        // Our message size limit applies to what we receive; the peer's to what we send.
        let peer_limits = Limits {
            max_message: theirs.max_message,
            eager_threshold: theirs.eager_threshold,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(
            id,
            peer,
            qp,
            cq,
            tcp,
            recv,
            send,
            send_slots,
            c,
            theirs.credits,
            peer_limits,
            self.pool.clone(),
            [self.receiving.clone(), self.sending.clone()],
            self.session_log(),
        ));
        conn.start(side == Side::Accepting, c.timeout)
            .map_err(Error::Closed)?;
        let conn = self.join(conn)?;
        if side == Side::Connecting {
            self.greeted(&conn, c.timeout)?;
        }
        Ok(conn)
    }

    /// The connecting side: waits up to `within` for the server's queue pair to
    /// acknowledge our greeting, so that a session `connect` returns has been heard
    /// over RDMA (and a bind's gate finds its send queue idle). A queue pair that
    /// never answers closes the session with `CloseReason::Silent`.
    fn greeted(&self, conn: &Arc<Conn>, within: Duration) -> Result<()> {
        // Not recorded as a wait of the session: it would shorten the spins of
        // its first `recv`s (`crate::waiting`).
        let ready = || conn.greeted();
        let spun = self.spin(conn, Some(within), &ready, Catch::Route);
        let spent = spun.map_or(Duration::ZERO, |s| s.last - s.began);
        if !conn.wait_greeted(within.saturating_sub(spent)) {
            conn.close(CloseReason::Silent { after: within });
        }
        let Some(why) = conn.closed() else {
            return Ok(());
        };
        // The caller never gets the session: it leaves at once.
        self.remove(conn.id);
        Err(Error::Closed(why))
    }

    /// Adds a session whose handshake finished to the live ones.
    fn join(&self, conn: Arc<Conn>) -> Result<Arc<Conn>> {
        // A handshake that finishes after the transport shut down (`unbind` does not
        // wait for handshakes) joins nothing: the session drops here, its queue pair
        // before its buffers. Looked at under the lock `shutdown` drains, so a session
        // is either refused here or closed there.
        let mut conns = self.conns.lock();
        if self.stop.load(Ordering::SeqCst) {
            return Err(Error::Closed(CloseReason::Shutdown));
        }
        conns.insert(conn.id, conn.clone());
        self.conns_gen.fetch_add(1, Ordering::AcqRel);
        drop(conns);
        // On the shared queue, what the peer sent before the session existed waits
        // in its mailbox; from now on the reaper drains the session itself.
        if let Some(mailbox) = conn.mailbox() {
            mailbox.attach(&conn);
            if mailbox.has_mail() {
                self.try_progress(&conn, false, Catch::Route);
            }
        }
        Ok(conn)
    }

    /// A session's receives, completion queue and queue pair (in INIT, its own
    /// receive slots posted, or on the shared queue `shared`).
    fn new_queues(
        &self,
        shared: Option<&Arc<SharedRecv>>,
    ) -> Result<(Receives, Arc<CompletionQueue>, QueuePair<Init>)> {
        let c = &self.config;
        // The slab before the queue pair: on an early return the QP goes first.
        let mut own = match shared {
            Some(_) => None,
            None => Some(SlotSlab::new(&self.pd, c.slot_size(), c.credits)?),
        };
        // Receives (at most one per credit; on the shared queue they complete on the
        // pool's CQ instead), SENDs, READs, window invalidations (binds are
        // unsignaled, but flush with the rest when the QP fails).
        let receives = if shared.is_some() { 0 } else { c.credits };
        let depth = receives + c.send_slots + READS_IN_FLIGHT + 2 * WINDOWS + 8;
        let cq = CompletionQueue::with_channel(&self.ctx, depth, &self.channel, 0)?;
        let mut qpc = QpConfig::rc(&cq);
        if let Some(pool) = shared {
            qpc.recv_cq = pool.cq().clone();
        }
        qpc.max_send_wr = c.send_slots + READS_IN_FLIGHT + 2 * WINDOWS + 1;
        qpc.max_recv_wr = c.credits;
        qpc.max_inline_data = INLINE_BYTES;
        qpc.srq = shared.map(|pool| pool.srq().clone());
        let qp = QueuePair::new(&self.pd, &qpc)?
            .to_init(&InitAttr {
                port: c.port,
                access: Access::LOCAL_WRITE | Access::REMOTE_READ,
                ..Default::default()
            })
            .map_err(|t| t.error)?;
        cq.req_notify(false)?;
        // Posted while the slab is still `own`, declared before `qp`: if a post
        // fails, the queue pair (with the receives posted so far) goes first.
        if let Some((slab, slots)) = &mut own {
            for s in std::mem::take(slots) {
                Conn::post_recv_slot(&qp, slab, s)?;
            }
        }
        let recv = match (own, shared) {
            (Some((slab, _)), _) => Receives::own(slab, c.credits),
            (None, Some(pool)) => {
                // Opened last (nothing after it fails, so the mailbox is closed on
                // every way out: `Receives::drain`), while the queue pair cannot
                // receive yet (INIT).
                let qpn = qp.qp_num();
                let mailbox = pool.open(qpn, c.credits, &mut |conn| self.drain_mail(conn));
                Receives::shared(pool.clone(), qpn, mailbox, c.credits)
            }
            (None, None) => unreachable!("a session receives into a slab or the pool"),
        };
        Ok((recv, cq, qp))
    }

    /// The hellos (ours, and the peer's unless `early` has it), RTR/RTS and the
    /// ready bytes. On an error the queue pair is destroyed before this returns.
    fn handshake(
        &self,
        qp: QueuePair<Init>,
        recv: &Receives,
        tcp: &mut TcpStream,
        early: Option<Hello>,
        deadline: &Deadline,
    ) -> Result<(QueuePair<Rts>, Hello)> {
        let c = &self.config;
        let slot = recv.slot_size();
        let psn = rdma_safe::random_psn();
        let mine = Hello {
            qpn: qp.qp_num(),
            psn,
            lid: self.lid,
            mtu: u8::try_from(self.mtu.0).unwrap_or(0),
            gid: Some(self.gid.0),
            credits: c.credits,
            slot_size: slot as u32,
            max_message: c.max_message,
            eager_threshold: (slot - SLOT_OVERHEAD) as u32,
        };
        deadline.write_all(tcp, &mine.encode(), "hello")?;
        let accepting = early.is_some();
        let theirs = match early {
            Some(theirs) => theirs,
            None => read_hello(tcp, deadline)?,
        };
        // The accepting side hears the client's ready byte before its queue pair
        // can receive (RTR): a client that never finishes the handshake lands
        // nothing (on the shared receive queue it would hold slots with no session
        // to cut it off). The connecting side writes its byte without waiting, so
        // neither waits for the other.
        if accepting {
            read_ready(tcp, deadline)?;
        }
        let qp = self.connect_qp(qp, &theirs, psn)?;
        deadline.write_all(tcp, b"R", "ready byte")?;
        if !accepting {
            read_ready(tcp, deadline)?;
        }
        tcp.set_nonblocking(true)
            .map_err(|e| Error::io("configuring the bootstrap socket", e))?;
        Ok((qp, theirs))
    }

    /// `connect` refuses a session beyond `Config::max_sessions` (`bind` refuses
    /// its clients before the handshake).
    fn room_for_a_session(&self) -> Result<()> {
        let max = self.config.max_sessions;
        if self.live_sessions() < max {
            return Ok(());
        }
        Err(Error::Usage(
            format!(
                "max_sessions ({max}) reached: disconnect a session first, or raise \
                 Config::max_sessions"
            )
            .into(),
        ))
    }

    /// The shared receive queue, for a client whose hello is `theirs`: refused if
    /// its MTU is below ours, as the path MTU would then not exceed a slot.
    fn shared_fits<'a>(
        &self,
        theirs: &Hello,
        pool: &'a Arc<SharedRecv>,
    ) -> Result<&'a Arc<SharedRecv>> {
        let ours = u8::try_from(self.mtu.0).unwrap_or(0);
        if theirs.mtu < ours {
            return Err(Error::Usage(
                format!(
                    "the client's MTU (code {}) is below this server's (code {ours}): a \
                     server with a shared receive queue needs the path MTU to exceed its \
                     slots of {} bytes",
                    theirs.mtu,
                    pool.slot_size()
                )
                .into(),
            ));
        }
        Ok(pool)
    }

    /// Moves a new queue pair to RTS towards the peer that sent `theirs`: the
    /// smaller of the two MTUs, our GID index, and our RDMA READ depth both ways.
    fn connect_qp(&self, qp: QueuePair<Init>, theirs: &Hello, psn: u32) -> Result<QueuePair<Rts>> {
        let c = &self.config;
        let mtu = u8::try_from(self.mtu.0).unwrap_or(0).min(theirs.mtu);
        let mut rtr = RtrAttr::new(
            theirs.endpoint(),
            rdma_safe::Mtu::from_code(u32::from(mtu))
                .unwrap_or(rdma_safe::Mtu::B4096)
                .into(),
        );
        rtr.port = c.port;
        rtr.sgid_index = self.gid_index as u8;
        rtr.max_dest_rd_atomic = self.rd_atomic;
        let mut rts = RtsAttr::new(psn);
        rts.max_rd_atomic = self.rd_atomic;
        rts.timeout = c.rc_timeout;
        rts.retry_cnt = c.rc_retries;
        qp.to_rtr(&rtr)
            .map_err(|t| t.error)?
            .to_rts(&rts)
            .map_err(|t| t.error.into())
    }

    /// Stops the poller (after sessions were closed) and the runners.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.runners.stop();
        if let Some(h) = self.poller.lock().take() {
            // The last handle may be dropped by a callback on the poller itself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        self.change_deliverer(None);
        let mut conns = self.conns.lock();
        self.conns_gen.fetch_add(1, Ordering::AcqRel);
        for conn in conns.drain().map(|(_, c)| c) {
            conn.close(CloseReason::Shutdown);
        }
        drop(conns);
        self.session_lines.flush();
    }

    /// Reaps `conn`'s completions on the calling thread (unless the poller is at it)
    /// and routes what they deliver: a waiting caller makes progress itself instead of
    /// waiting for the poller thread to wake up. With `arm`, the CQ's notification is
    /// armed once it is empty (before the caller blocks).
    /// True if some completion was handled.
    pub(crate) fn progress(&self, conn: &Arc<Conn>, arm: bool, catch: Catch<'_>) -> bool {
        self.try_progress(conn, arm, catch)
            .is_some_and(|d| d.active)
    }

    /// Reaps the shared receive queue's CQ, if the transport has one and no other
    /// thread is at it, and drains the sessions it routed receives to; with `arm`,
    /// arms its notification once it is empty. True if it found anything.
    pub(crate) fn reap_shared(&self, arm: bool) -> bool {
        let Some(pool) = &self.shared_recv else {
            return false;
        };
        pool.reap(arm, &mut |conn| self.drain_mail(conn)) == Some(true)
    }

    /// Drains a session the shared CQ routed receives to (the spinning runners
    /// look at it again).
    fn drain_mail(&self, conn: &Arc<Conn>) {
        conn.heat.warm();
        self.try_progress(conn, false, Catch::Route);
    }

    /// [`Engine::progress`]; `None` if another thread had the queue (nothing was
    /// reaped or armed). A session on the shared receive queue gets its receives
    /// from the pool's reaper (see [`Engine::reap_shared`]).
    pub(crate) fn try_progress(
        &self,
        conn: &Arc<Conn>,
        arm: bool,
        catch: Catch<'_>,
    ) -> Option<Drained> {
        /// Reused by every spin of a thread: no allocation or zeroing per round.
        struct Scratch {
            wcs: [WorkCompletion; 16],
            events: Vec<Event>,
        }
        thread_local! {
            static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
                wcs: [WorkCompletion::default(); 16],
                events: Vec::with_capacity(16),
            });
        }
        // A message for a `recv` that waits on this thread goes straight to it when
        // nothing is queued ahead of it (every delivery of this session happens
        // under the drain lock, so the order holds).
        let mut route = |ev: Event| match (ev, catch) {
            (Event::Delivered(msg), Catch::Message(slot))
                if slot.borrow().is_none() && !conn.has_queued() =>
            {
                *slot.borrow_mut() = Some(msg);
            }
            (Event::Delivered(msg), Catch::Session(slot)) => self.deliver(conn, msg, Some(slot)),
            (ev, _) => self.route(conn, ev),
        };
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                let Scratch { wcs, events } = &mut *scratch;
                conn.try_drain(wcs, events, arm, &mut route)
            }
            // Re-entered from a callback: fresh scratch space is correct, just not free.
            Err(_) => {
                let mut wcs = [WorkCompletion::default(); 16];
                let mut events = Vec::new();
                conn.try_drain(&mut wcs, &mut events, arm, &mut route)
            }
        })
    }

    /// The next message of `conn` (a session without a callback), waiting up to
    /// `timeout`: spins first (see [`Engine::spin`]), taking a message it reaps
    /// itself without the trip through the inbox.
    pub(crate) fn recv(
        &self,
        conn: &Arc<Conn>,
        timeout: Option<Duration>,
    ) -> crate::error::Result<Option<Message>> {
        let caught = RefCell::new(None);
        self.wait_catching(
            conn,
            timeout,
            &|| caught.borrow().is_some() || conn.has_news(),
            Catch::Message(&caught),
            |left| match caught.take() {
                Some(msg) => {
                    conn.took_one();
                    Ok(Some(msg))
                }
                None => conn.recv(left),
            },
        )
    }

    /// Delivers a message or logs a closed session.
    pub(crate) fn route(&self, conn: &Arc<Conn>, ev: Event) {
        match ev {
            Event::Delivered(msg) => self.deliver(conn, msg, None),
            Event::Closed(reason) => self.session_line(&conn.close_line(&reason)),
            Event::Noted(line) => self.session_line(&line),
        }
    }

    /// Waits until `ready`, for at most `timeout` (`None`: forever): reaps `conn`'s
    /// completions on this thread for a while (see [`Engine::spin`]), then calls
    /// `block(time left)`, which sleeps on the caller's condition. A wait that ends
    /// while spinning never reads the clock (a system call on some machines).
    pub(crate) fn wait<R>(
        &self,
        conn: &Arc<Conn>,
        timeout: Option<Duration>,
        ready: &dyn Fn() -> bool,
        block: impl FnOnce(Option<Duration>) -> R,
    ) -> R {
        self.wait_catching(conn, timeout, ready, Catch::Route, block)
    }

    /// [`Engine::wait`], handing a message the spinning reaps to `catch` (see
    /// [`Engine::progress`]).
    fn wait_catching<R>(
        &self,
        conn: &Arc<Conn>,
        timeout: Option<Duration>,
        ready: &dyn Fn() -> bool,
        catch: Catch<'_>,
        block: impl FnOnce(Option<Duration>) -> R,
    ) -> R {
        let spun = self.spin(conn, timeout, ready, catch);
        // Time spent spinning, from the spin's own clock readings: a wait that
        // ended while spinning reads the clock no more (8 µs a reading on a
        // machine whose clock is an emulated HPET).
        let spent = spun.map_or(Duration::ZERO, |s| s.last - s.began);
        let left = timeout.map(|t| t.saturating_sub(spent));
        let result = block(left);
        let waited = match spun {
            Some(s) if !s.ended_ready => s.began.elapsed(),
            _ => spent,
        };
        conn.waiting.record(waited);
        result
    }

    /// Reaps `conn`'s completions on the calling thread while `ready` is false, for
    /// up to the spin budget (see [`crate::waiting`]) or `timeout`. If `ready` is
    /// still false, the CQ is left armed so that the poller wakes the caller, who
    /// blocks next. The clock is read about eight times over the spin
    /// ([`Ticker`]): `None` if it never was.
    fn spin(
        &self,
        conn: &Arc<Conn>,
        timeout: Option<Duration>,
        ready: &dyn Fn() -> bool,
        catch: Catch<'_>,
    ) -> Option<Spun> {
        let budget = conn.waiting.spin_budget(self.config.busy_poll);
        let limit = timeout.map_or(budget, |t| t.min(budget));
        // Every waiting thread may spin (capping them per transport, as the
        // runners are, was measured twice and made 4 clients slower with no
        // better tail: docs/performance-history.md).
        if limit.is_zero() {
            self.progress(conn, false, catch);
            if ready() {
                return None;
            }
            self.progress(conn, true, catch);
            return Some(Spun::now(false));
        }
        let spinning = conn.waiting.spinning();
        // A session on the shared receive queue: its receives are on the pool's CQ.
        let shared = conn.mailbox().is_some();
        // About eight looks at the clock over the spin.
        let mut ticker = Ticker::new(&conn.waiting.pace, limit / 8);
        let mut clock: Option<Spun> = None;
        while !ready() {
            if shared {
                self.reap_shared(false);
            }
            self.progress(conn, false, catch);
            if let Some(now) = ticker.round() {
                let c = clock.get_or_insert(Spun {
                    began: now,
                    last: now,
                    ended_ready: true,
                });
                c.last = now;
                if now >= c.began + limit {
                    break;
                }
            }
            if ticker.yield_due() {
                // Let a thread that was woken run: on a busy core it would
                // otherwise wait for this one's time slice to end.
                std::thread::yield_now();
            }
            // No `spin_loop` (PAUSE): each round polls the queue through the
            // provider, as C verbs loops do without one. Under QEMU's TCG a PAUSE
            // leaves the translated code: 3.5% of the round trip (docs/performance-history.md).
        }
        drop(spinning);
        if ready() {
            return clock;
        }
        self.progress(conn, true, catch);
        let mut spun = clock.unwrap_or_else(|| Spun::now(false));
        spun.ended_ready = false;
        Some(spun)
    }

    /// Delivers a message to the inbox, or to the callback's queue. A session
    /// that was idle goes on the runners' ready list, or to `keep` when that is
    /// empty (a spinning runner runs its turn then).
    fn deliver(&self, conn: &Arc<Conn>, msg: Message, keep: Option<&RefCell<Option<Arc<Conn>>>>) {
        if !self.dispatching.load(Ordering::Acquire) {
            return conn.push_inbox(msg);
        }
        // The session's queue keeps its messages in order.
        match conn.callbacks.push(msg) {
            Ok(crate::callback_queue::Pushed::Schedule) => match keep {
                Some(keep) if keep.borrow().is_none() => *keep.borrow_mut() = Some(conn.clone()),
                _ => self.runners.schedule(conn.clone()),
            },
            Ok(crate::callback_queue::Pushed::Queued) => {}
            // The session closed in the batch that delivered it: no callback will
            // run, and with a callback registered no `recv` may take it. Dropped,
            // and counted as taken, so that its buffer and its share of the
            // transport's budget come back now.
            Err(msg) => {
                drop(msg);
                conn.consumed();
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.runners.stop();
    }
}

/// Which end of the bootstrap connection a handshake runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// `connect`: writes its hello first, then reads the server's.
    Connecting,
    /// `bind`'s accept loop: reads and checks the client's hello first, then creates
    /// the queue pair and its buffers and answers.
    Accepting,
}

/// Reads the peer's ready byte `R`. Each side writes its own once its queue pair
/// is in RTS, so neither sends before the other can receive; the accepting side
/// reads the client's before its queue pair leaves INIT ([`Engine::handshake`]).
fn read_ready(tcp: &mut TcpStream, deadline: &Deadline) -> Result<()> {
    let mut ready = [0u8; 1];
    deadline.read_exact(tcp, &mut ready, "ready byte")?;
    if ready != *b"R" {
        return Err(Error::Protocol(crate::protocol::ProtocolError(format!(
            "expected the ready byte 'R', got {:#04x}",
            ready[0]
        ))));
    }
    Ok(())
}

/// Bytes per slot of the shared receive queue: the configured slot size, but one
/// byte less than the port's MTU at most. A SEND that does not fit a slot then
/// fails on its first packet (a full MTU), and no peer can leave a shared slot half
/// written: Soft-RoCE in Linux 6.1 never completes a shared receive its queue pair
/// had begun when that queue pair fails, so the slot would be lost.
fn shared_slot_size(config: &Config, mtu: rdma_safe::sys::ibv_mtu) -> usize {
    let mtu_bytes = rdma_safe::Mtu::from_code(mtu.0).map_or(256, |m| m.bytes() as usize);
    config.slot_size().min(mtu_bytes - 1)
}

/// Reads and checks the peer's hello (every field bounded: `Hello::decode_body`),
/// before `deadline`.
fn read_hello(tcp: &mut TcpStream, deadline: &Deadline) -> Result<Hello> {
    let mut header = [0u8; HELLO_HEADER_LEN];
    deadline.read_exact(tcp, &mut header, "hello header")?;
    let len = Hello::decode_header(&header)?;
    let mut body = [0u8; HELLO_MAX_BODY_LEN];
    deadline.read_exact(tcp, &mut body[..len], "hello body")?;
    Ok(Hello::decode_body(&body[..len])?)
}
