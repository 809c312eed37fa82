//! The session core: the protocol logic of one KIARA session as a state machine with
//! no verbs, no threads and no clock of its own (quinn-proto beside quinn is the model;
//! `protocol.rs` is the same for the wire format).
//!
//! It knows messages only by id. A driver feeds it what happened (the application
//! sent or took a message, a control message arrived in a receive slot, a SEND, READ
//! or invalidation completed, time passed, the peer vanished) and carries out the
//! [`Action`]s it asks for, in order: bind a message's window, post a control message
//! into a send slot, post an RDMA READ, repost a receive slot, deliver a message,
//! finish a send, release or discard a buffer. The driver keeps the bytes.
//!
//! This file holds the state and the driver's entry points for sends, completions,
//! time and closing; `session/arrivals.rs` takes the peer's control messages, and
//! `session/posting.rs` decides what goes on the send queue next.
//!
//! A DATA message's window may be taken back by the acknowledgement itself: the
//! peer sends it as a SEND_WITH_INV of the message's key (remote invalidation, as
//! NFS over RDMA does; `Config::invalidating_acks`), and the driver reports that
//! our window was invalidated with it. An acknowledgement without one makes the
//! core ask for a LOCAL_INV instead.
//!
//! What it guarantees (the property tests in `session/tests/properties.rs` check each
//! against random interleavings of sends, takes, completions and hostile control
//! messages):
//! - no SEND without a credit: credits never go below zero, and a peer that returns
//!   more than it could owe closes the session;
//! - messages are delivered once each, in the order the peer sent them, never after
//!   the session closed;
//! - every buffer is released (ours) or delivered or discarded (the peer's) exactly
//!   once, and only after the queue pair is gone when the session closes;
//! - bounded: at most `max_out_messages` / `max_out_bytes` of our messages in flight
//!   (`send` pushes back beyond), at most `max_in_bytes` of the peer's being read or
//!   waiting to be taken (a DATA beyond is refused with [`ACK_BUSY`]), and a DATA the
//!   peer does not acknowledge within `ack_timeout` closes the session, and so
//!   does a control message of ours that does not complete for as long (a peer
//!   that grants credits and posts no receives);
//! - on the accepting side, a peer that sends no control message within the
//!   handshake's `timeout` (the connecting side greets at once: [`Session::greet`])
//!   closes the session.

use crate::budget::SharedBudget;
use crate::error::CloseReason;
use crate::id_map::IdMap;
use crate::protocol::{Control, Kind};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Credits a sender keeps for acknowledgements and credit returns.
pub(crate) const DATA_RESERVE: u32 = 3;

/// "Delivered" acknowledgements a receiver holds back at most while the next one
/// is on its way (each is cumulative, so the last stands for all).
pub(crate) const ACK_BATCH: usize = 4;

/// Largest message whose READs acknowledgements wait for: the wait costs the
/// sender about one such READ, and an ACK saved beside a larger message saves
/// little.
pub(crate) const ACK_HOLD_BYTES: u64 = 256 << 10;

/// ACK code: delivered.
pub const ACK_DELIVERED: u64 = 0;
/// ACK code: refused, the receiver holds as many bytes of this session (or of all its
/// sessions) as it may.
pub const ACK_BUSY: u64 = 2;

