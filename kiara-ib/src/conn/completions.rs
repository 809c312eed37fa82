//! Reaping a session's completions: its own CQ and (on the shared receive queue)
//! the receives routed to it, handled in order under the drain lock, each handed
//! to the session core.

use super::{Conn, Event, Incoming, State};
use super::{TAG_INV, TAG_READ, TAG_RECV, TAG_SEND, TAG_SHIFT, VALUE_MASK};
use crate::error::CloseReason;
use crate::message::{Message, Meta, Payload};
use crate::protocol::{Control, Kind};
use crate::spare::Spare;
use rdma_safe::sys::{ibv_qp_state, ibv_wc_status};
use rdma_safe::WorkCompletion;
use std::sync::atomic::Ordering;

/// Completions one hold of a session's drain lock handles at most. A peer that
/// keeps its queue busy within its credits (its credits come back as fast as it
/// spends them) would otherwise hold the draining thread (a callback runner, the
/// poller) for as long as it goes on. Counted in completions, not polls: polls
/// that find one or two completions each are the normal case when many sessions
/// share two cores, and a cap on polls stopped such drains, leaving their queues
/// unarmed before their threads slept (a 16-client round trip went from 0.3 to
/// 4 ms, docs/performance-history.md).
pub(crate) const DRAIN_LIMIT: usize = 256;

/// Holds of the drain lock one [`Conn::try_drain`] takes at most for mail (on the
/// shared receive queue), each of up to [`DRAIN_LIMIT`] completions.
pub(crate) const DRAIN_BATCHES: usize = 8;

/// What one drain of a session's queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Drained {
    /// Some completion (or mail) was handled.
    pub(crate) active: bool,
    /// It stopped at [`DRAIN_LIMIT`] completions (or [`DRAIN_BATCHES`] holds for
    /// mail) with completions or mail left, and the queue unarmed: someone must
    /// look again (the poller does). Returned, not kept in the session, so that
    /// another thread's drain in between cannot clear it before the caller looks.
    pub(crate) capped: bool,
}

impl Conn {
    /// Drains the CQ unless another thread is doing it, handing every event to
    /// `route` while still holding the drain lock, so that deliveries keep their
    /// order whichever thread reaps them. Returns what happened ([`Drained`]),
    /// `None` if another thread had the queue (and so nothing was armed).
    /// `arm`: re-arm the completion notification when empty (a system call on some
    /// providers): the poller does before it sleeps; a spinning caller need not.
    ///
    /// On the shared receive queue, mail routed while this thread held the queue
    /// (by a reaper that found it busy) is taken before this returns.
    pub(crate) fn try_drain(
        &self,
        wcs: &mut [WorkCompletion],
        events: &mut Vec<Event>,
        arm: bool,
        route: &mut dyn FnMut(Event),
    ) -> Option<Drained> {
        // Left only by a drain that unwound (a bug, whose session the guard below
        // closed): never routed to this session.
        events.clear();
        // Forgotten when the drain returns: only unwinding out of it drops the
        // guard (no look at the thread's panic state on every drain).
        let guard = ClosesOnUnwind(self);
        let drained = self.drain_all(wcs, events, arm, route);
        std::mem::forget(guard);
        drained
    }

    /// [`Conn::try_drain`]'s drains: the session's queue, then its mail.
    fn drain_all(
        &self,
        wcs: &mut [WorkCompletion],
        events: &mut Vec<Event>,
        arm: bool,
        route: &mut dyn FnMut(Event),
    ) -> Option<Drained> {
        let mut drained = self.drain_once(wcs, events, arm, route)?;
        let Some(mail) = &self.mail else {
            return Some(drained);
        };
        // Pairs with the fence after a reaper's push (`Mailbox::push`): either its
        // try of the drain lock succeeds, or this sees its mail. Mail left after
        // `DRAIN_BATCHES` holds is found by the next drain (`Drained::capped`).
        std::sync::atomic::fence(Ordering::SeqCst);
        for _ in 0..DRAIN_BATCHES {
            if !mail.has_mail() {
                break;
            }
            // Another thread has the queue: it looks again after letting go.
            let Some(more) = self.drain_once(wcs, events, false, route) else {
                break;
            };
            drained.active |= more.active;
            drained.capped |= more.capped;
        }
        drained.capped |= mail.has_mail();
        Some(drained)
    }

