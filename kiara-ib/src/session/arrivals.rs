//! The session core's side that takes what arrives: the peer's control messages
//! (credits, `seen`, messages, acknowledgements) and what follows from them.

use super::{broke, Action, In, Out, ReadJob, Session, ACK_BUSY, ACK_DELIVERED};
use crate::error::CloseReason;
use crate::protocol::{Control, Kind};

impl Session {
    /// A control message arrived in receive slot `slot`, decoded (and checked
    /// against our limits) by [`Control::decode`].
    ///
    /// `invalidated`: the SEND carried an invalidation (SEND_WITH_INV) that the
    /// driver found to be of the window of message `h.msg_id`; only an
    /// acknowledgement may carry one.
    // Out of line: the driver's drain keeps to the express path's code
    // (`on_eager_now`) for the usual small message (see `conn/actions.rs`).
    #[inline(never)]
    pub(crate) fn on_control(&mut self, slot: u32, kind: Kind, h: &Control, invalidated: bool) {
        if self.closed.is_some() {
            return;
        }
        self.greeting = None;
        if let Err(why) = self.handle_control(slot, kind, h, invalidated) {
            return self.close(why);
        }
        self.flush();
    }

    /// [`Session::on_control`] of the peer's eager message `h`, arrived in receive
    /// slot `slot` without an invalidation, when it is delivered at once with no
    /// action before its delivery: none waits to be carried out, none of the peer's
    /// messages is ahead of it, and it keeps every rule `on_control` checks.
    /// Returns its id for the driver to deliver now, ahead of whatever this queued
    /// (a control message that the credits it returned let go); the state is then
    /// what `on_control` and its `Deliver` leave. `None`, with nothing changed, in
    /// any other case: then `on_control` takes it (and closes on a broken rule).
    pub(crate) fn on_eager_now(&mut self, slot: u32, h: &Control) -> Option<u64> {
        let id = h.msg_id;
        let fits = self.closed.is_none()
            && self.actions.is_empty()
            && self.arrival.is_empty()
            && self.posted.get(slot as usize) == Some(&true)
            && self.granted > 0
            && h.credits <= self.spent
            && id > self.received_upto
            && id <= self.received_upto + u64::from(self.p.credits);
        if !fits {
            return None;
        }
        // `on_control`, `handle_control`, `on_message` and `on_eager`, in their order.
        self.greeting = None;
        self.posted[slot as usize] = false;
        self.granted -= 1;
        self.spent -= h.credits;
        self.send_credits += h.credits;
        self.on_seen(h.seen);
        self.received_upto = id;
        self.to_repost.push(slot);
        self.delivered.push_back(0);
        self.flush();
        Some(id)
    }

    fn handle_control(
        &mut self,
        slot: u32,
        kind: Kind,
        h: &Control,
        invalidated: bool,
    ) -> Result<(), CloseReason> {
        match self.posted.get_mut(slot as usize) {
            Some(p) if *p => *p = false,
            _ => {
                return Err(broke(format!(
                    "a receive completed in slot {slot}, which was not posted"
                )))
            }
        }
        if self.granted == 0 {
            return Err(super::over_credits());
        }
        self.granted -= 1;
        if h.credits > self.spent {
            return Err(broke(format!(
                "the peer returned {} credits but owed {}",
                h.credits, self.spent
            )));
        }
        if invalidated && kind != Kind::Ack {
            return Err(broke(format!(
                "the peer invalidated a window with a {kind:?} message"
            )));
        }
        self.spent -= h.credits;
        self.send_credits += h.credits;
        self.on_seen(h.seen);
        match kind {
            Kind::Eager | Kind::Data => self.on_message(slot, kind, h),
            Kind::Ack => {
                self.on_ack(h.msg_id, h.len, invalidated)?;
                self.repost_now(slot);
                Ok(())
            }
            Kind::Credit => {
                if h.msg_id != 0 {
                    // The peer withdrew that message (`Session::bind_failed`).
                    self.next_id(h.msg_id)?;
                }
                self.repost_now(slot);
                Ok(())
            }
            Kind::Bye => Err(CloseReason::PeerDisconnected),
        }
    }

    /// A message of the peer's: its id must be the next ones'.
    fn on_message(&mut self, slot: u32, kind: Kind, h: &Control) -> Result<(), CloseReason> {
        let id = h.msg_id;
        self.next_id(id)?;
        match kind {
            Kind::Eager => self.on_eager(slot, id),
            _ => self.on_data(slot, h),
        }
        Ok(())
    }