/// The limits and sizes one session runs with.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    /// Receive slots we posted: what the peer may owe us.
    pub(crate) credits: u32,
    /// Receive slots the peer posted: our initial send credits.
    pub(crate) peer_credits: u32,
    /// Control messages of ours in flight at most (send slots).
    pub(crate) send_slots: u32,
    /// Largest single RDMA READ.
    pub(crate) read_chunk: u32,
    /// READs in flight at most.
    pub(crate) reads_in_flight: u32,
    /// Our messages queued or in flight at most.
    pub(crate) max_out_messages: u32,
    /// Bytes of our read (DATA) messages queued or in flight at most.
    pub(crate) max_out_bytes: u64,
    /// Bytes of the peer's read messages being read or waiting to be taken, at most.
    pub(crate) max_in_bytes: u64,
    /// The same bytes of all the transport's sessions, against its own limit.
    pub(crate) all_in: Arc<SharedBudget>,
    /// Bytes of the peer's read messages this session may hold whatever the
    /// others hold: charged to `all_in`'s reserve, the rest to its limit.
    pub(crate) in_floor: u64,
    /// Bytes of our read messages of all the transport's sessions, against its own
    /// limit.
    pub(crate) all_out: Arc<SharedBudget>,
    /// How long the peer may take to acknowledge a DATA message.
    pub(crate) ack_timeout: Duration,
    /// DATA messages readable at once (each holds a window from its `Bind` until its
    /// invalidation); further descriptors wait in order.
    pub(crate) windows: u32,
}

/// What the driver must do, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Grant the peer RDMA READ on message `id`'s bytes (bind its window) and fill
    /// the address, length and key into the DATA control message that follows.
    Bind(u64),
    /// Write a control message into send slot `slot` and post it. `header` holds what
    /// the core knows; for DATA the driver adds address and key (from `Bind`) and the
    /// metadata, for EAGER the metadata and payload of message `header.msg_id`. An
    /// ACK's `header.rkey` is the peer's key of the message it acknowledges: with
    /// `Config::invalidating_acks` the ACK goes as a SEND_WITH_INV of that key, so
    /// the peer need not invalidate it.
    Post {
        /// The send slot.
        slot: u32,
        /// The message's type.
        kind: Kind,
        /// Its header, credits and `seen` filled in.
        header: Control,
    },
    /// Allocate a READ target of `len` bytes for the peer's message `id`.
    StartRead {
        /// The peer's message id.
        id: u64,
        /// Its length.
        len: u64,
    },
    /// Post an RDMA READ of `len` bytes from the peer's `addr` (key `rkey`) into
    /// message `id`'s target at `offset`.
    Read {
        /// The peer's message id.
        id: u64,
        /// Offset in the message.
        offset: u64,
        /// Bytes.
        len: u32,
        /// The peer's address of these bytes.
        addr: u64,
        /// The peer's key.
        rkey: u32,
    },
    /// Post receive slot `slot` again.
    Repost(u32),
    /// Hand the peer's message `id` to the application.
    Deliver(u64),
    /// Revoke the peer's access to our message `id` (invalidate its window); call
    /// [`Session::on_invalidated`] once done.
    Invalidate(u64),
    /// Our read message `id` is finished: delivered (`Ok`) or not (`Err`, why).
    Finished {
        /// Our message id.
        id: u64,
        /// The outcome.
        result: Result<(), CloseReason>,
    },
    /// Release our message `id`'s buffer: nothing can reach it any more.
    Release(u64),
    /// Drop the peer's message `id` (being read, or waiting behind another).
    Discard(u64),
    /// Destroy the queue pair: before any buffer it may touch is released.
    DestroyQp,
    /// The session is closed, for this reason.
    Closed(CloseReason),
}

/// Why `send` did not take a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The session is closed.
    Closed(CloseReason),
    /// As many messages or bytes are in flight as allowed: wait for some to finish.
    Full,
    /// The transport's sessions together have as many bytes in flight as allowed:
    /// wait for some to finish, on any session.
    TransportFull,
}

/// A control message waiting for a credit and a send slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    Eager { id: u64, len: u64 },
    Data(u64),
    Bye,
}

/// One of our read messages.
#[derive(Clone, Copy, Debug)]
struct Out {
    len: u64,
    /// Bytes charged to the budgets for it (see [`Session::send`]).
    charged: u64,
    /// When its descriptor went out (the core's clock), if it did.
    posted: Option<Instant>,
    /// `posted` is the time of the last tick, before the descriptor really went
    /// out: the next tick replaces it with its own time.
    since_tick: bool,
    /// The peer's acknowledgement code, once it came.
    acked: Option<u64>,
}