    /// [`Conn::try_drain`], one hold of the drain lock: at most [`DRAIN_LIMIT`]
    /// completions, so that a peer whose completions keep coming (within its
    /// credits) holds no thread for longer; the queue is then left unarmed, and
    /// [`Drained::capped`] says so.
    fn drain_once(
        &self,
        wcs: &mut [WorkCompletion],
        events: &mut Vec<Event>,
        arm: bool,
        route: &mut dyn FnMut(Event),
    ) -> Option<Drained> {
        let _guard = self.drain_lock.try_lock()?;
        let done = |active| {
            Some(Drained {
                active,
                capped: false,
            })
        };
        let mut active = false;
        let mut armed = false;
        let mut handled = 0;
        // Each turn handles a completion or more, but for the one that arms the
        // queue (after it, an empty poll returns).
        while handled < DRAIN_LIMIT {
            let polled = self.poll_batch(wcs, events);
            let delivered = !events.is_empty() && Self::route_all(events, route);
            match polled {
                None => return done(active),
                // A spinning caller that delivered a message returns to it at once
                // (a waiting `recv` takes it, a runner runs its callback) and polls
                // again on its next round; one poll fewer before every reply.
                Some(n) if n > 0 && delivered && !arm => return done(true),
                Some(0) => {
                    // Nothing to reap: repost what was put off, on every empty poll
                    // (the wait's idle time, not the next message's path). Not only
                    // before this hold's arm: messages that landed between an
                    // earlier empty poll and the arm were reaped since (their slots
                    // put off), and raise no event, so nothing else would repost
                    // their slots; nor only when arming: drains that never arm (a
                    // spinning runner, the shared queue's mail) would hold them
                    // until the session cools, and a peer short of credits waits.
                    if self.deferred.load(Ordering::Acquire) {
                        self.repost_now(events, route);
                    }
                    if !arm {
                        return done(active);
                    }
                    // Armed in this hold, or still armed from before (its event has
                    // not come, so nothing arrived since that arm and the poll above).
                    if armed || self.armed.load(Ordering::Acquire) {
                        return done(active);
                    }
                    // Completions that arrive after the re-arm raise an event; those
                    // that came before it are polled once more.
                    // Marked before arming: the poller clears the mark when it reads
                    // the event, which comes only after the arm.
                    self.armed.store(true, Ordering::Release);
                    if self.cq.req_notify(false).is_err() {
                        self.armed.store(false, Ordering::Release);
                        return done(active);
                    }
                    armed = true;
                }
                Some(n) => {
                    active = true;
                    handled += n;
                }
            }
        }
        // Completions are left: an arm made in this hold raises no event for them,
        // so the queue is marked unarmed (arming it again is harmless).
        self.armed.store(false, Ordering::Release);
        Some(Drained {
            active,
            capped: true,
        })
    }

    /// Reposts the receive slots whose repost was put off, and routes what that
    /// caused (a credit message's completion, a close).
    #[inline(never)]
    fn repost_now(&self, events: &mut Vec<Event>, route: &mut dyn FnMut(Event)) {
        let mut st = self.state.lock();
        st.core.repost_deferred();
        self.run(&mut st, events);
        drop(st);
        for ev in events.drain(..) {
            route(ev);
        }
    }

    /// Routes `events` (what a batch delivered goes out before the next poll: a
    /// callback's reply leaves sooner); true if a message was among them. Only
    /// called with some: an empty poll, most of a spin's, skips the drain's setup.
    fn route_all(events: &mut Vec<Event>, route: &mut dyn FnMut(Event)) -> bool {
        let delivered = events.iter().any(|e| matches!(e, Event::Delivered(_)));
        for ev in events.drain(..) {
            route(ev);
        }
        delivered
    }

    /// The poller read the CQ's event: the next arm must really arm it.
    pub(crate) fn event_read(&self) {
        self.armed.store(false, Ordering::Release);
    }

    /// True when a message waits in the inbox or the session is closed (without the
    /// lock: spinning waiters ask this every round).
    pub(crate) fn has_news(&self) -> bool {
        self.inbox_len.load(Ordering::Acquire) > 0 || self.is_closed.load(Ordering::Acquire)
    }

