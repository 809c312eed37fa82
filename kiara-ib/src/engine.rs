//! The device side of a transport: one device context and protection domain, the
//! buffer pool, the completion channel every session's CQ reports to, the poller
//! thread that reaps completions and watches the bootstrap sockets, and the
//! callback runners (see [`crate::runners`]). A session is established over its
//! bootstrap connection in `establish`.

mod establish;

pub(crate) use establish::Side;

use crate::budget::SharedBudget;
use crate::config::Config;
use crate::conn::{Conn, Drained, Event, READS_IN_FLIGHT};
use crate::error::CloseReason;
use crate::error::{Error, Result};
use crate::line_limit::LineLimit;
use crate::message::Message;
use crate::pool::BufferPool;
use crate::shared_recv::SharedRecv;
use crate::waiting::Ticker;
use parking_lot::Mutex;
use rdma_safe::{CompletionChannel, Context, Gid, MemoryRegion, ProtectionDomain, WorkCompletion};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
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
/// The panic is told on the session's log (the transport's logger, at most
/// `Config::log_lines_per_second`): a peer whose messages make the callback panic
/// cannot flood it.
pub(crate) fn run_callback(deliver: &Deliver, conn: &Arc<Conn>, msg: Message) {
    let run = std::panic::AssertUnwindSafe(|| deliver(conn.clone(), msg));
    if std::panic::catch_unwind(run).is_err() {
        conn.log_line(&format!(
            "session {} ({}): the callback panicked on a message; delivery goes on",
            conn.id, conn.peer
        ));
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
    /// READ targets the poller registers for the sessions (`crate::registrar`).
    pub(crate) registrar: Arc<crate::registrar::Registrar>,
    gid: Gid,
    gid_index: u32,
    lid: u16,
    mtu: rdma_safe::sys::ibv_mtu,
    rd_atomic: u8,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Changed (under the `conns` lock) whenever `conns` is: runners refresh their
    /// list of sessions only then.
    conns_gen: AtomicU64,
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
        if let Some(line) = crate::memlock::warning(&config, crate::memlock::limit()) {
            log(&line);
        }
        let channel = CompletionChannel::new(&ctx)?;
        let pool = BufferPool::new(&pd, config.pool_keep_bytes);
        let mtu = port.active_mtu();
        let shared_recv = match config.shared_receive_slots {
            0 => None,
            n => Some(SharedRecv::new(
                &ctx,
                &channel,
                &pd,
                (n, shared_slot_size(&config, mtu)),
                log.clone(),
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
            registrar: Arc::new(crate::registrar::Registrar::new()),
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
        self.dispatching.store(true, Ordering::SeqCst);
        self.runners.start(&self.me)
    }

    /// Once a callback is set: what was delivered to the sessions' inboxes before
    /// goes to it too, and `recv`s waiting are woken (else those messages, and
    /// their credits, would wait for good). Under each session's drain lock: a
    /// delivery that saw no callback yet has finished, and the next finds the
    /// inbox empty.
    pub(crate) fn hand_over_all(&self) {
        let conns: Vec<Arc<Conn>> = self.conns.lock().values().cloned().collect();
        for conn in &conns {
            self.hand_over_locked(conn, true);
        }
    }

    /// [`Engine::hand_over`] under `conn`'s drain lock, waiting for a drain in
    /// progress (`wait`) or leaving a busy session to the next sweep. A reaper
    /// that routed mail to the session meanwhile found the lock taken and left
    /// the mail to its holder, as [`Conn::try_drain`] takes it: taken here.
    fn hand_over_locked(&self, conn: &Arc<Conn>, wait: bool) {
        if wait {
            conn.drain_locked(|| self.hand_over(conn, None));
        } else {
            conn.try_drain_locked(|| self.hand_over(conn, None));
        }
        if conn.mailbox().is_some_and(|m| m.has_mail()) {
            self.progress(conn, false, Catch::Route);
        }
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
    /// sweep, but is not live from the moment it closed). No session's lock is
    /// taken under the list's: a session whose lock a slow drain holds (a peer can
    /// make a READ target's registration one) holds up no one else here.
    pub(crate) fn conns(&self) -> Vec<Arc<Conn>> {
        let mut v: Vec<_> = self
            .conns
            .lock()
            .values()
            .filter(|c| !c.is_closed())
            .cloned()
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Forgets a closed session.
    pub(crate) fn remove(&self, conn: &Arc<Conn>) {
        let mut conns = self.conns.lock();
        // Only that very session: a stale handle never takes another one out.
        if conns.get(&conn.id).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            conns.remove(&conn.id);
            self.conns_gen.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Lets the closed sessions leave (their users still hold them to ask why).
    /// As in [`Engine::conns`], without taking a session's lock.
    pub(crate) fn forget_closed(&self) {
        let mut conns = self.conns.lock();
        let before = conns.len();
        conns.retain(|_, c| !c.is_closed());
        if conns.len() != before {
            self.conns_gen.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The session `id`, if it has joined and not been forgotten.
    pub(crate) fn conn_by_id(&self, id: u64) -> Option<Arc<Conn>> {
        self.conns.lock().get(&id).cloned()
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
                if slot.borrow().is_none()
                    && !conn.has_queued()
                    && !self.dispatching.load(Ordering::Acquire) =>
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
        // Messages delivered before the callback was registered go first.
        if conn.has_queued() {
            self.hand_over(conn, keep);
        }
        self.to_callback(conn, msg, keep);
    }

    /// Hands the messages waiting in `conn`'s inbox to the callback, in order.
    /// Callers hold the session's drain lock.
    #[cold]
    fn hand_over(&self, conn: &Arc<Conn>, keep: Option<&RefCell<Option<Arc<Conn>>>>) {
        for msg in conn.hand_inbox_over() {
            self.to_callback(conn, msg, keep);
        }
    }

    /// Messages left in `conn`'s inbox with a callback registered (delivered by a
    /// session that joined while the callback was being registered) go to the
    /// callback: looked at on every sweep, at the cost of two loads.
    pub(crate) fn hand_over_stragglers(&self, conn: &Arc<Conn>) {
        if self.dispatching.load(Ordering::Acquire) && conn.has_queued() {
            self.hand_over_locked(conn, false);
        }
    }

    /// Queues `msg` for the callback, scheduling the session if it was idle.
    fn to_callback(
        &self,
        conn: &Arc<Conn>,
        msg: Message,
        keep: Option<&RefCell<Option<Arc<Conn>>>>,
    ) {
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

/// Bytes per slot of the shared receive queue: the configured slot size, but one
/// byte less than the port's MTU at most. A SEND that does not fit a slot then
/// fails on its first packet (a full MTU), and no peer can leave a shared slot half
/// written: Soft-RoCE in Linux 6.1 never completes a shared receive its queue pair
/// had begun when that queue pair fails, so the slot would be lost.
fn shared_slot_size(config: &Config, mtu: rdma_safe::sys::ibv_mtu) -> usize {
    let mtu_bytes = rdma_safe::Mtu::from_code(mtu.0).map_or(256, |m| m.bytes() as usize);
    config.slot_size().min(mtu_bytes - 1)
}