/// One of the peer's messages, being read or waiting for an earlier one.
#[derive(Clone, Copy, Debug)]
struct In {
    reads_left: u32,
    needs_ack: bool,
    /// Bytes counted against `max_in_bytes`.
    charged: u64,
    /// DATA: the peer's key of the message, invalidated by our acknowledgement.
    rkey: u32,
    /// DATA: the first tick after it arrived (`None` until then), from which its
    /// READs have `ack_timeout` to finish.
    started: Option<Instant>,
}

/// A piece of a READ still to post.
#[derive(Clone, Copy, Debug)]
struct ReadJob {
    id: u64,
    offset: u64,
    len: u32,
    addr: u64,
    rkey: u32,
}

/// One session's protocol state.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) struct Session {
    p: Params,
    closed: Option<CloseReason>,
    /// The last time the driver told (see [`Session::tick`]).
    now: Instant,
    /// SENDs we may still post.
    send_credits: u32,
    /// Credits we spent and the peer has not returned.
    spent: u32,
    /// Credits the peer holds: the control messages it may still send us (those
    /// we granted, less those that arrived). A slot reposted after a delivery is
    /// not the peer's to use until its credit goes back, so without this count a
    /// peer that ignores its credits could fill the inbox without end while the
    /// application does not take its messages.
    granted: u32,
    /// Our receive slots reposted, not yet told to the peer.
    to_return: u32,
    /// Messages taken by the application whose credits are not in `to_return` yet.
    taken: u32,
    /// Receive slots whose repost waits (after a delivery).
    to_repost: Vec<u32>,
    /// Which receive slots are posted.
    posted: Vec<bool>,
    free_slots: Vec<u32>,
    /// The eager message each busy send slot carries (0: none).
    slot_msg: Vec<u64>,
    /// Whether each send slot is busy.
    slot_busy: Vec<bool>,
    pending: VecDeque<Pending>,
    /// Acknowledgements to send: id, code and the key the acknowledgement invalidates.
    acks: VecDeque<(u64, u64, u32)>,
    outgoing: BTreeMap<u64, Out>,
    /// Our eager messages not done yet: id and length.
    eager_inflight: VecDeque<u64>,
    out_messages: u32,
    out_bytes: u64,
    /// DATA messages bound and not yet invalidated.
    bound: u32,
    incoming: IdMap<In>,
    arrival: VecDeque<u64>,
    reads: VecDeque<ReadJob>,
    /// READs of messages whose target the driver is still registering
    /// ([`Session::awaiting_target`]), held back until [`Session::target_ready`].
    held_reads: Vec<ReadJob>,
    reads_in_flight: u32,
    in_bytes: u64,
    /// Bytes charged per delivered message not taken yet, in delivery order.
    delivered: VecDeque<u64>,
    next_msg_id: u64,
    received_upto: u64,
    eager_done: u64,
    eager_last: u64,
    /// The last of our eager messages whose SEND the core handed to the driver
    /// (`Post`): the peer's `seen` can vouch for no later one. On Soft-RoCE the
    /// driver may still hold a few such posts behind a window bind
    /// (`sq_gate.rs`, at most the send slots'), which a lying `seen` then
    /// completes early, as a lying peer can any message it has.
    eager_posted: u64,
    /// The accepting side: when the peer's first control message is due (its
    /// greeting, `Session::greet`) and how long it had; `None` once one came, or on
    /// the connecting side.
    greeting: Option<(Instant, Duration)>,
    /// The connecting side: the send slot of our greeting until its SEND completed.
    greeting_slot: Option<u32>,
    /// When each SEND in flight (a busy send slot) was posted, oldest first: the
    /// session closes when the oldest has not completed within `ack_timeout` (a
    /// peer that grants credits and posts no receives is retried by the device for
    /// ever). SENDs complete in the order posted, and a completion takes the
    /// oldest. The last `sends_unstamped` were posted since the last tick and carry
    /// its time, which the next tick replaces with its own (as `Out::posted`).
    sends_posted: VecDeque<Instant>,
    sends_unstamped: usize,
    actions: VecDeque<Action>,
}

