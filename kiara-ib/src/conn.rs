//! One session's driver: its queue pair, control slots, memory windows and buffers.
//! What to do is decided by the session core ([`crate::session`]), a state machine
//! with no verbs, threads or clock; this module feeds it what the completion queue
//! and the application did and carries out the actions it returns, in order. All of
//! it runs under the connection's lock; what must happen outside it (delivering
//! messages) is handed to the caller as [`Event`]s.
//!
//! Here: the session's state and its waits. `conn/sends.rs` takes the
//! application's sends and posts control messages, `conn/actions.rs` carries out
//! the core's other actions, `conn/completions.rs` reaps the completion queue, and
//! `conn/receives.rs` keeps the receive slots.

use crate::config::Config;
use crate::error::{CloseReason, Error, Result};
use crate::id_map::IdMap;
use crate::message::{Message, Meta, Payload};
use crate::pool::BufferPool;
use crate::protocol::{Kind, Limits};
use crate::send_done::{DoneRecords, SendDone};
use crate::session::{Action, Params, Session};
use crate::slots::{Slot, SlotSlab};
use crate::sq_gate::SqGate;
use crate::waiting::Waiting;
use parking_lot::{Condvar, Mutex, MutexGuard};
use rdma_safe::qp::Rts;
use rdma_safe::{CompletionQueue, MemoryWindow, QueuePair, RemoteSlice};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod actions;
mod completions;
mod receives;
mod sends;

pub(crate) use completions::Drained;
pub(crate) use receives::Receives;

/// Control messages up to this size are posted inline (copied into the request).
pub(crate) const INLINE_BYTES: u32 = 256;

