//! One session's connection: its queue pair, control buffers, credits, and the
//! messages in flight both ways. Everything here runs under the connection's lock;
//! what must happen outside it (delivering messages) is returned to the caller.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::message::{Message, Payload};
use crate::pool::BufferPool;
use crate::protocol::{Control, Kind, Limits, CONTROL_HEADER_LEN, MAX_META_LEN};
use crate::slots::{Slot, SlotSlab};
use crate::waiting::Waiting;
use parking_lot::{Condvar, Mutex, MutexGuard};
use rdma_safe::qp::Rts;
use rdma_safe::{
    Access, CompletionQueue, MemoryWindow, MwType, QueuePair, RemoteSlice, SendWr, WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The close reason of a session whose peer disconnected in order.
pub(crate) const PEER_SAID_BYE: &str = "the peer disconnected";

/// Credits a sender keeps for acknowledgements and credit returns (see `flush_inner`).
pub(crate) const DATA_RESERVE: u32 = 3;

/// RDMA READs one session keeps in flight at most.
pub(crate) const READS_IN_FLIGHT: u32 = 16;

const TAG_SHIFT: u32 = 60;
const TAG_RECV: u64 = 1;
const TAG_SEND: u64 = 2;
const TAG_READ: u64 = 3;
/// The LOCAL_INV of an acknowledged message's window (value: the message id).
const TAG_INV: u64 = 4;
/// The BIND_MW of a message's window (unsignaled; seen only if it fails).
const TAG_BIND: u64 = 5;

/// Messages of ours a peer may be reading at once per session: each holds a memory
/// window, bound when its descriptor goes out and invalidated when it is acknowledged.
pub(crate) const WINDOWS: u32 = 16;
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

/// The end of a read send: `Ok` once the peer has the message, else why not.
#[derive(Default)]
pub(crate) struct SendDone {
    result: Mutex<Option<std::result::Result<(), String>>>,
    cond: Condvar,
}

impl SendDone {
    pub(crate) fn finish(&self, result: std::result::Result<(), String>) {
        let mut r = self.result.lock();
        if r.is_none() {
            *r = Some(result);
            self.cond.notify_all();
        }
    }

    /// True once finished, either way.
    pub(crate) fn is_finished(&self) -> bool {
        self.result.lock().is_some()
    }

    /// Waits up to `timeout` (forever if `None`); `None` if still running.
    pub(crate) fn wait(
        &self,
        timeout: Option<Duration>,
    ) -> Option<std::result::Result<(), String>> {
        let mut r = self.result.lock();
        // The clock is read only when the result is not there yet.
        let deadline = if r.is_none() {
            timeout.map(|t| Instant::now() + t)
        } else {
            None
        };
        while r.is_none() {
            match deadline {
                None => self.cond.wait(&mut r),
                Some(d) => {
                    if self.cond.wait_until(&mut r, d).timed_out() {
                        break;
                    }
                }
            }
        }
        r.clone()
    }
}

/// A control message waiting for a credit and a send slot.
enum Pending {
    Eager {
        msg_id: u64,
        msg: Message,
    },
    Data {
        msg_id: u64,
        remote: RemoteSlice,
        meta: [u8; MAX_META_LEN],
        meta_len: u8,
    },
    Bye,
}

/// A message of ours the peer is reading.
struct Outgoing {
    bytes: Payload,
    done: Arc<SendDone>,
    /// The window that grants the peer RDMA READ on exactly these bytes, from when the
    /// descriptor goes out until the invalidation after the acknowledgement completed.
    window: Option<MemoryWindow>,
    /// The peer's acknowledgement code, once it came (the invalidation is under way).
    acked: Option<u64>,
}

/// A message of the peer's, being read or waiting for an earlier one to be delivered.
struct Incoming {
    /// The bytes: a pooled buffer (the READ target) or, for eager messages, a vector.
    buf: Payload,
    reads_left: u32,
    meta: [u8; MAX_META_LEN],
    meta_len: u8,
    /// Read from the peer's memory: the peer waits for an acknowledgement.
    needs_ack: bool,
}

/// One piece of an RDMA READ still to post.
struct ReadJob {
    msg_id: u64,
    offset: usize,
    len: u32,
    remote_addr: u64,
    rkey: u32,
}

/// The session's state. `qp` comes first: dropped first, so the device is done with
/// the slabs before they go (`close_locked` drops it earlier still).
struct State {
    qp: Option<QueuePair<Rts>>,
    /// Our receive slots, one per credit the peer holds.
    recv: SlotSlab,
    /// Our send slots.
    send: SlotSlab,
    closed: Option<String>,
    /// SENDs we may still post to the peer.
    send_credits: u32,
    /// Our receive slots consumed and reposted, not yet told to the peer.
    to_return: u32,
    /// Receive slots of delivered messages, reposted later (after the reply went
    /// out, or at the next poll): their credits wait for the repost.
    to_repost: Vec<Slot>,
    /// Send slots not posted.
    free_slots: Vec<Slot>,
    /// The eager message id each busy send slot carries (0: a control message).
    slot_msg: Vec<u64>,
    pending: VecDeque<Pending>,
    /// Acknowledgements to send; they pass queued messages (see `flush_inner`).
    acks: VecDeque<u64>,
    outgoing: HashMap<u64, Outgoing>,
    /// Windows free for the next descriptor, and how many exist in all.
    windows: Vec<MemoryWindow>,
    windows_made: u32,
    incoming: HashMap<u64, Incoming>,
    /// Message ids in arrival order: messages are delivered in this order only.
    arrival: VecDeque<u64>,
    reads: VecDeque<ReadJob>,
    reads_in_flight: u32,
    inbox: VecDeque<Message>,
    next_msg_id: u64,
    /// The highest message id received from the peer (told back in `seen`).
    received_upto: u64,
    /// Our eager messages are done up to this id: they are posted in id order, and
    /// SEND completions (and the peer's `seen`) come in that order.
    eager_done: u64,
    /// The id of our last eager message.
    eager_last: u64,
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
    read_chunk: u32,
    limits: Limits,
    pool: Arc<BufferPool>,
    state: Mutex<State>,
    /// Held while draining the CQ, so completions are handled in order by one thread.
    drain_lock: Mutex<()>,
    /// Signalled when the inbox grows or the session closes.
    cond: Condvar,
    /// Whether waiting threads spin, and whether the poller may arm the CQ.
    pub(crate) waiting: Waiting,
    /// The engine, for threads that wait on this session.
    pub(crate) engine: Weak<crate::engine::Engine>,
    /// Copies of `State::eager_done`, the inbox length and whether the session is
    /// closed, for spinning waiters: they look without taking the lock.
    eager_done: AtomicU64,
    inbox_len: AtomicUsize,
    is_closed: AtomicBool,
    /// Messages the application took whose credits are not in `State::to_return`
    /// yet: the next control message sends them (a reply, usually), once their
    /// slots are reposted (see [`Conn::fold_taken`]).
    taken: AtomicU32,
    /// Set while `State::to_repost` is not empty.
    deferred: AtomicBool,
}

/// What the poller must do after a completion, outside the lock.
pub(crate) enum Event {
    /// A message arrived.
    Delivered(Message),
    /// The session closed, for this reason.
    Closed(String),
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
        recv: SlotSlab,
        send: SlotSlab,
        send_slots: Vec<Slot>,
        config: &Config,
        peer_credits: u32,
        peer_limits: Limits,
        pool: Arc<BufferPool>,
        engine: Weak<crate::engine::Engine>,
    ) -> Conn {
        let slots = config.send_slots;
        Conn {
            id,
            peer,
            cq,
            tcp,
            slot_size: config.slot_size(),
            credits: config.credits,
            eager_threshold: (config.eager_threshold as usize)
                .min(peer_limits.eager_threshold as usize),
            read_chunk: config.read_chunk,
            limits: Limits {
                max_message: config.max_message,
                eager_threshold: config.eager_threshold,
            },
            pool,
            state: Mutex::new(State {
                qp: Some(qp),
                recv,
                send,
                closed: None,
                send_credits: peer_credits,
                to_return: 0,
                to_repost: Vec::with_capacity(config.credits as usize),
                free_slots: send_slots,
                slot_msg: vec![0; slots as usize],
                pending: VecDeque::with_capacity(64),
                acks: VecDeque::with_capacity(64),
                outgoing: HashMap::with_capacity(64),
                windows: Vec::with_capacity(WINDOWS as usize),
                windows_made: 0,
                incoming: HashMap::with_capacity(64),
                arrival: VecDeque::with_capacity(64),
                reads: VecDeque::with_capacity(64),
                reads_in_flight: 0,
                inbox: VecDeque::with_capacity(64),
                next_msg_id: 1,
                received_upto: 0,
                eager_done: 0,
                eager_last: 0,
            }),
            cond: Condvar::new(),
            drain_lock: Mutex::new(()),
            waiting: Waiting::default(),
            engine,
            eager_done: AtomicU64::new(0),
            inbox_len: AtomicUsize::new(0),
            is_closed: AtomicBool::new(false),
            taken: AtomicU32::new(0),
            deferred: AtomicBool::new(false),
        }
    }

    /// Posts receive slot `slot` of `recv` (used at setup and after each receive).
    pub(crate) fn post_recv_slot(
        qp: &QueuePair<impl rdma_safe::qp::CanRecv>,
        recv: &mut SlotSlab,
        slot: Slot,
    ) -> rdma_safe::Result<()> {
        let wr_id = (TAG_RECV << TAG_SHIFT) | u64::from(slot.index());
        // SAFETY: the slab outlives the QP's use of it: `establish` creates the slabs
        // before the QP (locals drop in reverse), and a session drops its QP first
        // (`close_locked`, and the field order of `State`).
        unsafe { recv.post_recv(qp, slot, wr_id) }
    }

    /// Why the session closed, if it did.
    pub(crate) fn closed(&self) -> Option<String> {
        self.state.lock().closed.clone()
    }

    /// Starts sending `msg`; what it returns completes when the peer has it.
    pub(crate) fn send(&self, msg: Message) -> Result<Sent> {
        let len = msg.len() as u64;
        if len > self.limits.max_message {
            return Err(Error::Usage(
                format!(
                    "message of {len} bytes exceeds max_message ({})",
                    self.limits.max_message
                )
                .into(),
            ));
        }
        // The copy into a registered buffer happens before taking the lock.
        let eager = msg.is_empty()
            || (msg.len() <= self.eager_threshold && !matches!(msg.payload, Payload::Region(..)));
        let prepared = if eager {
            Err(msg)
        } else {
            Ok(self.registered(msg)?)
        };
        let mut st = self.state.lock();
        if let Some(reason) = &st.closed {
            return Err(Error::Closed(reason.clone()));
        }
        let msg_id = st.next_msg_id;
        st.next_msg_id += 1;
        let sent = match prepared {
            // Nothing queued ahead and the credits are there: straight out, without
            // the trip through the queue (the common case of a request or a reply).
            Err(msg)
                if st.pending.is_empty()
                    && st.acks.is_empty()
                    && st.send_credits > DATA_RESERVE
                    && !st.free_slots.is_empty() =>
            {
                st.eager_last = msg_id;
                // The message is out; then what was put off for it: reposting.
                let posted = self
                    .post_eager(&mut st, msg_id, &msg)
                    .and_then(|()| self.repost_deferred(&mut st));
                match posted {
                    Ok(()) => self.fold_taken(&mut st),
                    Err(reason) => self.close_locked(&mut st, reason),
                }
                return Ok(Sent::Eager(msg_id));
            }
            Err(msg) => {
                st.eager_last = msg_id;
                st.pending.push_back(Pending::Eager { msg_id, msg });
                Sent::Eager(msg_id)
            }
            Ok((bytes, remote, meta, meta_len)) => {
                let done = Arc::new(SendDone::default());
                st.outgoing.insert(
                    msg_id,
                    Outgoing {
                        bytes,
                        done: done.clone(),
                        window: None,
                        acked: None,
                    },
                );
                st.pending.push_back(Pending::Data {
                    msg_id,
                    remote,
                    meta,
                    meta_len,
                });
                Sent::Read(done)
            }
        };
        self.flush(&mut st);
        Ok(sent)
    }

    /// Whether eager message `msg_id` is done (or the session closed), without the
    /// lock: for spinning waiters.
    pub(crate) fn eager_settled(&self, msg_id: u64) -> bool {
        self.eager_done.load(Ordering::Acquire) >= msg_id || self.is_closed.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` (forever if `None`) for eager message `msg_id`: `None`
    /// if still in flight, else whether the peer got it.
    pub(crate) fn wait_eager(
        &self,
        msg_id: u64,
        timeout: Option<Duration>,
    ) -> Option<std::result::Result<(), String>> {
        if self.eager_done.load(Ordering::Acquire) >= msg_id {
            return Some(Ok(()));
        }
        let mut deadline = None;
        let mut st = self.state.lock();
        loop {
            if st.eager_done >= msg_id {
                return Some(Ok(()));
            }
            if let Some(reason) = &st.closed {
                return Some(Err(reason.clone()));
            }
            if self.sleep(&mut st, timeout, &mut deadline) {
                return None;
            }
        }
    }

    /// Sleeps on the session's condition until woken, or until `timeout` after the
    /// first call of this wait (kept in `deadline`); true once that time has passed.
    /// The clock is read only here, when there is something to wait for.
    fn sleep(
        &self,
        st: &mut MutexGuard<'_, State>,
        timeout: Option<Duration>,
        deadline: &mut Option<Instant>,
    ) -> bool {
        if deadline.is_none() {
            *deadline = timeout.map(|t| Instant::now() + t);
        }
        match *deadline {
            None => {
                self.cond.wait(st);
                false
            }
            Some(d) => Instant::now() >= d || self.cond.wait_until(st, d).timed_out(),
        }
    }

    /// Eager messages up to `upto` are done: wakes their waiters.
    fn eager_done_upto(&self, st: &mut State, upto: u64) {
        if upto > st.eager_done {
            st.eager_done = upto;
            self.eager_done.store(upto, Ordering::Release);
            self.cond.notify_all();
        }
    }

    /// The bytes of `msg` in registered memory, where the peer will read them.
    fn registered(&self, msg: Message) -> Result<(Payload, RemoteSlice, [u8; MAX_META_LEN], u8)> {
        let mut meta = [0u8; MAX_META_LEN];
        meta[..msg.meta().len()].copy_from_slice(msg.meta());
        let meta_len = msg.meta().len() as u8;
        let (payload, remote) = match msg.payload {
            Payload::Region(region, range) => {
                let remote = region.remote(range.clone())?;
                (Payload::Region(region, range), remote)
            }
            Payload::Pooled(buf) => {
                let remote = buf.region().remote(0..buf.len())?;
                (Payload::Pooled(buf), remote)
            }
            Payload::Bytes(v) => {
                let mut buf = self.pool.get(v.len())?;
                buf.bytes_mut()
                    .ok_or_else(|| Error::Usage("a fresh pool buffer was shared".into()))?
                    .copy_from_slice(&v);
                let remote = buf.region().remote(0..buf.len())?;
                (Payload::Pooled(buf), remote)
            }
        };
        Ok((payload, remote, meta, meta_len))
    }

    /// Handles one completion of this connection's CQ (the caller flushes after).
    fn on_completion(&self, st: &mut State, wc: &WorkCompletion, events: &mut Vec<Event>) {
        if st.closed.is_some() {
            return;
        }
        let tag = wc.wr_id() >> TAG_SHIFT;
        let value = wc.wr_id() & VALUE_MASK;
        if let Err(e) = wc.result() {
            let reason = format!("RDMA failed: {e}");
            self.close_locked(st, reason.clone());
            events.push(Event::Closed(reason));
            return;
        }
        let outcome = match tag {
            TAG_RECV => self.on_recv(st, value, wc.byte_len() as usize, events),
            TAG_SEND => match st.send.complete(value) {
                Ok(slot) => {
                    let msg_id = std::mem::take(&mut st.slot_msg[slot.index() as usize]);
                    st.free_slots.push(slot);
                    self.eager_done_upto(st, msg_id);
                    Ok(())
                }
                Err(e) => Err(format!("send {e}")),
            },
            TAG_READ => self.on_read(st, value, events),
            TAG_INV => self.on_invalidated(st, value),
            _ => Err(format!("completion with unknown id {:#x}", wc.wr_id())),
        };
        if let Err(reason) = outcome {
            self.close_locked(st, reason.clone());
            events.push(Event::Closed(reason));
        }
    }

    fn on_recv(
        &self,
        st: &mut State,
        index: u64,
        len: usize,
        events: &mut Vec<Event>,
    ) -> std::result::Result<(), String> {
        if len > self.slot_size {
            return Err(format!(
                "receive completion for slot {index} of {len} bytes is invalid"
            ));
        }
        // The receive completed: the slot is ours until it is posted again.
        let slot = st
            .recv
            .complete(index)
            .map_err(|e| format!("receive {e}"))?;
        let decoded = Control::decode(st.recv.bytes(&slot, len), &self.limits).map_err(|e| e.0)?;
        let (header, kind) = (decoded.header, decoded.kind);
        let mut meta = [0u8; MAX_META_LEN];
        meta[..decoded.meta.len()].copy_from_slice(decoded.meta);
        let meta_len = decoded.meta.len() as u8;
        // Small bytes: a plain vector is cheaper than a registered buffer. (After this,
        // nothing borrows the slot's bytes.)
        let eager_bytes = match kind {
            Kind::Eager => decoded.payload.to_vec(),
            _ => Vec::new(),
        };
        st.send_credits = st
            .send_credits
            .checked_add(header.credits)
            .filter(|c| *c <= 1 << 20)
            .ok_or_else(|| "the peer returned more credits than it could have".to_string())?;
        self.on_seen(st, header.seen);
        let msg_id = header.msg_id;
        // A message's slot is credited back once the application took it (`consumed`);
        // control messages' slots at once.
        let credit_now = !matches!(kind, Kind::Eager | Kind::Data);
        if matches!(kind, Kind::Eager | Kind::Data) {
            // Every id in `incoming` is at most `received_upto`: no lookup needed.
            if msg_id <= st.received_upto {
                return Err(format!(
                    "message id {msg_id} repeats or goes backwards (last {})",
                    st.received_upto
                ));
            }
            st.received_upto = msg_id;
        }
        match kind {
            Kind::Eager => {
                let payload = Payload::Bytes(eager_bytes);
                if st.arrival.is_empty() {
                    // Nothing ahead of it: deliver at once.
                    events.push(Event::Delivered(Message::from_parts(
                        payload, meta, meta_len,
                    )));
                } else {
                    st.incoming.insert(
                        msg_id,
                        Incoming {
                            buf: payload,
                            reads_left: 0,
                            meta,
                            meta_len,
                            needs_ack: false,
                        },
                    );
                    st.arrival.push_back(msg_id);
                    self.deliver_ready(st, events)?;
                }
            }
            Kind::Data => {
                let len = header.len as usize;
                let buf = self.pool.get(len).map_err(|e| e.to_string())?;
                let chunks = len.div_ceil(self.read_chunk as usize) as u32;
                for i in 0..chunks {
                    let offset = i as usize * self.read_chunk as usize;
                    st.reads.push_back(ReadJob {
                        msg_id,
                        offset,
                        len: (len - offset).min(self.read_chunk as usize) as u32,
                        remote_addr: header.addr + offset as u64,
                        rkey: header.rkey,
                    });
                }
                st.incoming.insert(
                    msg_id,
                    Incoming {
                        buf: Payload::Pooled(buf),
                        reads_left: chunks,
                        meta,
                        meta_len,
                        needs_ack: true,
                    },
                );
                st.arrival.push_back(msg_id);
            }
            Kind::Ack => self.on_ack(st, msg_id, header.len)?,
            Kind::Credit => {}
            Kind::Bye => return Err(PEER_SAID_BYE.into()),
        }
        if credit_now {
            // A control message's slot is free again: repost it, owe a credit.
            let qp = st.qp.as_ref().expect("open sessions have a QP");
            Conn::post_recv_slot(qp, &mut st.recv, slot).map_err(|e| e.to_string())?;
            st.to_return += 1;
        } else {
            // A message's slot (its bytes are copied out, or it was a descriptor) is
            // reposted after the delivery: off the path to a reply.
            st.to_repost.push(slot);
            self.deferred.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Reposts the receive slots whose reposting was deferred.
    fn repost_deferred(&self, st: &mut State) -> std::result::Result<(), String> {
        if st.to_repost.is_empty() {
            return Ok(());
        }
        let qp = st.qp.as_ref().expect("open sessions have a QP");
        for slot in st.to_repost.drain(..) {
            Conn::post_recv_slot(qp, &mut st.recv, slot).map_err(|e| e.to_string())?;
        }
        self.deferred.store(false, Ordering::Release);
        Ok(())
    }

    /// Moves credits of taken messages into `to_return`, except as many as slots
    /// still wait for their repost: a credit never goes back before its slot is
    /// posted again.
    fn fold_taken(&self, st: &mut State) {
        let unposted = st.to_repost.len() as u32;
        let taken = self.taken.load(Ordering::Acquire);
        if taken > unposted {
            // Only holders of the state lock take from `taken`: it cannot drop below.
            self.taken.fetch_sub(taken - unposted, Ordering::AcqRel);
            st.to_return += taken - unposted;
        }
    }

    /// The peer has our messages up to the id whose low 32 bits are `seen`: our
    /// eager sends up to there are complete.
    fn on_seen(&self, st: &mut State, seen: u32) {
        // A lie only completes eager sends early, as a lying SEND completion would.
        // (Read messages complete by acknowledgement only.)
        let upto = crate::protocol::widen_seen(seen, st.next_msg_id - 1).min(st.eager_last);
        self.eager_done_upto(st, upto);
    }

    fn on_read(
        &self,
        st: &mut State,
        msg_id: u64,
        events: &mut Vec<Event>,
    ) -> std::result::Result<(), String> {
        st.reads_in_flight -= 1;
        let inc = st
            .incoming
            .get_mut(&msg_id)
            .ok_or_else(|| format!("read completion for unknown message {msg_id}"))?;
        inc.reads_left -= 1;
        self.deliver_ready(st, events)
    }

    /// Delivers, in arrival order, every message that is complete and not waiting
    /// behind an earlier one; read messages are acknowledged as they go.
    fn deliver_ready(
        &self,
        st: &mut State,
        events: &mut Vec<Event>,
    ) -> std::result::Result<(), String> {
        while let Some(&id) = st.arrival.front() {
            if st.incoming.get(&id).is_some_and(|i| i.reads_left > 0) {
                break;
            }
            st.arrival.pop_front();
            let Some(inc) = st.incoming.remove(&id) else {
                continue;
            };
            if inc.needs_ack {
                st.acks.push_back(id);
            }
            events.push(Event::Delivered(Message::from_parts(
                inc.buf,
                inc.meta,
                inc.meta_len,
            )));
        }
        Ok(())
    }

    /// Posts what credits, slots and read depth allow.
    fn flush(&self, st: &mut State) {
        if st.closed.is_some() {
            return;
        }
        if let Err(reason) = self.flush_inner(st) {
            self.close_locked(st, reason);
        }
    }

    fn flush_inner(&self, st: &mut State) -> std::result::Result<(), String> {
        // READs first: they need no credit.
        while st.reads_in_flight < READS_IN_FLIGHT {
            let Some(job) = st.reads.pop_front() else {
                break;
            };
            let inc = st
                .incoming
                .get(&job.msg_id)
                .ok_or_else(|| "read job of a vanished message".to_string())?;
            let Payload::Pooled(target) = &inc.buf else {
                return Err("read job for a message that is not read".to_string());
            };
            let local = target
                .region()
                .local(job.offset..job.offset + job.len as usize)
                .map_err(|e| e.to_string())?;
            let mut sge = [local];
            let remote = RemoteSlice {
                addr: job.remote_addr,
                len: u64::from(job.len),
                rkey: job.rkey,
            };
            let mut wr = SendWr::rdma_read((TAG_READ << TAG_SHIFT) | job.msg_id, &mut sge, remote)
                .signaled();
            let qp = st.qp.as_ref().expect("open sessions have a QP");
            // SAFETY: the target buffer is owned by `incoming` until this READ's
            // completion; on close the QP is reset before the buffer is released.
            unsafe { qp.post_send(&mut wr) }.map_err(|e| e.to_string())?;
            st.reads_in_flight += 1;
        }
        // A credit return may use the last credit, ahead of everything else, so that
        // the two sides can never both wait for credits.
        self.fold_taken(st);
        if st.to_return >= self.credit_threshold()
            && st.send_credits >= 1
            && !st.free_slots.is_empty()
        {
            let mut h = Control::default();
            self.post_control(st, Kind::Credit, &mut h, &[], &[], 0)?;
        }
        // Acknowledgements keep one credit in reserve for credit returns, and pass
        // queued messages, so a sender waiting for one never waits behind data.
        while st.send_credits >= 2 && !st.free_slots.is_empty() {
            let Some(msg_id) = st.acks.pop_front() else {
                break;
            };
            let mut h = Control {
                msg_id,
                ..Default::default()
            };
            self.post_control(st, Kind::Ack, &mut h, &[], &[], 0)?;
        }
        // Messages keep DATA_RESERVE credits for acknowledgements and credit returns:
        // the peer withholds a message's credit until its application took it, so
        // without the reserve an unread inbox could block the acknowledgements.
        loop {
            let need = match st.pending.front() {
                None => break,
                Some(Pending::Bye) => 2,
                Some(_) => DATA_RESERVE + 1,
            };
            if st.send_credits < need || st.free_slots.is_empty() {
                break;
            }
            // A descriptor needs a window: at most WINDOWS are being read at once.
            if matches!(st.pending.front(), Some(Pending::Data { .. }))
                && st.windows.is_empty()
                && st.windows_made >= WINDOWS
            {
                break;
            }
            let Some(item) = st.pending.pop_front() else {
                break;
            };
            match item {
                Pending::Eager { msg_id, msg } => self.post_eager(st, msg_id, &msg)?,
                Pending::Data {
                    msg_id,
                    remote,
                    meta,
                    meta_len,
                } => {
                    let rkey = self.bind_window(st, msg_id)?;
                    let mut h = Control {
                        msg_id,
                        len: remote.len,
                        addr: remote.addr,
                        rkey,
                        meta_len,
                        ..Default::default()
                    };
                    self.post_control(st, Kind::Data, &mut h, &meta[..meta_len as usize], &[], 0)?;
                }
                Pending::Bye => {
                    let mut h = Control::default();
                    self.post_control(st, Kind::Bye, &mut h, &[], &[], 0)?;
                }
            }
        }
        Ok(())
    }

    /// Binds a window over exactly message `msg_id`'s bytes, granting RDMA READ to the
    /// peer on this session's queue pair only, and returns its key for the descriptor.
    /// The bind goes on the send queue ahead of the descriptor, so it is in place
    /// before the peer can know the key.
    fn bind_window(&self, st: &mut State, msg_id: u64) -> std::result::Result<u32, String> {
        let qp = st.qp.as_ref().expect("open sessions have a QP");
        let mut window = match st.windows.pop() {
            Some(w) => w,
            None => {
                st.windows_made += 1;
                MemoryWindow::new(qp.pd(), MwType::Type2).map_err(|e| e.to_string())?
            }
        };
        let out = st
            .outgoing
            .get_mut(&msg_id)
            .ok_or_else(|| format!("descriptor of vanished message {msg_id}"))?;
        let (region, range) = match &out.bytes {
            Payload::Region(r, range) => (r, range.clone()),
            Payload::Pooled(b) => (b.region(), 0..b.len()),
            Payload::Bytes(_) => return Err("a read message not in registered memory".into()),
        };
        let (wr, rkey) = SendWr::bind_mw(
            (TAG_BIND << TAG_SHIFT) | msg_id,
            &mut window,
            region,
            range,
            Access::REMOTE_READ,
        )
        .map_err(|e| e.to_string())?;
        let mut wr = wr;
        // SAFETY: no local buffer is named; the window holds the region (an `Arc`)
        // while bound, and is deallocated before the QP and the region on close.
        unsafe { qp.post_send(&mut wr) }.map_err(|e| e.to_string())?;
        out.window = Some(window);
        Ok(rkey)
    }

    /// The peer acknowledged message `msg_id`: revokes its window (LOCAL_INV); the
    /// send finishes, and its buffer is released, when the invalidation completed.
    fn on_ack(&self, st: &mut State, msg_id: u64, code: u64) -> std::result::Result<(), String> {
        let out = st
            .outgoing
            .get_mut(&msg_id)
            .filter(|o| o.acked.is_none())
            .ok_or_else(|| {
                format!("acknowledgement of message {msg_id}, which is not in flight")
            })?;
        let rkey = out
            .window
            .as_ref()
            .ok_or_else(|| format!("acknowledgement of message {msg_id} before its descriptor"))?
            .rkey();
        out.acked = Some(code);
        let mut wr = SendWr::local_invalidate((TAG_INV << TAG_SHIFT) | msg_id, rkey).signaled();
        let qp = st.qp.as_ref().expect("open sessions have a QP");
        // SAFETY: no local buffer is named.
        unsafe { qp.post_send(&mut wr) }.map_err(|e| e.to_string())
    }

    /// The window of message `msg_id` is invalidated: the peer can no longer read it.
    /// The send finishes with the acknowledgement's outcome and the buffer goes.
    fn on_invalidated(&self, st: &mut State, msg_id: u64) -> std::result::Result<(), String> {
        let mut out = st
            .outgoing
            .remove(&msg_id)
            .filter(|o| o.acked.is_some())
            .ok_or_else(|| {
                format!("invalidation of message {msg_id}, which was not acknowledged")
            })?;
        if let Some(mut window) = out.window.take() {
            // SAFETY: this LOCAL_INV of the window's key completed (successfully: a
            // failed one closes the session before reaching here); no bind is posted.
            unsafe { window.release_region() };
            st.windows.push(window);
        }
        // The buffer goes before the sender hears: a caller that waits for the send
        // then holds its region alone again.
        drop(std::mem::replace(
            &mut out.bytes,
            Payload::Bytes(Vec::new()),
        ));
        match out.acked {
            Some(0) => out.done.finish(Ok(())),
            Some(code) => out
                .done
                .finish(Err(format!("the peer refused the message (code {code})"))),
            None => {}
        }
        Ok(())
    }

    /// Posts an eager message (its bytes inside the SEND); it completes when the
    /// peer says it has seen it, or when the SEND completes.
    fn post_eager(
        &self,
        st: &mut State,
        msg_id: u64,
        msg: &Message,
    ) -> std::result::Result<(), String> {
        let mut h = Control {
            msg_id,
            len: msg.len() as u64,
            meta_len: msg.meta().len() as u8,
            ..Default::default()
        };
        self.post_control(st, Kind::Eager, &mut h, msg.meta(), msg.bytes(), msg_id)
    }

    /// Writes a control message into a free send slot and posts it; `eager_id`: the
    /// eager message it carries (0: none).
    fn post_control(
        &self,
        st: &mut State,
        kind: Kind,
        h: &mut Control,
        meta: &[u8],
        payload: &[u8],
        eager_id: u64,
    ) -> std::result::Result<(), String> {
        let mut slot = st.free_slots.pop().expect("caller checked");
        self.fold_taken(st);
        h.credits = std::mem::take(&mut st.to_return);
        // The low 32 bits: the peer widens them (see `on_seen`).
        h.seen = st.received_upto as u32;
        let total = CONTROL_HEADER_LEN + meta.len() + payload.len();
        let buf = st.send.bytes_mut(&mut slot, total);
        h.write_header(kind, &mut buf[..CONTROL_HEADER_LEN]);
        buf[CONTROL_HEADER_LEN..CONTROL_HEADER_LEN + meta.len()].copy_from_slice(meta);
        buf[CONTROL_HEADER_LEN + meta.len()..].copy_from_slice(payload);
        let index = slot.index();
        let wr_id = (TAG_SEND << TAG_SHIFT) | u64::from(index);
        let inline = total <= crate::engine::INLINE_BYTES as usize;
        let qp = st.qp.as_ref().expect("open sessions have a QP");
        // SAFETY: as in `post_recv_slot`; the slot is the device's until this SEND's
        // completion hands it back (`on_completion`).
        unsafe { st.send.post_send(qp, slot, total, wr_id, inline) }.map_err(|e| e.to_string())?;
        st.send_credits -= 1;
        st.slot_msg[index as usize] = eager_id;
        Ok(())
    }

    /// The application took a delivered message (its callback returned, or `recv`
    /// handed it out): the peer may send one more.
    pub(crate) fn consumed(&self) {
        self.taken.fetch_add(1, Ordering::AcqRel);
        let mut st = self.state.lock();
        if st.closed.is_none() {
            self.flush(&mut st);
        }
    }

    /// An inline callback is about to take a message. The callback runs on the thread
    /// that reaps completions (nothing piles up while it runs), so the message counts
    /// as taken at once: once its slot is reposted, a reply the callback sends
    /// carries the credit, and [`Conn::return_taken`] sends it otherwise.
    pub(crate) fn taking(&self) {
        self.taken.fetch_add(1, Ordering::AcqRel);
    }

    /// `recv` took a message straight from the completion queue (not the inbox): as
    /// for an inline callback, the credit goes back with our next control message,
    /// or now once enough are owed.
    pub(crate) fn took_one(&self) {
        let owed = self.taken.fetch_add(1, Ordering::AcqRel) + 1;
        if owed >= self.credit_threshold() {
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
    /// owed), unless a message sent since did both already: after an inline callback,
    /// or when `recv` has taken enough messages.
    pub(crate) fn return_taken(&self) {
        if self.taken.load(Ordering::Acquire) == 0 && !self.deferred.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.state.lock();
        if st.closed.is_none() {
            if let Err(reason) = self.repost_deferred(&mut st) {
                return self.close_locked(&mut st, reason);
            }
            self.flush(&mut st);
        }
    }

    /// Queues a goodbye for the peer; the caller closes after a short grace period.
    pub(crate) fn say_bye(&self) {
        let mut st = self.state.lock();
        if st.closed.is_none() {
            st.pending.push_back(Pending::Bye);
            self.flush(&mut st);
        }
    }

    /// True when nothing of ours is in flight (sends waiting for their ack, reads).
    pub(crate) fn idle(&self) -> bool {
        let st = self.state.lock();
        st.closed.is_some()
            || (st.outgoing.is_empty()
                && st.incoming.is_empty()
                && st.pending.is_empty()
                && st.acks.is_empty()
                && st.eager_done >= st.eager_last)
    }

    /// Closes the session: resets the QP (the device stops touching our memory), then
    /// fails what was in flight and releases the buffers.
    pub(crate) fn close(&self, reason: String) {
        let mut st = self.state.lock();
        self.close_locked(&mut st, reason);
    }

    fn close_locked(&self, st: &mut State, reason: String) {
        if st.closed.is_some() {
            return;
        }
        // Destroying the QP (not resetting it: Soft-RoCE in Linux 6.1 underflows a
        // reference count destroying a QP it had reset) discards every outstanding
        // request; after it the device no longer reads or writes our buffers.
        // Windows first: deallocated, none grants the peer anything any more (and rxe
        // stalls destroying a QP that a bound type 2 window refers to). They let go of
        // their regions here; the buffers themselves go after the QP.
        st.windows.clear();
        for out in st.outgoing.values_mut() {
            drop(out.window.take());
        }
        drop(st.qp.take());
        for (_, out) in st.outgoing.drain() {
            out.done.finish(Err(reason.clone()));
        }
        st.acks.clear();
        // Eager messages not done by now fail: `wait_eager` reports the reason.
        st.pending.clear();
        st.incoming.clear();
        st.arrival.clear();
        st.to_repost.clear();
        st.reads.clear();
        let _ = self.tcp.shutdown(std::net::Shutdown::Both);
        st.closed = Some(reason);
        self.is_closed.store(true, Ordering::Release);
        self.cond.notify_all();
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
        let mut deadline = None;
        let mut st = self.state.lock();
        loop {
            if let Some(msg) = self.take_from_inbox(&mut st) {
                return Ok(Some(msg));
            }
            if let Some(reason) = &st.closed {
                return Err(Error::Closed(reason.clone()));
            }
            if self.sleep(&mut st, timeout, &mut deadline) {
                return Ok(self.take_from_inbox(&mut st));
            }
        }
    }

    /// The oldest message of the inbox, taken by the application (its credit is
    /// owed from now on).
    fn take_from_inbox(&self, st: &mut State) -> Option<Message> {
        let msg = st.inbox.pop_front()?;
        self.inbox_len.store(st.inbox.len(), Ordering::Release);
        self.taken.fetch_add(1, Ordering::AcqRel);
        self.flush(st);
        Some(msg)
    }

    /// Drains the CQ unless another thread is doing it, handing every event to
    /// `route` while still holding the drain lock, so that deliveries keep their
    /// order whichever thread reaps them. Returns whether anything happened.
    /// `arm`: re-arm the completion notification when empty (a system call on some
    /// providers): the poller does before it sleeps; a spinning caller need not.
    pub(crate) fn try_drain(
        &self,
        wcs: &mut [WorkCompletion],
        events: &mut Vec<Event>,
        arm: bool,
        route: &mut dyn FnMut(Event),
    ) -> bool {
        let Some(_guard) = self.drain_lock.try_lock() else {
            return false;
        };
        let mut active = false;
        let mut armed = false;
        loop {
            let polled = self.poll_batch(wcs, events);
            // What this batch delivered goes out before the next poll: a callback's
            // reply leaves sooner.
            for ev in events.drain(..) {
                route(ev);
            }
            match polled {
                None => return active,
                Some(0) if !arm || armed => return active,
                Some(0) => {
                    // Nothing more to do before sleeping: repost what was put off.
                    if self.deferred.load(Ordering::Acquire) {
                        let mut st = self.state.lock();
                        if st.closed.is_none() {
                            match self.repost_deferred(&mut st) {
                                Ok(()) => self.flush(&mut st),
                                Err(reason) => self.close_locked(&mut st, reason),
                            }
                        }
                    }
                    // Completions that arrive after the re-arm raise an event; those
                    // that came before it are polled once more.
                    if self.cq.req_notify(false).is_err() {
                        return active;
                    }
                    armed = true;
                }
                Some(_) => active = true,
            }
        }
    }

    /// True when a message waits in the inbox or the session is closed (without the
    /// lock: spinning waiters ask this every round).
    pub(crate) fn has_news(&self) -> bool {
        self.inbox_len.load(Ordering::Acquire) > 0 || self.is_closed.load(Ordering::Acquire)
    }

    /// Polls one batch of completions and handles them; `None` if polling failed
    /// (the session is then closed). Callers hold `drain_lock` (see `try_drain`).
    fn poll_batch(&self, wcs: &mut [WorkCompletion], events: &mut Vec<Event>) -> Option<usize> {
        match self.cq.poll(wcs) {
            Ok([]) => Some(0),
            Ok(done) => {
                // One trip through the lock for the whole batch.
                let mut st = self.state.lock();
                if st.closed.is_none() {
                    if let Err(reason) = self.repost_deferred(&mut st) {
                        self.close_locked(&mut st, reason.clone());
                        events.push(Event::Closed(reason));
                    }
                }
                for wc in done.iter() {
                    self.on_completion(&mut st, wc, events);
                }
                self.flush(&mut st);
                Some(done.len())
            }
            Err(e) => {
                let reason = format!("polling the completion queue failed: {e}");
                self.close(reason.clone());
                events.push(Event::Closed(reason));
                None
            }
        }
    }
}