impl Session {
    /// A session whose receive slots `0..credits` are all posted.
    pub(crate) fn new(p: Params, now: Instant) -> Session {
        Session {
            send_credits: p.peer_credits,
            spent: 0,
            granted: p.credits,
            to_return: 0,
            taken: 0,
            to_repost: Vec::with_capacity(p.credits as usize),
            posted: vec![true; p.credits as usize],
            free_slots: (0..p.send_slots).rev().collect(),
            slot_msg: vec![0; p.send_slots as usize],
            slot_busy: vec![false; p.send_slots as usize],
            pending: VecDeque::new(),
            acks: VecDeque::new(),
            outgoing: BTreeMap::new(),
            eager_inflight: VecDeque::new(),
            out_messages: 0,
            out_bytes: 0,
            bound: 0,
            incoming: IdMap::default(),
            arrival: VecDeque::new(),
            reads: VecDeque::new(),
            held_reads: Vec::new(),
            reads_in_flight: 0,
            in_bytes: 0,
            delivered: VecDeque::new(),
            next_msg_id: 1,
            received_upto: 0,
            eager_done: 0,
            eager_last: 0,
            eager_posted: 0,
            greeting: None,
            greeting_slot: None,
            sends_posted: VecDeque::with_capacity(p.send_slots as usize),
            sends_unstamped: 0,
            actions: VecDeque::new(),
            closed: None,
            now,
            p,
        }
    }

    /// The next action to carry out.
    pub(crate) fn next_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Why the session closed, if it did.
    #[cfg(test)]
    pub(crate) fn closed(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }

    /// Whether the session closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Our eager messages are done up to this id.
    pub(crate) fn eager_done(&self) -> u64 {
        self.eager_done
    }

    /// Whether bytes of the peer's read messages are charged (being read, or
    /// delivered and not taken).
    pub(crate) fn holds_bytes(&self) -> bool {
        self.in_bytes > 0
    }

    /// The driver lets the session go (its messages with it): whatever it still
    /// has charged goes back to the transport's budget. Closes it first.
    pub(crate) fn release_held(&mut self) {
        self.close(CloseReason::Shutdown);
        self.uncharge_in(self.in_bytes);
        self.delivered.clear();
    }

    /// Charges `bytes` of a peer's read message to the session (`in_bytes`) and
    /// the transport: what keeps the session within its floor to the transport's
    /// reserve, the rest to its shared limit. False, with nothing charged, when
    /// the transport has no room.
    pub(crate) fn charge_in(&mut self, bytes: u64) -> bool {
        let (shared, own) = self.in_parts(self.in_bytes, self.in_bytes.saturating_add(bytes));
        if !self.p.all_in.try_charge_parts(shared, own) {
            return false;
        }
        self.in_bytes += bytes;
        true
    }

    /// Gives back `bytes` that [`Session::charge_in`] charged.
    fn uncharge_in(&mut self, bytes: u64) {
        let (shared, own) = self.in_parts(self.in_bytes - bytes, self.in_bytes);
        self.p.all_in.release_parts(shared, own);
        self.in_bytes -= bytes;
    }

    /// How the bytes between holdings `low` and `high` split: the shared part and
    /// the part within the session's floor.
    fn in_parts(&self, low: u64, high: u64) -> (u64, u64) {
        let floor = self.p.in_floor;
        let own = high.min(floor) - low.min(floor);
        (high - low - own, own)
    }

    /// Receive slots waiting for their repost.
    pub(crate) fn reposts_waiting(&self) -> bool {
        !self.to_repost.is_empty()
    }

    /// True when nothing of ours or the peer's is in flight or queued.
    pub(crate) fn idle(&self) -> bool {
        self.closed.is_some()
            || (self.outgoing.is_empty()
                && self.incoming.is_empty()
                && self.pending.is_empty()
                && self.acks.is_empty()
                && self.eager_done >= self.eager_last
                && self.free_slots.len() == self.p.send_slots as usize)
    }