thread_local! {
    /// Set on a callback runner thread, which runs nothing but the callback: a wait there
    /// could wait on the very thread that must deliver what it waits for.
    pub(crate) static IN_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// RDMA READs one session keeps in flight at most.
pub(crate) const READS_IN_FLIGHT: u32 = 16;

/// Messages of ours a peer may be reading at once per session: each holds a memory
/// window, bound when its descriptor goes out and invalidated by its acknowledgement
/// (or by our LOCAL_INV after it).
pub(crate) const WINDOWS: u32 = 16;

const TAG_SHIFT: u32 = 60;
const TAG_RECV: u64 = 1;
const TAG_SEND: u64 = 2;
const TAG_READ: u64 = 3;
/// The LOCAL_INV of a message's window after an acknowledgement that did not
/// invalidate it (value: the message id).
const TAG_INV: u64 = 4;
/// The BIND_MW of a message's window (unsignaled; seen only if it fails).
const TAG_BIND: u64 = 5;
const VALUE_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// A send in flight, as `send` returns it (and a `SendHandle` keeps it).
#[derive(Clone)]
pub(crate) enum Sent {
    /// An eager message (its bytes inside the SEND), by id: it is done once its SEND
    /// completed or the peer said it has it. Tracked by the session (no allocation).
    Eager(u64),
    /// A message the peer reads: done when the peer acknowledges (or refuses) it.
    Read(Arc<SendDone>),
}

/// A message of ours, from `send` until the core releases it.
struct Outgoing {
    /// The window that grants the peer RDMA READ on exactly these bytes, from its
    /// bind until the acknowledgement's invalidation (or our LOCAL_INV after it)
    /// completed. Declared first, so dropped before the bytes (and their view) it
    /// reaches.
    window: Option<MemoryWindow>,
    bytes: Payload,
    meta: Meta,
    /// Read messages: the handle the sender waits on.
    done: Option<Arc<SendDone>>,
    /// Why its window could not be bound (its bytes could not be registered for
    /// the peer: the memlock limit): its descriptor's slot goes as a CREDIT, and
    /// the message fails alone.
    unbound: Option<String>,
}

/// A message of the peer's, being read or waiting for an earlier one.
struct Incoming {
    /// The bytes: a pooled buffer (the READ target) or, for eager messages, a vector.
    buf: Payload,
    meta: Meta,
}

/// The session's state. `qp` comes first: dropped first, so the device is done with
/// the slabs before they go (`DestroyQp` drops it earlier still).
struct State {
    qp: Option<QueuePair<Rts>>,
    /// Where the peer's control messages land (one slot per credit it holds, or
    /// the shared receive queue).
    recv: Receives,
    /// Our send slots.
    send: SlotSlab,
    core: Session,
    /// Send slots not posted, by index.
    send_free: Vec<Option<Slot>>,
    /// Our read messages, from `send` until released.
    outgoing: IdMap<Outgoing>,
    /// Our eager messages, from `send` until copied into their SEND (in id order:
    /// the core posts them in the order they were sent).
    eager_out: VecDeque<(u64, Outgoing)>,
    /// The peer's messages being read, or waiting behind an earlier one.
    incoming: IdMap<Incoming>,
    /// The message that just arrived, until the core delivers it, starts reading it,
    /// or keeps it waiting.
    arrived: Option<(u64, Kind, Incoming)>,
    /// The peer's messages (id, length) whose READ target the poller is to register
    /// (`crate::registrar`); they wait in `incoming` without one meanwhile.
    targets_wanted: VecDeque<(u64, u64)>,
    /// Windows free for the next descriptor.
    windows: Vec<MemoryWindow>,
    /// Finished read messages' records, lent to the next ones.
    done_records: DoneRecords,
    /// Send-queue actions held until a bind may go (Soft-RoCE; see `sq_gate.rs`).
    gate: SqGate<Action>,
    inbox: VecDeque<Message>,
    /// A callback took the session's messages over (`Conn::hand_inbox_over`):
    /// `recv` waits no more.
    handed_over: bool,
    closed: Option<CloseReason>,
}

/// A connected session.
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) peer: SocketAddr,
    pub(crate) cq: Arc<CompletionQueue>,
    pub(crate) tcp: TcpStream,
    slot_size: usize,
    credits: u32,
    eager_threshold: usize,
    /// What we accept (checked when decoding).
    limits: Limits,
    /// The largest message we may send: the smaller of the two sides' limits.
    send_limit: u64,
    /// Our acknowledgements invalidate the peer's window (`Config::invalidating_acks`).
    invalidating_acks: bool,
    /// A READ counts only once the queue pair is seen alive after it
    /// (`Config::confirm_reads`).
    pub(crate) confirm_reads: bool,
    pool: Arc<BufferPool>,
    /// Where a READ target the pool's cache lacks is asked for.
    registrar: Arc<crate::registrar::Registrar>,
    /// The transport's logger: closes that no completion reported are logged here.
    log: crate::engine::Log,
    state: Mutex<State>,
    /// Held while draining the CQ, so completions are handled in order by one thread.
    drain_lock: Mutex<()>,
    /// Signalled when the inbox grows, a send finishes or room frees, or the session
    /// closes.
    cond: Condvar,
    /// Whether waiting threads spin, and whether the poller may arm the CQ.
    pub(crate) waiting: Waiting,
    /// Messages waiting for the callback (when one is registered), and whether a
    /// runner has the session (see [`crate::runners`]).
    pub(crate) callbacks: crate::callback_queue::CallbackQueue,
    /// The runners' view of the session (see [`crate::runners`]).
    pub(crate) heat: crate::runners::Heat,
    /// Copies of the core's eager watermark, the inbox length and whether the session
    /// is closed, for spinning waiters: they look without taking the lock.
    eager_done: AtomicU64,
    inbox_len: AtomicUsize,
    is_closed: AtomicBool,
    /// The CQ's notification is armed and its event not yet read: arming it again
    /// (a system call on most devices) would change nothing. Cleared by the poller
    /// when it reads the event.
    armed: AtomicBool,
    /// Messages the application took, not yet told to the core (folded in under the
    /// lock by the next operation that takes it).
    taken: AtomicU32,
    /// Set while the core has receive slots waiting for their repost.
    deferred: AtomicBool,
    /// Set while the core holds bytes of the peer's read messages (charged to the
    /// transport's budget): a message taken then is told to the core at once, so
    /// that its bytes go back to the budget without waiting for this session's
    /// next event.
    holds_bytes: AtomicBool,
    /// On the shared receive queue: where its receives are routed (also in
    /// `State::recv`; here for a look without the lock).
    mail: Option<Arc<crate::shared_recv::Mailbox>>,
}