    /// Polls one batch of completions and handles them; `None` if polling failed
    /// (the session is then closed). Callers hold `drain_lock` (see `try_drain`).
    /// On the shared receive queue the batch also takes the mail routed to it.
    fn poll_batch(&self, wcs: &mut [WorkCompletion], events: &mut Vec<Event>) -> Option<usize> {
        let polled = self.cq.poll(wcs).map(|done| done.len());
        let polled =
            polled.map(|n| n + self.mail.as_ref().map_or(0, |m| m.take_into(&mut wcs[n..])));
        match polled {
            Ok(0) => Some(0),
            Ok(n) => {
                let done = &wcs[..n];
                // One trip through the lock for the whole batch; first what was put
                // off (reposts after deliveries), then what the batch brought. (On
                // the shared queue, receives come after the sends of the session's
                // own CQ. Verbs orders no two CQs, and even on one CQ a peer's reply
                // can complete before our SEND it answers: the core takes either.)
                let mut st = self.state.lock();
                if st.core.reposts_waiting() {
                    st.core.repost_deferred();
                    self.run(&mut st, events);
                } else {
                    // Most batches: only the credits of messages taken since. What
                    // they cause runs with the first completion's actions below.
                    self.fold_taken(&mut st);
                }
                for wc in done.iter() {
                    self.on_completion(&mut st, wc, events);
                }
                #[cfg(feature = "fault-injection")]
                crate::faults::drain_on_this_thread(
                    events.iter().any(|e| matches!(e, Event::Delivered(_))),
                );
                if self.mail.as_ref().is_some_and(|m| m.over_credits()) {
                    st.core.close(crate::session::over_credits());
                    self.act_all(&mut st, events);
                }
                drop(st);
                // For `wait_idle` (a completion may have ended the last thing in flight).
                self.cond.notify_all();
                Some(done.len())
            }
            Err(e) => {
                self.poll_failed(&e, events);
                None
            }
        }
    }

    // The rare paths of the drain (a failed poll, a completion after the close,
    // a READ's confirmation, an invalidation, the first failure) are out of line,
    // so that what every message runs stays compact (see `conn/actions.rs`).

    /// Polling the CQ failed: the session closes.
    #[cold]
    fn poll_failed(&self, e: &rdma_safe::Error, events: &mut Vec<Event>) {
        let mut st = self.state.lock();
        st.core.close(CloseReason::Rdma(format!(
            "polling the completion queue failed: {e}"
        )));
        self.act_all(&mut st, events);
    }

    /// Handles one completion of this connection's CQ.
    fn on_completion(&self, st: &mut State, wc: &WorkCompletion, events: &mut Vec<Event>) {
        if st.closed.is_some() {
            return self.after_close(st, wc, events);
        }
        let tag = wc.wr_id() >> TAG_SHIFT;
        let value = wc.wr_id() & VALUE_MASK;
        if let Err(e) = wc.result() {
            st.recv.unhandled(wc);
            st.core.close(first_failure(wc, &e));
        } else {
            match tag {
                TAG_RECV => self.on_recv(st, value, wc, events),
                TAG_SEND => match st.send.complete(value) {
                    Ok(slot) => {
                        st.gate.completed();
                        let i = slot.index();
                        st.send_free[i as usize] = Some(slot);
                        st.core.on_send_done(i);
                    }
                    Err(e) => st.core.close(CloseReason::Local(format!("send {e}"))),
                },
                TAG_READ => {
                    st.gate.completed();
                    match self.read_confirmed(st, value) {
                        Ok(()) => st.core.on_read_done(value),
                        Err(why) => st.core.close(why),
                    }
                }
                TAG_INV => {
                    st.gate.completed();
                    st.core.on_invalidated(value)
                }
                _ => st.core.close(CloseReason::Local(format!(
                    "completion with unknown id {:#x}",
                    wc.wr_id()
                ))),
            }
        }
        self.act_all(st, events);
        // An eager message the core keeps waiting behind an earlier one moves into
        // `incoming`; anything else left over (a refused DATA) is dropped.
        if let Some((id, Kind::Eager, inc)) = st.arrived.take() {
            if st.closed.is_none() {
                st.incoming.insert(id, inc);
            }
        }
    }