    /// Queues a message of `len` bytes, `eager` (its bytes in the SEND) or read by
    /// the peer; returns its id. The driver keeps the bytes under that id. A read
    /// message is charged `pinned` bytes, what its buffer pins until the peer has
    /// read it (`pool::buffer_len` for a copy into a pool buffer, `len` for the
    /// caller's own region); an eager one nothing, its bytes being in a send slot.
    pub(crate) fn send(&mut self, eager: bool, len: u64, pinned: u64) -> Result<u64, Refused> {
        if let Some(reason) = &self.closed {
            return Err(Refused::Closed(reason.clone()));
        }
        let bytes = if eager { 0 } else { pinned.max(len) };
        if self.out_messages >= self.p.max_out_messages
            || (bytes > 0 && self.out_bytes + bytes > self.p.max_out_bytes && self.out_bytes > 0)
        {
            return Err(Refused::Full);
        }
        if bytes > 0 && !self.p.all_out.try_charge_or_alone(bytes) {
            return Err(Refused::TransportFull);
        }
        let id = self.next_msg_id;
        self.next_msg_id += 1;
        self.out_messages += 1;
        self.out_bytes += bytes;
        if eager {
            self.eager_last = id;
            self.eager_inflight.push_back(id);
            self.pending.push_back(Pending::Eager { id, len });
        } else {
            self.outgoing.insert(
                id,
                Out {
                    len,
                    charged: bytes,
                    posted: None,
                    since_tick: false,
                    acked: None,
                },
            );
            self.pending.push_back(Pending::Data(id));
        }
        self.flush();
        Ok(id)
    }

    /// [`Session::send`] of an eager message of `len` bytes when it would go out at
    /// once as the only action: nothing queued or waiting to be carried out, no
    /// acknowledgement or credit return due, a credit and a send slot free. Returns
    /// its id and the one `Post` that `send` would have queued (slot and header),
    /// for the driver to carry out now: the message's bytes go straight into the
    /// slot, with no trip through the queues. `None`, with nothing changed, in any
    /// other case: then `send` it.
    pub(crate) fn send_eager_now(&mut self, len: u64) -> Option<(u64, u32, Control)> {
        let credit_due = self.to_return + self.taken.saturating_sub(self.to_repost.len() as u32)
            >= self.credit_threshold();
        let quiet = self.closed.is_none()
            && self.actions.is_empty()
            && self.pending.is_empty()
            && self.acks.is_empty()
            && (self.reads.is_empty() || self.reads_in_flight >= self.p.reads_in_flight)
            && !credit_due;
        if !quiet
            || self.out_messages >= self.p.max_out_messages
            || self.send_credits < DATA_RESERVE + 1
            || self.free_slots.is_empty()
        {
            return None;
        }
        let id = self.next_msg_id;
        self.next_msg_id += 1;
        self.out_messages += 1;
        self.eager_last = id;
        self.eager_inflight.push_back(id);
        let h = Control {
            msg_id: id,
            len,
            ..Default::default()
        };
        let (slot, header) = self.claim(Kind::Eager, h, id);
        Some((id, slot, header))
    }

    /// The connecting side's greeting: a CREDIT (returning nothing) posted at once,
    /// so that the accepting side hears the session's queue pair speak (protocol
    /// version 5). Call it on a fresh session, before anything else.
    pub(crate) fn greet(&mut self) {
        // A fresh session has every credit (at least 8) and every send slot.
        debug_assert!(self.send_credits >= 1 && !self.free_slots.is_empty());
        if self.closed.is_none() && self.send_credits >= 1 && !self.free_slots.is_empty() {
            self.greeting_slot = Some(self.post(Kind::Credit, Control::default(), 0));
        }
    }

    /// The connecting side: whether our greeting's SEND completed (the peer's
    /// queue pair acknowledged it), or the session closed.
    pub(crate) fn greeted(&self) -> bool {
        self.closed.is_some() || self.greeting_slot.is_none()
    }