/// What the poller must do after a completion, outside the lock.
pub(crate) enum Event {
    /// A message arrived.
    Delivered(Message),
    /// The session closed, for this reason.
    Closed(CloseReason),
    /// A line for the transport's log about this session: a message refused for
    /// want of memory to read it into, one of ours withdrawn for want of memory to
    /// bind its window to, or an error completion reaped after the
    /// close that is not a flush. (The close line names the first error reaped,
    /// which may be only a flush when the queue pair went to the error state for a
    /// reason reported later, or by another queue.)
    Noted(String),
}

impl Conn {
    /// Wraps a connected queue pair whose receive slots (all of `recv`'s) are
    /// posted; `send_slots` are the slots of `send`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        peer: SocketAddr,
        qp: QueuePair<Rts>,
        cq: Arc<CompletionQueue>,
        tcp: TcpStream,
        recv: Receives,
        send: SlotSlab,
        send_slots: Vec<Slot>,
        config: &Config,
        peer_credits: u32,
        peer_limits: Limits,
        pool: Arc<BufferPool>,
        registrar: Arc<crate::registrar::Registrar>,
        budgets: [Arc<crate::budget::SharedBudget>; 2],
        log: crate::engine::Log,
    ) -> Conn {
        let mut send_free: Vec<Option<Slot>> = (0..config.send_slots).map(|_| None).collect();
        for slot in send_slots {
            let i = slot.index() as usize;
            send_free[i] = Some(slot);
        }
        // The shared receive queue's slots may be shorter than the configuration's.
        let slot_size = recv.slot_size();
        let mail = recv.mailbox().cloned();
        Conn {
            id,
            peer,
            cq,
            tcp,
            slot_size,
            credits: config.credits,
            eager_threshold: (config.eager_threshold as usize)
                .min(peer_limits.eager_threshold as usize),
            limits: Limits {
                max_message: config.max_message,
                eager_threshold: (slot_size - crate::protocol::SLOT_OVERHEAD) as u32,
            },
            send_limit: config.max_message.min(peer_limits.max_message),
            invalidating_acks: config.invalidating_acks == Some(true),
            confirm_reads: config.confirm_reads == Some(true),
            pool,
            registrar,
            log,
            state: Mutex::new(State {
                qp: Some(qp),
                recv,
                send,
                core: Session::new(
                    session_params(config, peer_credits, budgets),
                    Instant::now(),
                ),
                send_free,
                outgoing: IdMap::default(),
                eager_out: VecDeque::with_capacity(64),
                incoming: IdMap::default(),
                arrived: None,
                targets_wanted: VecDeque::new(),
                windows: Vec::with_capacity(WINDOWS as usize),
                done_records: DoneRecords::new(config.max_outstanding as usize),
                gate: SqGate::new(config.serialize_binds == Some(true)),
                inbox: VecDeque::with_capacity(64),
                handed_over: false,
                closed: None,
            }),
            cond: Condvar::new(),
            drain_lock: Mutex::new(()),
            waiting: Waiting::default(),
            callbacks: Default::default(),
            heat: Default::default(),
            eager_done: AtomicU64::new(0),
            inbox_len: AtomicUsize::new(0),
            is_closed: AtomicBool::new(false),
            holds_bytes: AtomicBool::new(false),
            // Not known: the first look arms it for sure.
            armed: AtomicBool::new(false),
            taken: AtomicU32::new(0),
            deferred: AtomicBool::new(false),
            mail,
        }
    }

    /// On the shared receive queue: the mailbox its receives are routed to.
    pub(crate) fn mailbox(&self) -> Option<&Arc<crate::shared_recv::Mailbox>> {
        self.mail.as_ref()
    }

    /// Posts receive slot `slot` of `recv` (used at setup and after each receive).
    pub(crate) fn post_recv_slot(
        qp: &QueuePair<impl rdma_safe::qp::CanRecv>,
        recv: &mut SlotSlab,
        slot: Slot,
    ) -> rdma_safe::Result<()> {
        let wr_id = recv_wr_id(slot.index());
        // SAFETY: the slab outlives the QP's use of it: `establish` creates the slabs
        // before the QP (locals drop in reverse), and a session drops its QP first
        // (`DestroyQp`, and the field order of `State`).
        unsafe { recv.post_recv(qp, slot, wr_id) }
    }

    /// Why the session closed, if it did.
    pub(crate) fn closed(&self) -> Option<CloseReason> {
        self.state.lock().closed.clone()
    }

    /// Whether the session closed, without its lock (for counts that may lag a
    /// close by a moment).
    pub(crate) fn is_closed(&self) -> bool {
        self.is_closed.load(Ordering::Acquire)
    }

    /// Sleeps on the session's condition until woken, or until `timeout` after the
    /// first call of this wait (kept in `deadline`), or for `recheck` at most; true
    /// once the deadline has passed. The clock is read only here, when there is
    /// something to wait for.
    fn sleep(
        &self,
        st: &mut MutexGuard<'_, State>,
        timeout: Option<Duration>,
        deadline: &mut Option<Instant>,
        recheck: Option<Duration>,
    ) -> bool {
        if deadline.is_none() {
            // A timeout too long for the clock (`Duration::MAX`) waits for good.
            *deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        }
        let wake = recheck.map(|r| Instant::now() + r);
        match (*deadline, wake) {
            (None, None) => {
                self.cond.wait(st);
                false
            }
            (None, Some(w)) => {
                self.cond.wait_until(st, w);
                false
            }
            (Some(d), w) => {
                let until = w.map_or(d, |w| w.min(d));
                Instant::now() >= d || (self.cond.wait_until(st, until).timed_out() && until == d)
            }
        }
    }

    /// Tells the core what the application took, then carries out what it decided;
    /// mirrors what spinning waiters look at.
    fn run(&self, st: &mut State, events: &mut Vec<Event>) {
        self.fold_taken(st);
        self.act_all(st, events);
    }

    /// [`Conn::run`] for a caller outside the completion path (a send, a credit
    /// given back): the lock is released, then a close the actions caused (a post
    /// the device refused, say) is logged as the poller logs the closes it finds,
    /// instead of ending the session silently.
    fn run_and_report(&self, mut st: MutexGuard<'_, State>) {
        let mut events = Vec::new();
        self.run(&mut st, &mut events);
        drop(st);
        // Nearly always nothing: a send or a credit given back closes nothing.
        if !events.is_empty() {
            self.report(events);
        }
    }

    /// Logs the closes among `events`. Nothing is delivered outside the completion
    /// path; were a message among them, it would wait in the inbox, not be lost.
    fn report(&self, events: Vec<Event>) {
        for ev in events {
            match ev {
                Event::Closed(reason) => (self.log)(&self.close_line(&reason)),
                Event::Noted(line) => (self.log)(&line),
                Event::Delivered(msg) => self.push_inbox(msg),
            }
        }
    }

    /// Logs `line` about this session on the transport's logger (rate-limited with
    /// the other session lines).
    pub(crate) fn log_line(&self, line: &str) {
        (self.log)(line);
    }

    /// The log line of this session's close: "ended" when the peer said goodbye.
    pub(crate) fn close_line(&self, reason: &CloseReason) -> String {
        let how = if *reason == CloseReason::PeerDisconnected {
            "ended"
        } else {
            "closed"
        };
        format!("session {} ({}) {how}: {reason}", self.id, self.peer)
    }

    /// Carries out the core's actions; one that fails closes the session (whose own
    /// actions are then carried out too).
    fn act_all(&self, st: &mut State, events: &mut Vec<Event>) {
        let mut wake = false;
        while let Some(action) = Self::next_action(st) {
            wake |= matches!(action, Action::Finished { .. } | Action::Closed(_));
            let signaled = matches!(
                action,
                Action::Post { .. } | Action::Read { .. } | Action::Invalidate(_)
            );
            match self.act(st, action, events) {
                Ok(()) if signaled => st.gate.posted(),
                Ok(()) => {}
                Err(why) => st.core.close(why),
            }
        }
        let done = st.core.eager_done();
        if done > self.eager_done.load(Ordering::Relaxed) {
            self.eager_done.store(done, Ordering::Release);
            wake = true;
        }
        self.deferred
            .store(st.core.reposts_waiting(), Ordering::Release);
        self.holds_bytes
            .store(st.core.holds_bytes(), Ordering::Release);
        if wake {
            self.cond.notify_all();
        }
    }

    /// The next action to carry out: one the send-queue gate held that may go now,
    /// else the core's next, unless the gate holds that one back.
    fn next_action(st: &mut State) -> Option<Action> {
        // A closed session posts nothing more, not even what the gate held from
        // before the close (the core dropped its own queue's: `Session::close`).
        if st.core.is_closed() {
            st.gate.clear();
        }
        loop {
            if let Some(action) = st.gate.ready() {
                return Some(action);
            }
            let action = st.core.next_action()?;
            let is_bind = match action {
                Action::Bind(_) => true,
                Action::Post { .. } | Action::Read { .. } | Action::Invalidate(_) => false,
                _ => return Some(action),
            };
            if let Some(action) = st.gate.admit(action, is_bind) {
                return Some(action);
            }
        }
    }

    /// Carries out one action of the core (each kind in `conn/actions.rs`).
    fn act(
        &self,
        st: &mut State,
        action: Action,
        events: &mut Vec<Event>,
    ) -> std::result::Result<(), CloseReason> {
        match action {
            Action::Bind(id) => self.bind_window(st, id, events),
            Action::Post { slot, kind, header } => self.post_control(st, slot, kind, header),
            Action::StartRead { id, len } => self.start_read(st, id, len),
            Action::Read {
                id,
                offset,
                len,
                addr,
                rkey,
            } => Self::post_read(
                st,
                id,
                offset,
                len,
                RemoteSlice {
                    addr,
                    len: u64::from(len),
                    rkey,
                },
            ),
            Action::Repost(index) => Self::repost(st, index),
            Action::Deliver(id) => Self::deliver(st, id, events),
            Action::Invalidate(id) => Self::invalidate(st, id),
            Action::Release(id) => {
                Self::release(st, id);
                Ok(())
            }
            Action::Finished { id, result } => {
                if let Some(done) = st.outgoing.remove(&id).and_then(|o| o.done) {
                    done.finish(result);
                    st.done_records.give_back(done);
                }
                Ok(())
            }
            Action::Discard(id) => {
                st.incoming.remove(&id);
                Ok(())
            }
            Action::DestroyQp => {
                Self::destroy_qp(st);
                st.recv.drain();
                Ok(())
            }
            Action::Closed(reason) => {
                self.closed_now(st, reason, events);
                Ok(())
            }
        }
    }

    /// Tells the core about messages the application took since the last time.
    fn fold_taken(&self, st: &mut State) {
        let n = self.taken.swap(0, Ordering::AcqRel);
        for _ in 0..n {
            st.core.taken();
        }
    }

    /// The application took a delivered message (its callback returned, or it was
    /// dropped undelivered after the close): its credit and its bytes of the budget
    /// are told to the core at once. (Left for the session's next event, as after
    /// a `recv`, the credits of a callback's messages stalled `hostile_g` in the
    /// guest: its attacker, out of credits, waited for them for good while the
    /// server's runner was busy with the good clients' sessions.)
    pub(crate) fn consumed(&self) {
        self.taken.fetch_add(1, Ordering::AcqRel);
        self.run_and_report(self.state.lock());
    }

    /// `recv` took a message straight from the completion queue (not the inbox): the
    /// credit goes back with our next control message, or now once enough are owed
    /// (or bytes of the transport's budget wait to be given back).
    pub(crate) fn took_one(&self) {
        let owed = self.taken.fetch_add(1, Ordering::AcqRel) + 1;
        if owed >= self.credit_threshold() || self.holds_bytes.load(Ordering::Acquire) {
            self.return_taken();
        }
    }

    /// Owed credits from which a credit message goes out on its own.
    fn credit_threshold(&self) -> u32 {
        (self.credits / 4).max(2)
    }

    /// True while received messages wait in the inbox.
    pub(crate) fn has_queued(&self) -> bool {
        self.inbox_len.load(Ordering::Acquire) > 0
    }

    /// Reposts deferred slots and returns owed credits (as a CREDIT once enough are
    /// owed), unless a message sent since did both already: when `recv` has taken
    /// enough messages.
    pub(crate) fn return_taken(&self) {
        if self.taken.load(Ordering::Acquire) == 0 && !self.deferred.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.state.lock();
        st.core.repost_deferred();
        self.run_and_report(st);
    }

    /// Queues a goodbye for the peer; the caller closes after a short grace period.
    pub(crate) fn say_bye(&self) {
        let mut st = self.state.lock();
        st.core.bye();
        self.run_and_report(st);
    }

    /// Waits up to `timeout` until nothing is in flight (or the session closed); true
    /// if so. Woken by every send that finishes, not by a clock.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        self.wait_until(timeout, Session::idle)
    }

    /// The connecting side: whether the peer acknowledged our greeting (or the
    /// session closed).
    pub(crate) fn greeted(&self) -> bool {
        self.state.lock().core.greeted()
    }

    /// [`Conn::greeted`], waiting up to `timeout` for it.
    pub(crate) fn wait_greeted(&self, timeout: Duration) -> bool {
        self.wait_until(timeout, Session::greeted)
    }

    /// Waits up to `timeout` until `done` holds of the core; true if so.
    fn wait_until(&self, timeout: Duration, done: fn(&Session) -> bool) -> bool {
        let mut deadline = None;
        let mut st = self.state.lock();
        loop {
            if done(&st.core) {
                return true;
            }
            if self.sleep(&mut st, Some(timeout), &mut deadline, None) {
                return done(&st.core);
            }
        }
    }

    /// Starts a session whose handshake just finished (protocol version 5): the
    /// connecting side greets the peer over RDMA at once; the accepting side gives
    /// the peer's greeting `within` to arrive (`Session::await_greeting`). Fails if
    /// the greeting could not be posted.
    pub(crate) fn start(&self, accepting: bool, within: Duration) -> Result<(), CloseReason> {
        let mut st = self.state.lock();
        if accepting {
            st.core.await_greeting(within);
        } else {
            st.core.greet();
            self.act_all(&mut st, &mut Vec::new());
        }
        match &st.closed {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    /// Time passed: a message the peer did not acknowledge in time closes the session
    /// (the reason goes to `events`).
    pub(crate) fn tick(&self, now: Instant, events: &mut Vec<Event>) {
        let mut st = self.state.lock();
        if st.core.next_deadline().is_some_and(|d| d <= now) {
            st.core.tick(now);
            self.act_all(&mut st, events);
        } else {
            st.core.tick(now);
        }
    }

    /// Closes the session: windows, then the QP (the device stops touching our
    /// memory), then what was in flight fails and the buffers go. Not logged: the
    /// caller chose the reason (and logs it where it is news).
    pub(crate) fn close(&self, reason: CloseReason) {
        let mut st = self.state.lock();
        if st.core.is_closed() && st.qp.is_some() {
            // Closed before, and its actions cut short (a drain that unwound may
            // have lost its `DestroyQp`): the queue pair goes before any buffer the
            // rest of them release.
            Self::destroy_qp(&mut st);
            st.recv.drain();
        }
        st.core.close(reason);
        self.act_all(&mut st, &mut Vec::new());
    }

    /// Queues a received message for `recv` and wakes waiters.
    pub(crate) fn push_inbox(&self, msg: Message) {
        let mut st = self.state.lock();
        st.inbox.push_back(msg);
        self.inbox_len.store(st.inbox.len(), Ordering::Release);
        drop(st);
        self.cond.notify_all();
    }

    /// Takes the next received message, waiting up to `timeout` (`None`: forever,
    /// zero: not at all).
    pub(crate) fn recv(&self, timeout: Option<Duration>) -> Result<Option<Message>> {
        let mut events = Vec::new();
        let got = self.recv_locked(timeout, &mut events);
        self.report(events);
        got
    }

    /// [`Conn::recv`] under the lock; the events of the credit it gives back go to
    /// `events`, reported once the lock is released.
    fn recv_locked(
        &self,
        timeout: Option<Duration>,
        events: &mut Vec<Event>,
    ) -> Result<Option<Message>> {
        let mut deadline = None;
        let mut st = self.state.lock();
        loop {
            if let Some(msg) = self.take_from_inbox(&mut st, events) {
                return Ok(Some(msg));
            }
            if let Some(reason) = &st.closed {
                return Err(Error::Closed(reason.clone()));
            }
            if st.handed_over {
                return Err(Error::Usage(
                    "a callback was registered while this recv waited: messages go to it, \
                     not to recv"
                        .into(),
                ));
            }
            if self.sleep(&mut st, timeout, &mut deadline, None) {
                return Ok(self.take_from_inbox(&mut st, events));
            }
        }
    }

    /// A callback takes this session's messages over: those waiting in the inbox
    /// (delivered before it was registered) are handed out, oldest first, for it,
    /// and a `recv` waiting for one is woken to fail. Called under the drain lock
    /// (see [`Conn::drain_locked`]), so that no delivery passes them.
    pub(crate) fn hand_inbox_over(&self) -> VecDeque<Message> {
        let mut st = self.state.lock();
        st.handed_over = true;
        let msgs = std::mem::take(&mut st.inbox);
        self.inbox_len.store(0, Ordering::Release);
        drop(st);
        self.cond.notify_all();
        msgs
    }

    /// Runs `f` holding the drain lock, waiting for a drain in progress: every
    /// delivery of the session happens under it.
    pub(crate) fn drain_locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = self.drain_lock.lock();
        f()
    }

    /// [`Conn::drain_locked`] unless another thread drains: then nothing (it is
    /// tried again later).
    pub(crate) fn try_drain_locked(&self, f: impl FnOnce()) {
        if let Some(_guard) = self.drain_lock.try_lock() {
            f()
        }
    }

    /// The oldest message of the inbox, taken by the application (its credit is
    /// owed from now on).
    fn take_from_inbox(&self, st: &mut State, events: &mut Vec<Event>) -> Option<Message> {
        let msg = st.inbox.pop_front()?;
        self.inbox_len.store(st.inbox.len(), Ordering::Release);
        self.taken.fetch_add(1, Ordering::AcqRel);
        self.run(st, events);
        Some(msg)
    }
}