    /// A completion reaped after the session closed: an error other than a flush
    /// is noted, and a shared receive slot goes back.
    #[cold]
    fn after_close(&self, st: &State, wc: &WorkCompletion, events: &mut Vec<Event>) {
        if let Err(e) = wc.result() {
            if wc.status() != ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                events.push(Event::Noted(format!(
                    "session {} ({}), after its close: {e}",
                    self.id, self.peer
                )));
            }
        }
        st.recv.unhandled(wc);
    }

    /// A READ of message `id` completed: with `confirm_reads`, the queue pair must
    /// still be ready to send, or the completion may be false (see
    /// `Config::confirm_reads`) and the message must not count as read.
    #[inline(never)]
    fn read_confirmed(&self, st: &State, id: u64) -> std::result::Result<(), CloseReason> {
        if !self.confirm_reads {
            return Ok(());
        }
        let state = st.qp.as_ref().map(|qp| qp.query_state());
        match state {
            Some(Ok(ibv_qp_state::IBV_QPS_RTS)) => Ok(()),
            Some(Ok(other)) => Err(CloseReason::Rdma(format!(
                "the RDMA READ of message {id} completed, but the queue pair was in state \
                 {other:?} right after, so the message is not delivered: on Soft-RoCE such \
                 a completion can be false (a READ cut short by a retransmission, see \
                 Config::confirm_reads), unless the queue pair failed for another reason \
                 (logged after this)"
            ))),
            Some(Err(e)) => Err(CloseReason::Rdma(format!(
                "confirming the RDMA READ of message {id}: {e}"
            ))),
            None => Err(CloseReason::Local(
                "a READ completed without a queue pair".into(),
            )),
        }
    }

    /// An eager message's bytes, copied out of its receive slot: into a recycled
    /// array when small (`spare.rs`), else into a pool buffer, or (the pool
    /// failed) a plain vector. Under the shared receive queue's lock (`shared`),
    /// which every session on that queue waits for, only a cached pool buffer is
    /// taken: a registration, or the eviction a refused one starts, runs long,
    /// and a peer can make the cache miss (holding messages, varying lengths).
    fn eager_copy(&self, bytes: &[u8], shared: bool) -> Payload {
        if let Some(small) = Spare::copy_of(bytes) {
            return Payload::Small(small);
        }
        let pooled = if shared {
            self.pool.cached_for(bytes.len())
        } else {
            self.pool.get_for(bytes.len(), crate::pool::For::Peer).ok()
        };
        if let Some(mut buf) = pooled {
            if let Some(dst) = buf.bytes_mut() {
                dst.copy_from_slice(bytes);
                return Payload::Pooled(buf);
            }
        }
        Payload::Bytes(bytes.to_vec())
    }

    /// After an eager message the shared receive queue's lock made a plain
    /// vector (the cache had no buffer), a buffer of its class is registered and
    /// put in the cache, with the lock released, for the next one.
    #[cold]
    fn restock_for(&self, len: usize) {
        drop(self.pool.get_for(len, crate::pool::For::Peer));
    }

    /// [`Self::restock_for`] when `buf` is such a vector.
    #[inline]
    fn restock(&self, buf: &Payload) {
        if let Payload::Bytes(v) = buf {
            if !v.is_empty() {
                self.restock_for(v.len());
            }
        }
    }

    /// A control message arrived in receive slot `index`: decoded and checked here,
    /// its bytes copied out of the slot, then handed to the core. An eager message
    /// the core delivers at once (`Session::on_eager_now`) goes straight to
    /// `events`, with no `Deliver` action and no stop in `State::arrived`.
    fn on_recv(&self, st: &mut State, index: u64, wc: &WorkCompletion, events: &mut Vec<Event>) {
        let len = wc.byte_len() as usize;
        if len > self.slot_size {
            st.recv.unhandled_slot(index);
            return st.core.close(CloseReason::Protocol(format!(
                "a control message of {len} bytes in a slot of {}",
                self.slot_size
            )));
        }
        let shared = st.recv.mailbox().is_some();
        let read = |bytes: &[u8]| self.read_control(bytes, shared);
        let (number, read) = match st.recv.arrive(index, len, read) {
            Ok((number, Ok(read))) => (number, read),
            Ok((_, Err(why))) | Err(why) => return st.core.close(why),
        };
        let (kind, header, arrived) = read;
        if shared {
            self.restock(&arrived.buf);
        }
        let invalidated = match wc.invalidated_rkey() {
            None => false,
            Some(rkey) => match Self::check_invalidation(st, kind, &header, rkey) {
                Ok(()) => true,
                Err(why) => return st.core.close(why),
            },
        };
        if kind == Kind::Eager && !invalidated && st.core.on_eager_now(number, &header).is_some() {
            let msg = Message::from_parts(arrived.buf, arrived.meta);
            return events.push(Event::Delivered(msg));
        }
        st.arrived = match kind {
            Kind::Eager | Kind::Data => Some((header.msg_id, kind, arrived)),
            _ => None,
        };
        st.core.on_control(number, kind, &header, invalidated);
    }

    /// The peer's SEND invalidated our key `rkey`: only the acknowledgement of a
    /// message of ours may, and only that message's window. Anything else (another
    /// message's window, a key of ours we never granted) closes the session: the
    /// window the peer took would otherwise get a LOCAL_INV later, which fails.
    #[inline(never)]
    fn check_invalidation(
        st: &State,
        kind: Kind,
        h: &Control,
        rkey: u32,
    ) -> std::result::Result<(), CloseReason> {
        let window = st.outgoing.get(&h.msg_id).and_then(|o| o.window.as_ref());
        match window.map(rdma_safe::MemoryWindow::rkey) {
            Some(ours) if kind == Kind::Ack && ours == rkey => Ok(()),
            ours => Err(CloseReason::Protocol(format!(
                "its {kind:?} about message {} invalidated key {rkey:#x}, \
                 not that message's window ({})",
                h.msg_id,
                ours.map_or("none".into(), |k| format!("{k:#x}"))
            ))),
        }
    }

    /// Decodes and checks a control message, copying out what outlives its slot:
    /// the metadata, and an eager message's bytes (in a recycled array when small,
    /// else into a buffer of the pool: after the first few messages one comes back
    /// for each one taken, so a steady stream allocates nothing).
    fn read_control(
        &self,
        bytes: &[u8],
        shared: bool,
    ) -> std::result::Result<(Kind, Control, Incoming), CloseReason> {
        let decoded =
            Control::decode(bytes, &self.limits).map_err(|e| CloseReason::Protocol(e.0))?;
        // Only messages carry metadata to the application; `decode` checked its
        // length against MAX_META_LEN.
        debug_assert!(decoded.meta.len() <= crate::protocol::MAX_META_LEN);
        let meta = match decoded.kind {
            Kind::Eager | Kind::Data => Meta::copy_of(decoded.meta).unwrap_or_default(),
            _ => Meta::default(),
        };
        let buf = match decoded.kind {
            Kind::Eager => self.eager_copy(decoded.payload, shared),
            _ => Payload::Bytes(Vec::new()),
        };
        let arrived = Incoming { buf, meta };
        Ok((decoded.kind, decoded.header, arrived))
    }
}