    /// The accepting side: the peer's first control message must arrive within
    /// `within` of the session's start (the time given to [`Session::new`]), or the
    /// session closes with [`CloseReason::Silent`]: a client that finished the TCP
    /// handshake but whose queue pair never speaks holds no session for longer.
    pub(crate) fn await_greeting(&mut self, within: Duration) {
        self.greeting = Some((self.now + within, within));
    }

    /// Queues a goodbye after everything queued before it.
    pub(crate) fn bye(&mut self) {
        if self.closed.is_none() {
            self.pending.push_back(Pending::Bye);
            self.flush();
        }
    }

    fn eager_done_upto(&mut self, upto: u64) {
        if upto <= self.eager_done {
            return;
        }
        self.eager_done = upto;
        while self.eager_inflight.front().is_some_and(|&id| id <= upto) {
            self.eager_inflight.pop_front();
            self.out_messages -= 1;
        }
    }

    /// The window of our message `id` is invalidated: the peer can no longer read it.
    #[inline(never)]
    pub(crate) fn on_invalidated(&mut self, id: u64) {
        if self.closed.is_some() {
            return;
        }
        if let Err(why) = self.window_gone(id) {
            return self.close(why);
        }
        self.flush();
    }

    /// Our message `id`'s window is invalid (by our LOCAL_INV or the peer's
    /// SEND_WITH_INV): its buffer is released and its sender told.
    fn window_gone(&mut self, id: u64) -> Result<(), CloseReason> {
        let Some(out) = self.outgoing.remove(&id) else {
            return Err(CloseReason::Local(format!(
                "invalidation of unknown message {id}"
            )));
        };
        let result = match out.acked {
            Some(ACK_DELIVERED) => Ok(()),
            Some(code) => Err(CloseReason::PeerRefused(code)),
            None => Err(CloseReason::Local(format!(
                "message {id} invalidated before its acknowledgement"
            ))),
        };
        self.retire(id, out, result);
        Ok(())
    }

    /// The driver could not bind our read message `id`'s window (its bytes could
    /// not be registered for the peer to read: the memlock limit, or the device's
    /// window limit), and sent its descriptor's slot as a CREDIT that withdraws
    /// it (the CREDIT names its id, so the peer's count of ids goes on): the
    /// message fails alone, with `why`, and the session goes on.
    #[cold]
    pub(crate) fn bind_failed(&mut self, id: u64, why: String) {
        if self.closed.is_some() {
            return;
        }
        let Some(out) = self.outgoing.remove(&id) else {
            return self.close(CloseReason::Local(format!(
                "a failed bind of message {id}, which is not in flight"
            )));
        };
        let acked = out.acked.is_some();
        // Retired either way, so that its sender hears and its buffer goes (never
        // announced, it is nobody's to read).
        self.retire(id, out, Err(CloseReason::NotRegistered(why)));
        if acked {
            // The peer acknowledged a message whose descriptor never went out.
            return self.close(broke(format!(
                "the peer acknowledged message {id}, which was withdrawn unannounced"
            )));
        }
        self.flush();
    }

    /// Our read message `id` (`out`, out of `outgoing`) is done with, its window
    /// gone or never bound: its buffer is released and its sender told `result`.
    fn retire(&mut self, id: u64, out: Out, result: Result<(), CloseReason>) {
        self.out_messages -= 1;
        self.out_bytes -= out.charged;
        self.p.all_out.release(out.charged);
        self.bound -= 1;
        // The buffer goes before the sender hears: a caller that waits for the send
        // then holds its region alone again.
        self.actions.push_back(Action::Release(id));
        self.actions.push_back(Action::Finished { id, result });
    }

    /// SEND slot `slot` completed.
    pub(crate) fn on_send_done(&mut self, slot: u32) {
        if self.closed.is_some() {
            return;
        }
        match self.slot_busy.get_mut(slot as usize) {
            Some(busy) if *busy => *busy = false,
            _ => {
                return self.close(CloseReason::Local(format!(
                    "send completion for idle slot {slot}"
                )))
            }
        }
        if self.greeting_slot == Some(slot) {
            self.greeting_slot = None;
        }
        let id = std::mem::take(&mut self.slot_msg[slot as usize]);
        self.free_slots.push(slot);
        self.sends_posted.pop_front();
        self.sends_unstamped = self.sends_unstamped.min(self.sends_posted.len());
        self.eager_done_upto(id);
        self.flush();
    }