    /// The peer's next message (or withdrawn message) is `id`: it must come after
    /// the last, within our credits.
    fn next_id(&mut self, id: u64) -> Result<(), CloseReason> {
        // The peer cannot have more messages in flight than our credits: an id further
        // ahead is a lie (and would reach into the driver's work-request tags).
        if id <= self.received_upto {
            return Err(broke(format!(
                "message id {id} repeats or goes backwards (last {})",
                self.received_upto
            )));
        }
        if id > self.received_upto + u64::from(self.p.credits) {
            return Err(broke(format!(
                "message id {id} jumps ahead: the last was {}, and at most {} can be in flight",
                self.received_upto, self.p.credits
            )));
        }
        self.received_upto = id;
        Ok(())
    }

    /// The peer's eager message `id` arrived in receive slot `slot`: delivered now,
    /// or after the messages ahead of it.
    fn on_eager(&mut self, slot: u32, id: u64) {
        self.to_repost.push(slot);
        if self.arrival.is_empty() {
            // Nothing ahead of it: delivered at once, no bookkeeping.
            self.delivered.push_back(0);
            self.actions.push_back(Action::Deliver(id));
            return;
        }
        self.incoming.insert(
            id,
            In {
                reads_left: 0,
                needs_ack: false,
                charged: 0,
                rkey: 0,
                started: None,
            },
        );
        self.arrival.push_back(id);
        self.deliver_ready();
    }

    /// The peer's read message (descriptor `h`) arrived in receive slot `slot`:
    /// refused when it would take us past `max_in_bytes`, or the transport past its
    /// budget for all sessions, else its READs queued. It is charged the buffer it
    /// will pin (`pool::buffer_len`), so that a tiny message costs its 4 KiB.
    fn on_data(&mut self, slot: u32, h: &Control) {
        let id = h.msg_id;
        let charge = crate::pool::buffer_len(h.len);
        if self.in_bytes.saturating_add(charge) > self.p.max_in_bytes || !self.charge_in(charge) {
            // Refused: nothing is read, nothing delivered, the slot is free at once.
            self.acks.push_back((id, ACK_BUSY, h.rkey));
            self.repost_now(slot);
            return;
        }
        self.actions.push_back(Action::StartRead { id, len: h.len });
        let chunk = u64::from(self.p.read_chunk);
        let chunks = h.len.div_ceil(chunk);
        for i in 0..chunks {
            let offset = i * chunk;
            self.reads.push_back(ReadJob {
                id,
                offset,
                len: (h.len - offset).min(chunk) as u32,
                addr: h.addr + offset,
                rkey: h.rkey,
            });
        }
        self.incoming.insert(
            id,
            In {
                reads_left: chunks as u32,
                needs_ack: true,
                charged: charge,
                rkey: h.rkey,
                started: None,
            },
        );
        self.arrival.push_back(id);
        self.to_repost.push(slot);
    }

    /// The driver could not get a READ target for the peer's message `id` (the
    /// registration of its buffer failed: the memlock limit, or the device's): it
    /// is refused as busy, as one over the budgets is. Nothing of it was read (its
    /// READs come after its `StartRead`, and are dropped here), its charge and
    /// its credit go back, and the messages behind it go on.
    #[inline(never)]
    pub(crate) fn no_read_target(&mut self, id: u64) {
        if self.closed.is_some() {
            return;
        }
        let Some(inc) = self.incoming.remove(&id).filter(|i| i.needs_ack) else {
            return self.close(CloseReason::Local(format!(
                "no READ target for message {id}, which is not to be read"
            )));
        };
        self.reads.retain(|job| job.id != id);
        self.held_reads.retain(|job| job.id != id);
        let queued = self.actions.len();
        self.actions
            .retain(|a| !matches!(a, Action::Read { id: of, .. } if *of == id));
        self.reads_in_flight -= (queued - self.actions.len()) as u32;
        self.arrival.retain(|&a| a != id);
        self.uncharge_in(inc.charged);
        // Done with, as a taken message is: its credit goes back once its receive
        // slot is posted again.
        self.taken += 1;
        self.acks.push_back((id, ACK_BUSY, inc.rkey));
        self.deliver_ready();
        self.flush();
    }

