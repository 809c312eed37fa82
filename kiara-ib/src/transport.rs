//! The KIARA transport API: bind/unbind, connect/disconnect, send/recv,
//! register_callback, context, sessions and configuration.

use crate::config::Config;
use crate::conn::{Conn, Sent};
use crate::engine::{Engine, Side};
use crate::error::{CloseReason, Error, Result};
use crate::handshakes::{self, Handshakes, Refusal, Ticket};
use crate::line_limit::LineLimit;
use crate::message::Message;
use parking_lot::{Mutex, RwLock};
use rdma_safe::MemoryRegion;
use std::any::Any;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Fails on a callback runner thread: a callback that waited on a send could wait
/// for its own session's runner (a credit only it can return, a peer whose callback
/// waits the same way), a deadlock. The message says what to do instead.
fn refuse_wait_in_callback() -> Result<()> {
    if crate::conn::IN_CALLBACK.with(|f| f.get()) {
        return Err(Error::Usage(
            "a callback must not wait on a send (it runs on a callback runner \
             thread, which may be what the send waits for): send with Linger::NoWait, \
             and wait on the handle from another thread if you need to"
                .into(),
        ));
    }
    Ok(())
}

/// How long `send` and `recv` wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linger {
    /// Until done (KIARA's linger 0): as long as the peer takes, like a blocking
    /// socket. A live peer that keeps its credits (it takes nothing) keeps a send
    /// waiting; use [`Linger::Timeout`] where a peer may not be trusted.
    Block,
    /// At most this long.
    Timeout(Duration),
    /// Not at all (KIARA's linger -1): `send` returns a handle to wait on, `recv`
    /// returns what is already there.
    NoWait,
}

impl Linger {
    fn duration(self) -> Option<Duration> {
        match self {
            Linger::Block => None,
            Linger::Timeout(d) => Some(d),
            Linger::NoWait => Some(Duration::ZERO),
        }
    }
}

/// A connection to one peer. Cheap to clone; compare with `==`.
#[derive(Clone)]
pub struct Session {
    pub(crate) conn: Arc<Conn>,
    /// The device side, for threads that wait on this session (they make progress
    /// themselves while their waits are short).
    pub(crate) engine: Weak<Engine>,
}

impl Session {
    /// A number unique within the process: never given to another session, not
    /// even after an `unbind` and a new `bind`, nor by another transport.
    pub fn id(&self) -> u64 {
        self.conn.id
    }

    /// The peer's bootstrap address.
    pub fn peer(&self) -> SocketAddr {
        self.conn.peer
    }

    /// Why the session closed, if it did.
    pub fn closed(&self) -> Option<CloseReason> {
        self.conn.closed()
    }
}

impl PartialEq for Session {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.conn, &other.conn)
    }
}

impl Eq for Session {}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.conn.id)
            .field("peer", &self.conn.peer)
            .field("closed", &self.conn.closed())
            .finish()
    }
}

/// A send in progress (from `send` with [`Linger::NoWait`] or a timeout).
#[derive(Clone)]
pub struct SendHandle {
    conn: Arc<Conn>,
    engine: Weak<Engine>,
    sent: Sent,
}

impl SendHandle {
    /// Waits until the peer has the message (its buffer is free again), or `timeout`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        refuse_wait_in_callback()?;
        let conn = &self.conn;
        let result = match (&self.sent, self.engine.upgrade()) {
            (Sent::Eager(id), Some(engine)) => {
                engine.wait(conn, timeout, &|| conn.eager_settled(*id), |left| {
                    conn.wait_eager(*id, left)
                })
            }
            (Sent::Eager(id), None) => conn.wait_eager(*id, timeout),
            (Sent::Read(done), Some(engine)) => {
                engine.wait(conn, timeout, &|| done.is_finished(), |left| {
                    done.wait(left)
                })
            }
            (Sent::Read(done), None) => done.wait(timeout),
        };
        match result {
            Some(Ok(())) => Ok(()),
            Some(Err(CloseReason::PeerRefused(code))) => Err(Error::Refused(code)),
            Some(Err(CloseReason::NotRegistered(why))) => Err(Error::NotSent(why)),
            Some(Err(reason)) => Err(Error::Closed(reason)),
            None => Err(Error::Timeout(
                timeout.unwrap_or_default(),
                "the send to complete",
            )),
        }
    }

    /// True once the send finished (either way).
    pub fn is_done(&self) -> bool {
        match &self.sent {
            Sent::Eager(id) => self.conn.eager_settled(*id),
            Sent::Read(done) => done.is_finished(),
        }
    }
}