    /// One READ of the peer's message `id` completed.
    #[inline(never)]
    pub(crate) fn on_read_done(&mut self, id: u64) {
        if self.closed.is_some() {
            return;
        }
        match self.incoming.get_mut(&id) {
            Some(i) if i.reads_left > 0 && self.reads_in_flight > 0 => i.reads_left -= 1,
            _ => {
                return self.close(CloseReason::Local(format!(
                    "read completion for message {id}, which is not being read"
                )))
            }
        }
        self.reads_in_flight -= 1;
        self.deliver_ready();
        self.flush();
    }

    /// The application took a delivered message: its credit goes back once its slot
    /// is posted again, and its bytes leave the session's budget.
    pub(crate) fn taken(&mut self) {
        let charged = self.delivered.pop_front();
        if let Some(charged) = charged {
            self.uncharge_in(charged);
        }
        // After a close only the budget still counts (a message delivered before
        // it holds its buffer until the application takes it).
        if self.closed.is_some() {
            return;
        }
        if charged.is_some() {
            self.taken += 1;
        }
        self.flush();
    }

    /// Reposts the receive slots whose repost was put off.
    pub(crate) fn repost_deferred(&mut self) {
        if self.closed.is_some() || self.to_repost.is_empty() {
            return;
        }
        // Drained in place: the vector keeps its capacity (no allocation per message).
        for slot in self.to_repost.drain(..) {
            self.posted[slot as usize] = true;
            self.actions.push_back(Action::Repost(slot));
        }
        self.flush();
    }

    /// Time passed: a DATA unacknowledged for `ack_timeout` closes the session,
    /// and so does a SEND not completed for as long.
    ///
    /// The core's clock is the last tick's time, so a descriptor posted since then
    /// went out at some time up to `now`: it is timed from `now`, and the session is
    /// never closed before a message had its full `ack_timeout` (at most one tick
    /// later).
    pub(crate) fn tick(&mut self, now: Instant) {
        self.now = now;
        if self.closed.is_some() {
            return;
        }
        if let Some((due, after)) = self.greeting {
            if now >= due {
                return self.close(CloseReason::Silent { after });
            }
        }
        for o in self.outgoing.values_mut().filter(|o| o.since_tick) {
            o.posted = Some(now);
            o.since_tick = false;
        }
        let restamp = self.sends_posted.len() - std::mem::take(&mut self.sends_unstamped);
        for t in self.sends_posted.range_mut(restamp..) {
            *t = now;
        }
        let late = self.outgoing.iter().find(|(_, o)| {
            o.acked.is_none()
                && o.posted
                    .is_some_and(|t| now.duration_since(t) >= self.p.ack_timeout)
        });
        if let Some((&id, _)) = late {
            return self.close(CloseReason::AckTimeout {
                id,
                after: self.p.ack_timeout,
            });
        }
        // The peer's messages being read: timed from this tick on, and a message
        // whose READs outlast `ack_timeout` closes the session (a peer that stopped
        // answering would otherwise hold its bytes of the budget for good).
        let mut stuck = None;
        for (&id, i) in self.incoming.iter_mut().filter(|(_, i)| i.reads_left > 0) {
            let started = *i.started.get_or_insert(now);
            if now.duration_since(started) >= self.p.ack_timeout {
                stuck = Some(stuck.map_or(id, |s: u64| s.min(id)));
            }
        }
        if let Some(id) = stuck {
            return self.close(CloseReason::ReadTimeout {
                id,
                after: self.p.ack_timeout,
            });
        }
        // Last: a DATA or READ that timed out names its message.
        if self
            .sends_posted
            .front()
            .is_some_and(|&t| now.duration_since(t) >= self.p.ack_timeout)
        {
            self.close(CloseReason::SendTimeout {
                after: self.p.ack_timeout,
            });
        }
    }