/// Closes its session if the thread unwinds out of the session's drain: a bug in
/// kiara-ib, on whichever thread drained (the application's, a runner, the
/// poller). What that drain had reaped is lost, so the session must not go on as
/// if nothing were: its peer would wait for credits or acknowledgements that never
/// come, and the next message would follow a gap.
/// Dropped only by unwinding out of the drain (a drain that returns forgets it),
/// so a panic of the application's that a drain runs under (a `Drop` that waits
/// on a send while its thread unwinds) closes nothing.
struct ClosesOnUnwind<'a>(&'a Conn);

impl Drop for ClosesOnUnwind<'_> {
    fn drop(&mut self) {
        // The close runs on state the panic may have left half changed: should it
        // panic too, that is caught (not an abort), and the session is marked
        // closed without it (`Conn::closed_by_force`).
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.0.close(CloseReason::Local(
                "kiara-ib failed while handling the session's completions (a bug: \
                 please report it), and what they brought is lost"
                    .into(),
            ))
        }));
        if closed.is_err() {
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.0.closed_by_force()));
        }
    }
}

/// Why the session closes on the first error completion it reaps, `wc` (failed
/// with `e`). A flush first means no error completion came before it: most
/// likely the queue pair failed as a responder, where verbs report nothing to the
/// responder itself (the requester gets the error), and a KIARA peer may only
/// read through a window. Soft-RoCE also fails a queue pair with nothing but
/// flushes after some local failures (`sq_gate.rs`) and after a READ it reported
/// done wrongly (`Config::confirm_reads`).
#[cold]
fn first_failure(wc: &WorkCompletion, e: &rdma_safe::Error) -> CloseReason {
    if wc.status() != ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
        return CloseReason::Rdma(e.to_string());
    }
    CloseReason::Rdma(format!(
        "{e}; no error completion of this session came before it, so its queue pair \
         (number {}) most likely failed as a responder: the peer's RDMA READ or WRITE \
         was refused (a READ outside the bytes a window grants, with another key or \
         after the message's acknowledgement; KIARA grants no WRITE); else the device \
         failed it without a word (Soft-RoCE does after some failures of its own: \
         docs/faults.md)",
        wc.qp_num()
    ))
}