impl Drop for Conn {
    /// A session dropped without closing (a handshake that finished after the
    /// transport shut down): its queue pair goes first, then the receives routed
    /// to it give their shared slots back.
    fn drop(&mut self) {
        let st = self.state.get_mut();
        // The core gives back its share of the transport's budget.
        st.core.release_held();
        if st.qp.is_some() {
            Self::destroy_qp(st);
            st.recv.drain();
        }
    }
}

/// The work request id of a receive into slot `index`.
pub(crate) fn recv_wr_id(index: u32) -> u64 {
    (TAG_RECV << TAG_SHIFT) | u64::from(index)
}

/// The slot a receive's work request id names; `None` for other requests.
pub(crate) fn recv_slot(wr_id: u64) -> Option<u64> {
    (wr_id >> TAG_SHIFT == TAG_RECV).then_some(wr_id & VALUE_MASK)
}

/// The session core's limits and sizes, from the configuration, the peer's
/// credits (its receive slots) and the transport's budgets for all sessions (for
/// the peers' read messages, then for ours).
fn session_params(
    config: &Config,
    peer_credits: u32,
    [all_in, all_out]: [Arc<crate::budget::SharedBudget>; 2],
) -> Params {
    Params {
        credits: config.credits,
        peer_credits,
        send_slots: config.send_slots,
        read_chunk: config.read_chunk,
        reads_in_flight: READS_IN_FLIGHT,
        max_out_messages: config.max_outstanding,
        max_out_bytes: config.max_outstanding_bytes,
        max_in_bytes: config.max_receiving_bytes,
        all_in,
        in_floor: config.reading_floor(),
        all_out,
        ack_timeout: config.ack_timeout,
        windows: WINDOWS,
    }
}

/// The error of an action that needs the QP after it was destroyed.
fn no_qp() -> CloseReason {
    CloseReason::Local("the queue pair is gone".into())
}