    /// When [`Session::tick`] should next run, if a DATA of ours waits for its ACK,
    /// one of the peer's is being read, a SEND of ours is in flight, or the peer's
    /// greeting is awaited.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let ours = self
            .outgoing
            .values()
            .filter(|o| o.acked.is_none())
            .filter_map(|o| o.posted);
        let theirs = self
            .incoming
            .values()
            .filter(|i| i.reads_left > 0)
            .filter_map(|i| i.started);
        let acks = ours
            .chain(theirs)
            .chain(self.sends_posted.front().copied())
            .min()
            .map(|t| t + self.p.ack_timeout);
        let greeting = self.greeting.map(|(due, _)| due);
        acks.into_iter().chain(greeting).min()
    }

    /// Closes the session: the queue pair goes first, then every send fails and every
    /// buffer is released or discarded, once.
    pub(crate) fn close(&mut self, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(reason.clone());
        // The transport's budget gets back the bytes of messages being read (they
        // are discarded); those delivered and not yet taken keep their buffers, and
        // their charges, until taken (`taken`) or the session is dropped
        // (`release_held`).
        let delivered: u64 = self.delivered.iter().sum();
        self.uncharge_in(self.in_bytes - delivered);
        // What it still holds moves from the floors' reserve to the shared part:
        // the reserve is sized for the live sessions, and this one is not.
        self.p
            .all_in
            .move_to_shared(self.in_bytes.min(self.p.in_floor));
        self.p.in_floor = 0;
        // Our read messages are all released below: their bytes go back at once.
        self.p.all_out.release(std::mem::take(&mut self.out_bytes));
        // Work for the device queued before the close (in the same flush as a post
        // that failed, say) never runs: the second of two EAGERs whose first
        // failed to post would reach the peer, which takes a gap in the ids for a
        // withdrawal and delivers it, while this side reports both failed.
        self.actions.retain(|a| !a.uses_the_device());
        self.actions.push_back(Action::DestroyQp);
        for (id, _) in std::mem::take(&mut self.outgoing) {
            self.actions.push_back(Action::Release(id));
            self.actions.push_back(Action::Finished {
                id,
                result: Err(reason.clone()),
            });
        }
        let mut incoming: Vec<u64> = self.incoming.drain().map(|(id, _)| id).collect();
        incoming.sort_unstable();
        for id in incoming {
            self.actions.push_back(Action::Discard(id));
        }
        self.pending.clear();
        self.acks.clear();
        self.arrival.clear();
        self.reads.clear();
        self.held_reads.clear();
        self.to_repost.clear();
        self.actions.push_back(Action::Closed(reason));
    }
}

impl Action {
    /// Posts to the queue pair, or prepares one: what a closed session must not
    /// do. The others (deliveries, releases, outcomes) still run after a close.
    fn uses_the_device(&self) -> bool {
        matches!(
            self,
            Action::Bind(_)
                | Action::Post { .. }
                | Action::StartRead { .. }
                | Action::Read { .. }
                | Action::Repost(_)
                | Action::Invalidate(_)
        )
    }
}

/// The CREDIT that takes the place of our DATA descriptor `h` whose window could
/// not be bound: the same credits and `seen`, and the message's id, which
/// withdraws it (protocol version 6; [`Session::bind_failed`]).
pub(crate) fn withdrawal(h: &Control) -> Control {
    Control {
        kind: Some(Kind::Credit),
        msg_id: h.msg_id,
        credits: h.credits,
        seen: h.seen,
        ..Control::default()
    }
}

/// The peer broke the protocol.
fn broke(what: String) -> CloseReason {
    CloseReason::Protocol(what)
}

/// Why a session whose peer sent beyond its credits closes.
pub(crate) fn over_credits() -> CloseReason {
    broke("the peer sent more control messages than its credits".into())
}

mod arrivals;
mod posting;
#[cfg(test)]
mod tests;