/// How long a goodbye may take to leave before the queue pair goes.
const GOODBYE_GRACE: Duration = Duration::from_millis(500);

/// The user's message handler.
pub type Callback = dyn Fn(Message, &Session, &Transport) + Send + Sync;

struct Listener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

struct Inner {
    config: RwLock<Config>,
    engine: Mutex<Option<Arc<Engine>>>,
    listener: Mutex<Option<Listener>>,
    callback: RwLock<Option<Arc<Callback>>>,
    /// Whether `callback` is set (read without the lock by `recv`).
    has_callback: AtomicBool,
    context: RwLock<Option<Arc<dyn Any + Send + Sync>>>,
    names: Mutex<HashMap<String, Session>>,
    log: Arc<dyn Fn(&str) + Send + Sync>,
}

/// A KIARA transport over InfiniBand/RoCE: a server (`bind`) or a client (`connect`),
/// or both. Cheap to clone (all clones are the same transport).
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

impl Default for Transport {
    fn default() -> Self {
        Self::new(Config::default())
    }
}

impl Transport {
    /// A transport with `config`; nothing is opened until `bind` or `connect`.
    pub fn new(config: Config) -> Self {
        // Not `eprintln!`, which panics where standard error cannot be written (a
        // closed pipe): a lost line is better than a lost thread.
        Self::with_logger(
            config,
            Arc::new(|line: &str| {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "kiara-ib: {line}");
            }),
        )
    }

    /// As [`Transport::new`], with every log line (closed sessions and why, refused
    /// connections and why, at most `Config::log_lines_per_second` of each a
    /// second) sent to `log` instead of standard error. A line whose call to `log`
    /// panics is lost, and nothing else: the transport's threads (which call it,
    /// the accept loop and the poller among them) go on.
    pub fn with_logger(config: Config, log: Arc<dyn Fn(&str) + Send + Sync>) -> Self {
        let log = crate::line_limit::unwinding_stops_here(log);
        Transport {
            inner: Arc::new(Inner {
                config: RwLock::new(config),
                engine: Mutex::new(None),
                listener: Mutex::new(None),
                callback: RwLock::new(None),
                has_callback: AtomicBool::new(false),
                context: RwLock::new(None),
                names: Mutex::new(HashMap::new()),
                log,
            }),
        }
    }

    fn engine(&self) -> Result<Arc<Engine>> {
        let mut slot = self.inner.engine.lock();
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let log = self.inner.log.clone();
        let engine = Engine::start(self.configuration(), log)?;
        let callback = self.inner.callback.read().clone();
        if let Some(cb) = callback {
            self.install_dispatcher(&engine, cb)?;
        }
        *slot = Some(engine.clone());
        Ok(engine)
    }

    /// Has `engine`'s runners call `cb` for every message. The callback is part of
    /// the dispatcher, not read from `Inner::callback` per message (a lock and a
    /// reference count fewer); a callback registered later installs a new one,
    /// which the runners see by the engine's count of changes. Called with the
    /// `engine` lock held (by [`Transport::engine`] and
    /// [`Transport::register_callback`]), so the last callback registered is the
    /// one installed.
    fn install_dispatcher(&self, engine: &Arc<Engine>, cb: Arc<Callback>) -> Result<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let device = Arc::downgrade(engine);
        engine.set_dispatcher(Arc::new(move |conn, msg| {
            let Some(inner) = weak.upgrade() else { return };
            let transport = Transport { inner };
            let session = Session {
                conn,
                engine: device.clone(),
            };
            cb(msg, &session, &transport);
        }))
    }

    /// Listens on `addr` (e.g. `"198.18.0.1:18515"`; port 0 picks one) and serves
    /// every client that connects, in background threads. Returns the bound address.
    pub fn bind(&self, addr: impl ToSocketAddrs) -> Result<SocketAddr> {
        let mut listener_slot = self.inner.listener.lock();
        if listener_slot.is_some() {
            return Err(Error::Usage("already bound: call unbind first".into()));
        }
        let engine = self.engine()?;
        let listener =
            TcpListener::bind(addr).map_err(|e| Error::io("binding the listening socket", e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::io("reading the bound address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("configuring the listening socket", e))?;
        self.inner.config.write().listen = bound;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kiara-accept".into())
            .spawn(move || accept_loop(listener, engine, stop2))
            .map_err(|e| Error::io("starting the accept thread", e))?;
        *listener_slot = Some(Listener {
            addr: bound,
            stop,
            thread,
        });
        Ok(bound)
    }

    /// The address `bind` listens on, if bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.listener.lock().as_ref().map(|l| l.addr)
    }

    /// Stops accepting, lets in-flight messages finish (up to the configured timeout),
    /// closes every session and releases every device resource.
    pub fn unbind(&self) -> Result<()> {
        let listener = self
            .inner
            .listener
            .lock()
            .take()
            .ok_or_else(|| Error::Usage("not bound".into()))?;
        listener.stop.store(true, Ordering::SeqCst);
        let _ = listener.thread.join();
        let engine = self.inner.engine.lock().take();
        if let Some(engine) = engine {
            // In-flight messages finish (up to the timeout), then each session says
            // goodbye and waits for it to leave: woken by completions, not a clock.
            let deadline = Instant::now() + engine.config.timeout;
            for conn in engine.conns() {
                conn.wait_idle(deadline.saturating_duration_since(Instant::now()));
            }
            for conn in engine.conns() {
                conn.say_bye();
            }
            // One grace period for all: a peer that stalls must not add its own.
            let grace = Instant::now() + GOODBYE_GRACE;
            for conn in engine.conns() {
                conn.wait_idle(grace.saturating_duration_since(Instant::now()));
            }
            engine.shutdown();
        }
        self.inner.names.lock().clear();
        Ok(())
    }

    /// Connects to a server at `addr`; the session is ready for `send` and `recv`.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Session> {
        let engine = self.engine()?;
        let timeout = engine.config.timeout;
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::io("resolving the server address", e))?
            .collect();
        let mut last = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(tcp) => {
                    let conn = engine.establish(tcp, a, Side::Connecting, &|| true)?;
                    return Ok(Session {
                        conn,
                        engine: Arc::downgrade(&engine),
                    });
                }
                Err(e) => last = Some(Error::io(format!("connecting to {a}"), e)),
            }
        }
        Err(last.unwrap_or_else(|| Error::Usage("the address resolved to nothing".into())))
    }

    /// Says goodbye to the peer and closes the session.
    pub fn disconnect(&self, session: Session) -> Result<()> {
        session.conn.say_bye();
        // The goodbye leaves (its completion wakes us) before the QP goes.
        session.conn.wait_idle(GOODBYE_GRACE);
        session.conn.close(CloseReason::Disconnected);
        if let Some(engine) = self.inner.engine.lock().as_ref() {
            engine.remove(&session.conn);
        }
        self.inner.names.lock().retain(|_, s| s != &session);
        Ok(())
    }

    /// Sends `msg` on `session`. The peer fetches the bytes by RDMA READ (or gets them
    /// inline when small). With [`Linger::Block`] this returns once the peer has the
    /// message; with a timeout it waits at most that long (the send goes on if it
    /// expires); with [`Linger::NoWait`] it returns at once. The handle waits.
    pub fn send(
        &self,
        session: &Session,
        msg: impl Into<Message>,
        linger: Linger,
    ) -> Result<SendHandle> {
        if linger != Linger::NoWait {
            refuse_wait_in_callback()?;
        }
        // Room in the session (its caps on messages and bytes in flight): waited for
        // as the linger says.
        let room = match linger {
            Linger::NoWait => Some(Duration::ZERO),
            other => other.duration(),
        };
        // One linger for both waits: room, then the peer's taking the message.
        // (The clock is read only for a timeout.)
        let started = matches!(linger, Linger::Timeout(_)).then(Instant::now);
        let handle = SendHandle {
            engine: session.engine.clone(),
            sent: session.conn.send(msg.into(), room)?,
            conn: session.conn.clone(),
        };
        match (linger, started) {
            (Linger::NoWait, _) => {}
            (Linger::Timeout(d), Some(started)) => {
                let left = d.saturating_sub(started.elapsed());
                // A timeout names the caller's linger, not what was left of it.
                handle.wait(Some(left)).map_err(|e| match e {
                    Error::Timeout(_, what) => Error::Timeout(d, what),
                    other => other,
                })?;
            }
            _ => handle.wait(None)?,
        }
        Ok(handle)
    }

    /// The next message of `session` (only for sessions without a callback).
    /// `Ok(None)` when the linger time passed without one.
    pub fn recv(&self, session: &Session, linger: Linger) -> Result<Option<Message>> {
        if self.inner.has_callback.load(Ordering::Acquire) {
            return Err(Error::Usage(
                "a callback is registered: messages go to it, not to recv".into(),
            ));
        }
        let conn = &session.conn;
        match session.engine.upgrade() {
            Some(engine) => engine.recv(conn, linger.duration()),
            None => conn.recv(linger.duration()),
        }
    }

    /// Runs `f(message, session, transport)` for every message received from now on,
    /// on a callback runner thread, one message of a session at a time and in order
    /// (so `f` may block, holding up its own session only, and may `send` with
    /// [`Linger::NoWait`]; a send that would wait fails with [`Error::Usage`]).
    /// A panic in `f` is caught: the message is dropped, delivery goes on, and the
    /// transport's logger gets a line about it (counted with the session lines
    /// under `Config::log_lines_per_second`). The process's panic hook still runs.
    ///
    /// Messages that arrived before, and that no `recv` took, go to `f` first, in
    /// order; a `recv` waiting on a session then fails with [`Error::Usage`].
    ///
    /// `f` is given the transport: use that one. A clone of the transport that `f`
    /// owns (or that the context set with [`Transport::set_context`] owns) makes
    /// a reference cycle: the transport is then never dropped, and its threads and
    /// sessions outlive every other handle.
    pub fn register_callback(
        &self,
        f: impl Fn(Message, &Session, &Transport) + Send + Sync + 'static,
    ) -> Result<()> {
        // Under the engine's lock, as `engine` installs a callback registered before
        // the engine started: two registrations cannot install in the wrong order.
        let engine = self.inner.engine.lock();
        let cb: Arc<Callback> = Arc::new(f);
        *self.inner.callback.write() = Some(cb.clone());
        self.inner.has_callback.store(true, Ordering::Release);
        let Some(running) = engine.as_ref().cloned() else {
            return Ok(());
        };
        self.install_dispatcher(&running, cb)?;
        drop(engine);
        // Outside the transport's lock: the hand-over waits for drains in progress,
        // which may call the logger.
        running.hand_over_all();
        Ok(())
    }

    /// The user data set with [`Transport::set_context`].
    pub fn context(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.inner.context.read().clone()
    }

    /// Stores user data with the transport.
    pub fn set_context(&self, ctx: Arc<dyn Any + Send + Sync>) {
        *self.inner.context.write() = Some(ctx);
    }

    /// The live sessions (accepted and connected), oldest first.
    pub fn sessions(&self) -> Vec<Session> {
        self.inner
            .engine
            .lock()
            .as_ref()
            .map(|e| {
                let engine = Arc::downgrade(e);
                e.conns()
                    .into_iter()
                    .map(|conn| Session {
                        conn,
                        engine: engine.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The session stored under `name`.
    pub fn session(&self, name: &str) -> Option<Session> {
        self.inner.names.lock().get(name).cloned()
    }

    /// Stores `session` under `name`. Names whose session has closed since are
    /// forgotten here, so that names given to sessions that come and go (a peer
    /// per name) keep no closed session, nor what it holds, for good.
    pub fn set_session(&self, name: &str, session: &Session) {
        let mut names = self.inner.names.lock();
        names.retain(|_, s| !s.conn.is_closed());
        names.insert(name.to_string(), session.clone());
    }

    /// The configuration.
    pub fn configuration(&self) -> Config {
        self.inner.config.read().clone()
    }

    /// Replaces the configuration; allowed before the first `bind` or `connect`.
    pub fn set_configuration(&self, config: Config) -> Result<()> {
        config.validate().map_err(|e| Error::Usage(e.into()))?;
        if self.inner.engine.lock().is_some() {
            return Err(Error::Usage(
                "the transport is in use: set the configuration before bind/connect".into(),
            ));
        }
        *self.inner.config.write() = config;
        Ok(())
    }

    /// Memory registered with the transport's device, for zero-copy messages
    /// ([`Message::from_region`]).
    pub fn register(&self, len: usize) -> Result<MemoryRegion> {
        self.engine()?.register(len)
    }

    /// A count read off the engine; 0 before `bind` or `connect` started one.
    fn engine_count<T: Default>(&self, count: impl FnOnce(&Engine) -> T) -> T {
        self.inner
            .engine
            .lock()
            .as_deref()
            .map_or_else(T::default, count)
    }

    /// Registered buffers the pool keeps for reuse now.
    pub fn pooled_buffers(&self) -> usize {
        self.engine_count(|e| e.pool.cached())
    }

    /// Bytes of the registered buffers the pool keeps for reuse now, which
    /// `Config::pool_keep_bytes` bounds.
    pub fn pooled_bytes(&self) -> usize {
        self.engine_count(|e| e.pool.cached_bytes())
    }

    /// Bytes of the peers' read messages this transport holds now (being read, or
    /// delivered and not yet taken), which `Config::max_receiving_bytes_total`
    /// bounds.
    pub fn receiving_bytes(&self) -> u64 {
        self.engine_count(|e| e.receiving.used())
    }

    /// Bytes of this transport's own read messages queued or in flight on all its
    /// sessions now, which `Config::max_outstanding_bytes_total` bounds.
    pub fn sending_bytes(&self) -> u64 {
        self.engine_count(|e| e.sending.used())
    }

    /// Memory registrations the transport made for messages so far: pool buffers,
    /// and the regions over exactly a message's bytes that its window is bound to
    /// (reused for the next message of the same length in the same pool buffer; one
    /// per message sent from a user region). A steady stream of pooled messages of
    /// one size adds none.
    pub fn registrations(&self) -> u64 {
        self.engine_count(|e| e.pool.registrations())
    }

    /// The shared receive queue's slots, if the transport is bound or connected and
    /// has one.
    pub fn shared_receives(&self) -> Option<SharedReceives> {
        let engine = self.inner.engine.lock();
        let pool = engine.as_ref()?.shared_recv.as_ref()?;
        Some(SharedReceives {
            slots: pool.slots(),
            posted: pool.posted(),
            refused: pool.refused(),
            received: pool.received(),
        })
    }
}

/// The shared receive queue's slots (`Config::shared_receive_slots`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedReceives {
    /// Slots in the queue.
    pub slots: u32,
    /// Slots the transport has handed to the device (posted to the queue, or being
    /// filled): all of them whenever no message is being handled and none is
    /// `refused`. The others are being decoded. (A slot the device took and never
    /// completed would still count here: this shows that the transport keeps none,
    /// not what the device did.)
    pub posted: u32,
    /// Slots the device refused to take back (`ibv_post_srq_recv` failed), kept to
    /// be posted again with the next slot that comes back, or by the next sweep.
    /// Zero unless the device is in trouble.
    pub refused: u32,
    /// Receives completed so far, each of which gave its slot back: every SEND a
    /// peer saw succeed counts here once handled, so a slot the device consumed
    /// but never completed shows as a SEND missing from this count.
    pub received: u64,
}

impl Drop for Inner {
    /// A transport dropped while bound stops accepting and closes its sessions.
    fn drop(&mut self) {
        if let Some(listener) = self.listener.get_mut().take() {
            listener.stop.store(true, Ordering::SeqCst);
            let _ = listener.thread.join();
        }
        if let Some(engine) = self.engine.get_mut().take() {
            engine.shutdown();
        }
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("listening", &self.local_addr())
            .field("sessions", &self.sessions().len())
            .finish()
    }
}

/// How often (ms) an idle accept loop looks whether it should stop.
const ACCEPT_LOOK_MS: u64 = 100;

/// Accepts clients until `stop`; each handshake runs on its own short thread so that
/// a slow or hostile client cannot hold up the others. At most
/// `Config::max_sessions` sessions live (handshakes in progress count), at most
/// `Config::max_handshakes` handshakes run at once, and with
/// `Config::max_sessions_per_address` one address holds at most that many of
/// both: a client beyond is refused at once, its connection closed, the reason
/// logged, unless a connection that has not sent its hello for a while gives up
/// its place to it (`handshakes.rs`; not past the address's cap).
fn accept_loop(listener: TcpListener, engine: Arc<Engine>, stop: Arc<AtomicBool>) {
    let config = &engine.config;
    let places = Handshakes::new(config.max_handshakes, handshakes::grace(config.timeout));
    let refusals = Arc::new(LineLimit::new(
        config.log_lines_per_second,
        "connections refused",
        engine.logger(),
    ));
    while !stop.load(Ordering::SeqCst) {
        refusals.look();
        // A bug of kiara-ib's in one turn must not end the loop, which would drop
        // the listener and refuse every later client: logged, and it goes on.
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            accept_one(&listener, &engine, &places, &refusals)
        }));
        if let Err(panic) = turn {
            refusals.line(&format!(
                "the accept loop failed ({}): a bug in kiara-ib, please report it; it goes on",
                crate::runners::panic_text(&*panic)
            ));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    refusals.flush();
}

/// One turn of [`accept_loop`]: a client taken (its handshake started on a thread
/// of its own) or refused, or a wait for the next.
fn accept_one(
    listener: &TcpListener,
    engine: &Arc<Engine>,
    places: &Arc<Handshakes>,
    refusals: &Arc<LineLimit>,
) {
    #[cfg(feature = "fault-injection")]
    crate::faults::accept_turn();
    let config = &engine.config;
    match listener.accept() {
        Ok((tcp, peer)) => {
            let ip = peer.ip().to_canonical();
            let (live, here) = engine.live_sessions_with(Some(ip));
            if let Some(line) = over_address_cap(config, places, peer, here) {
                refusals.line(&line);
                return;
            }
            let room = config.max_sessions.saturating_sub(live);
            let ticket = match places.admit(&tcp, ip, Instant::now(), room) {
                Ok(ticket) => ticket,
                Err(refusal) => {
                    refusals.line(&refused(peer, &refusal, live, config));
                    return;
                }
            };
            let worker = engine.clone();
            let lines = refusals.clone();
            let _ = tcp.set_nonblocking(false);
            // A thread that cannot start drops the closure, and the ticket with it.
            let spawned = std::thread::Builder::new()
                .name("kiara-handshake".into())
                .spawn(move || handshake(&worker, tcp, peer, ticket, &lines));
            if let Err(e) = spawned {
                let why = format!("cannot start a handshake thread: {e}");
                refusals.line(&format!("connection from {peer} refused: {why}"));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            // Sleep until a client knocks (or a while passed, to look at `stop`).
            let look = Some(Duration::from_millis(ACCEPT_LOOK_MS));
            // Errors too end the sleep: the next accept says what is wrong.
            let _ = rdma_safe::poll_readable([listener.as_raw_fd()], look);
        }
        Err(e) => {
            // Counted with the refusals: a process out of descriptors fails
            // every accept, and its lines share their rate.
            refusals.line(&format!("accept failed: {e}"));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The log line refusing a connection from `peer` when its address holds as many
/// sessions (`sessions` of them) and handshakes as
/// `Config::max_sessions_per_address` allows.
fn over_address_cap(
    config: &Config,
    places: &Handshakes,
    peer: SocketAddr,
    sessions: usize,
) -> Option<String> {
    let cap = config.max_sessions_per_address;
    if cap == 0 {
        return None;
    }
    let ip = peer.ip().to_canonical();
    let held = sessions + places.held_for(ip);
    (held >= cap).then(|| {
        format!(
            "connection from {peer} refused: {held} sessions and handshakes from {ip} \
             (Config::max_sessions_per_address)"
        )
    })
}

/// The log line for a connection given no handshake place.
fn refused(peer: SocketAddr, why: &Refusal, live: usize, config: &Config) -> String {
    match why {
        Refusal::Full(running) => format!(
            "connection from {peer} refused: {running} handshakes in progress \
             (Config::max_handshakes)"
        ),
        Refusal::Sessions(running) => format!(
            "connection from {peer} refused: max_sessions ({}) reached ({live} sessions, \
             {running} handshakes in progress)",
            config.max_sessions
        ),
        Refusal::Io(e) => format!("connection from {peer} refused: cannot keep its socket: {e}"),
    }
}

/// One accepted client's handshake, on its own thread; `ticket` holds its place.
/// The place is given back before the outcome is logged, so a log line about a
/// connection, if it is written (`refusals` may hold it back), means its place is
/// free.
fn handshake(
    engine: &Arc<Engine>,
    tcp: TcpStream,
    peer: SocketAddr,
    ticket: Ticket,
    refusals: &LineLimit,
) {
    let grace = ticket.grace();
    let outcome = engine.establish(tcp, peer, Side::Accepting, &|| ticket.heard());
    let cut = ticket.finish();
    let Err(e) = outcome else {
        return;
    };
    let line = if cut {
        format!(
            "connection from {peer} refused: no hello within {grace:?} while every handshake \
             place was taken, so its place went to a newer connection \
             (Config::max_handshakes): {e}"
        )
    } else {
        format!("connection from {peer} refused: {e}")
    };
    refusals.line(&line);
}