    /// The driver has no READ target for the peer's message `id` at hand and
    /// registers one off the drain path (a registration takes long, and a peer
    /// chooses when one is needed): the message's READs, queued or not, are held
    /// until [`Session::target_ready`] (or [`Session::no_read_target`]). Other
    /// messages' READs go on; deliveries keep their order (`arrival`).
    #[inline(never)]
    pub(crate) fn awaiting_target(&mut self, id: u64) {
        if self.closed.is_some() {
            return;
        }
        if !self.incoming.get(&id).is_some_and(|i| i.needs_ack) {
            return self.close(CloseReason::Local(format!(
                "a READ target awaited for message {id}, which is not to be read"
            )));
        }
        // Its READs queued as actions (behind its StartRead) go back first, in order
        // (into the held list itself: no allocation once it has grown).
        let before = self.held_reads.len();
        let held = &mut self.held_reads;
        self.actions.retain(|a| match *a {
            Action::Read {
                id: of,
                offset,
                len,
                addr,
                rkey,
            } if of == id => {
                held.push(ReadJob {
                    id,
                    offset,
                    len,
                    addr,
                    rkey,
                });
                false
            }
            _ => true,
        });
        self.reads_in_flight -= (self.held_reads.len() - before) as u32;
        self.held_reads
            .extend(self.reads.iter().filter(|job| job.id == id));
        self.reads.retain(|job| job.id != id);
        // Another message's READs may take the depth it gave back.
        self.flush();
    }

    /// The READ target of the peer's message `id`, awaited
    /// ([`Session::awaiting_target`]), is ready: its READs go next.
    #[inline(never)]
    pub(crate) fn target_ready(&mut self, id: u64) {
        if self.closed.is_some() {
            return;
        }
        for job in self.held_reads.iter().rev().filter(|job| job.id == id) {
            self.reads.push_front(*job);
        }
        self.held_reads.retain(|job| job.id != id);
        self.flush();
    }

    /// The peer acknowledged our message `id`; `invalidated`: with the SEND_WITH_INV
    /// of its window (else the driver invalidates it).
    /// "Delivered" is cumulative: every earlier message of ours still in flight was
    /// delivered too, and its window gets our LOCAL_INV.
    fn on_ack(&mut self, id: u64, code: u64, invalidated: bool) -> Result<(), CloseReason> {
        let in_flight = |out: &Out| out.posted.is_some() && out.acked.is_none();
        if code == ACK_DELIVERED && self.outgoing.get(&id).is_some_and(in_flight) {
            for (&earlier, out) in self.outgoing.range_mut(..id) {
                if in_flight(out) {
                    out.acked = Some(ACK_DELIVERED);
                    self.actions.push_back(Action::Invalidate(earlier));
                }
            }
        }
        match self.outgoing.get_mut(&id) {
            Some(out) if in_flight(out) => {
                out.acked = Some(code);
                if invalidated {
                    self.window_gone(id)
                } else {
                    self.actions.push_back(Action::Invalidate(id));
                    Ok(())
                }
            }
            _ => Err(broke(format!(
                "an acknowledgement of message {id}, which is not in flight"
            ))),
        }
    }

    /// The peer says it has our messages up to the id whose low 32 bits are `seen`.
    fn on_seen(&mut self, seen: u32) {
        // A lie only completes eager sends early, as a lying SEND completion would;
        // never one not posted yet (its send would count as done, and the room it
        // left would let the application queue without end).
        let upto = crate::protocol::widen_seen(seen, self.next_msg_id - 1).min(self.eager_posted);
        self.eager_done_upto(upto);
    }

    /// A control message's slot is free again: repost it and owe its credit.
    fn repost_now(&mut self, slot: u32) {
        self.posted[slot as usize] = true;
        self.actions.push_back(Action::Repost(slot));
        self.to_return += 1;
    }

    /// Delivers, in arrival order, every message that is complete and not waiting
    /// behind an earlier one; read messages are acknowledged as they go.
    pub(super) fn deliver_ready(&mut self) {
        while let Some(&id) = self.arrival.front() {
            match self.incoming.get(&id) {
                Some(i) if i.reads_left > 0 => break,
                _ => {}
            }
            self.arrival.pop_front();
            let Some(inc) = self.incoming.remove(&id) else {
                continue;
            };
            if inc.needs_ack {
                self.acks.push_back((id, ACK_DELIVERED, inc.rkey));
            }
            self.delivered.push_back(inc.charged);
            self.actions.push_back(Action::Deliver(id));
        }
    }
}
