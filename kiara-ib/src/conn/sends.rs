//! Sending: `send` hands a message to the session core (or, when nothing is
//! queued before it, straight to a send slot), and the `Post` actions write
//! control messages into send slots and post them.

use super::{no_qp, Conn, Outgoing, Sent, State, INLINE_BYTES, IN_CALLBACK, TAG_SEND, TAG_SHIFT};
use crate::error::{CloseReason, Error, Result};
use crate::message::{Message, Payload};
use crate::pool::For;
use crate::protocol::{Control, Kind, CONTROL_HEADER_LEN};
use crate::session::Refused;
use crate::slots::{Slot, SlotSlab};
use parking_lot::MutexGuard;
use rdma_safe::qp::Rts;
use rdma_safe::{MemoryRegion, MemoryWindow, ProtectionDomain, QueuePair};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often a `send` waiting for room on the transport (not its session) looks
/// again.
const RECHECK: Duration = Duration::from_millis(5);

impl Conn {
    /// Starts sending `msg`; what it returns completes when the peer has it. When as
    /// many messages or bytes are in flight as the session allows, waits for room up
    /// to `room` (`None`: as long as it takes; zero: fails at once with
    /// [`Error::Full`]).
    pub(crate) fn send(&self, msg: Message, room: Option<Duration>) -> Result<Sent> {
        let len = msg.len() as u64;
        if len > self.send_limit {
            return Err(Error::Usage(
                format!(
                    "message of {len} bytes exceeds the largest either side accepts ({})",
                    self.send_limit
                )
                .into(),
            ));
        }
        // A zero-length message always travels eager: a read needs at least one byte.
        let eager = msg.is_empty()
            || (msg.len() <= self.eager_threshold && !matches!(msg.payload, Payload::Region(..)));
        let meta = msg.meta;
        // The copy into a registered buffer happens before taking the lock.
        let mut bytes = if eager {
            msg.payload
        } else {
            self.registered(msg.payload)?
        };
        let mut deadline = None;
        let mut st = self.state.lock();
        self.fold_taken(&mut st);
        if eager {
            match self.send_eager_now(&mut st, len, meta.bytes(), bytes) {
                Ok(id) => return Ok(Sent::Eager(id)),
                Err(declined) => bytes = declined,
            }
        }
        // A copy into a pool buffer pins the whole buffer until the peer read it.
        let pinned = match &bytes {
            Payload::Pooled(_) => crate::pool::buffer_len(len),
            _ => len,
        };
        let id = loop {
            match st.core.send(eager, len, pinned) {
                Ok(id) => break id,
                Err(Refused::Closed(reason)) => return Err(Error::Closed(reason)),
                Err(full) => {
                    if room.is_some_and(|r| r.is_zero()) || IN_CALLBACK.with(|f| f.get()) {
                        return Err(Error::Full);
                    }
                    // This session's sends wake it; room on the transport's other
                    // sessions does not, so that wait looks again now and then.
                    let recheck = matches!(full, Refused::TransportFull).then_some(RECHECK);
                    if self.sleep(&mut st, room, &mut deadline, recheck) {
                        return Err(Error::Full);
                    }
                }
            }
        };
        let done = (!eager).then(|| st.done_records.lend());
        let out = Outgoing {
            bytes,
            meta,
            done: done.clone(),
            window: None,
            unbound: None,
        };
        if eager {
            st.eager_out.push_back((id, out));
        } else {
            st.outgoing.insert(id, out);
        }
        self.run_and_report(st);
        Ok(match done {
            Some(done) => Sent::Read(done),
            None => Sent::Eager(id),
        })
    }

    /// Sends an eager message straight into a send slot when it would go out at
    /// once anyway: the core has nothing queued before it and lets it go
    /// ([`crate::session::Session::send_eager_now`]), and the send-queue gate holds nothing. Its
    /// id, or the bytes back with nothing changed (then it takes the queues). A
    /// post that fails closes the session, as any failed action does.
    fn send_eager_now(
        &self,
        st: &mut MutexGuard<'_, State>,
        len: u64,
        meta: &[u8],
        bytes: Payload,
    ) -> std::result::Result<u64, Payload> {
        if !st.gate.is_clear() {
            return Err(bytes);
        }
        let Some((id, index, mut h)) = st.core.send_eager_now(len) else {
            return Err(bytes);
        };
        debug_assert!(st.eager_out.is_empty(), "an eager message passed another");
        h.meta_len = meta.len() as u8;
        let posted = Self::take_send_slot(st, index).and_then(|slot| {
            let State { send, qp, .. } = &mut **st;
            let payload = bytes.bytes();
            self.write_and_post(send, qp.as_ref(), slot, Kind::Eager, &h, meta, payload)
        });
        // Copied into the slot: a pooled buffer goes back while the lock is held, so
        // the reply this SEND may bring at once (reaped under the lock) finds it
        // free, and a steady exchange never needs a second buffer.
        drop(bytes);
        match posted {
            Ok(()) => st.gate.posted(),
            Err(why) => {
                st.core.close(why);
                let mut events = Vec::new();
                self.run(st, &mut events);
                // Logged once the lock is released, as `run_and_report` does.
                MutexGuard::unlocked(st, || self.report(events));
            }
        }
        Ok(id)
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
    ) -> Option<std::result::Result<(), CloseReason>> {
        if self.eager_done.load(Ordering::Acquire) >= msg_id {
            return Some(Ok(()));
        }
        let mut deadline = None;
        let mut st = self.state.lock();
        loop {
            if st.core.eager_done() >= msg_id {
                return Some(Ok(()));
            }
            if let Some(reason) = &st.closed {
                return Some(Err(reason.clone()));
            }
            if self.sleep(&mut st, timeout, &mut deadline, None) {
                return None;
            }
        }
    }

    /// The bytes of a read message in registered memory, where the peer will read
    /// them through a window.
    fn registered(&self, payload: Payload) -> Result<Payload> {
        match payload {
            Payload::Bytes(_) | Payload::Small(_) => {
                let bytes = payload.bytes();
                let mut buf = self.pool.get(bytes.len())?;
                buf.bytes_mut()
                    .ok_or_else(|| Error::Usage("a fresh pool buffer was shared".into()))?
                    .copy_from_slice(bytes);
                Ok(Payload::Pooled(buf))
            }
            registered => Ok(registered),
        }
    }

    /// The region over exactly a read message's registered bytes, which its
    /// window binds to. When the registration fails (the memlock limit), the
    /// pool's free buffers may be what is in the way: they are let go, and it is
    /// tried once more.
    pub(super) fn read_view(&self, bytes: &mut Payload) -> Result<Arc<MemoryRegion>> {
        let view = |bytes: &mut Payload| match bytes {
            Payload::Pooled(b) => Ok(b.exact_view()?),
            Payload::Region(region, range) => self.region_view(self.pool.pd(), region, range),
            Payload::Bytes(_) | Payload::Small(_) => Err(Error::Usage(
                "a read message not in registered memory".into(),
            )),
        };
        match view(bytes) {
            Err(Error::Rdma(_)) if self.pool.make_room(bytes.bytes().len(), For::Us) => view(bytes),
            got => got,
        }
    }

    /// The view a window over `range` of a user's region binds to: the region's
    /// own kept view when it is in the transport's protection domain `pd` (its
    /// queue pairs'; no registration once the range was sent before), else a new
    /// one in `pd`.
    ///
    /// Both are sound for the same reason: the message's `Outgoing` owns `region`
    /// until the core releases the message, and the window (the only other handle
    /// on the view) goes first: it lets go at `Release`, after its invalidation
    /// completed, is deallocated at `DestroyQp`, or is dropped before the bytes
    /// (`Outgoing`'s field order). Nothing writes the bytes meanwhile (they stay
    /// unchanged until the send completes).
    fn region_view(
        &self,
        pd: &Arc<ProtectionDomain>,
        region: &Arc<MemoryRegion>,
        range: &std::ops::Range<usize>,
    ) -> Result<Arc<MemoryRegion>> {
        if Arc::ptr_eq(region.pd(), pd) {
            // SAFETY: see above; the region keeps the view for its next message
            // and drops it before its memory.
            let got = unsafe { region.read_view(range.clone()) }?;
            if got.registered {
                self.pool.count_registration();
            }
            return Ok(got.view);
        }
        // SAFETY: see above; the window holds this view's only handle.
        let view = unsafe { region.new_read_view(pd, range.clone()) }?;
        self.pool.count_registration();
        Ok(Arc::new(view))
    }

    /// Writes a control message into send slot `index` and posts it.
    pub(super) fn post_control(
        &self,
        st: &mut State,
        index: u32,
        kind: Kind,
        mut h: Control,
    ) -> std::result::Result<(), CloseReason> {
        if kind == Kind::Data {
            let unbound = st.outgoing.get(&h.msg_id).and_then(|o| o.unbound.clone());
            if let Some(why) = unbound {
                // Its window could not be bound: the slot carries what the header
                // returns (credits, `seen`) as a CREDIT that withdraws the message
                // (its id), and the message fails alone.
                let credit = crate::session::withdrawal(&h);
                self.post_control(st, index, Kind::Credit, credit)?;
                st.core.bind_failed(h.msg_id, why);
                return Ok(());
            }
        }
        let slot = Self::take_send_slot(st, index)?;
        // What the core cannot know: the bytes and where the peer reads them.
        let State {
            send,
            qp,
            eager_out,
            outgoing,
            ..
        } = st;
        let (meta, payload): (&[u8], &[u8]) = match kind {
            Kind::Eager => {
                let (_, out) = eager_out
                    .front()
                    .filter(|(id, _)| *id == h.msg_id)
                    .ok_or_else(|| {
                        CloseReason::Local(format!("eager message {} vanished", h.msg_id))
                    })?;
                (out.meta.bytes(), out.bytes.bytes())
            }
            Kind::Data => {
                let out = outgoing
                    .get(&h.msg_id)
                    .ok_or_else(|| CloseReason::Local(format!("message {} vanished", h.msg_id)))?;
                let (region, start) = match &out.bytes {
                    Payload::Region(r, range) => (r, range.start),
                    Payload::Pooled(b) => (b.region(), 0),
                    Payload::Bytes(_) | Payload::Small(_) => {
                        return Err(CloseReason::Local("DATA without a region".into()))
                    }
                };
                h.addr = region.addr() + start as u64;
                h.rkey = out.window.as_ref().map_or(0, MemoryWindow::rkey);
                (out.meta.bytes(), &[])
            }
            _ => (&[], &[]),
        };
        h.meta_len = meta.len() as u8;
        let posted = self.write_and_post(send, qp.as_ref(), slot, kind, &h, meta, payload);
        if kind == Kind::Eager {
            // Copied into the slot: the message's own bytes are no longer needed.
            eager_out.pop_front();
        }
        posted
    }

    /// Send slot `index`, which the core gave a control message, out of the free ones.
    fn take_send_slot(st: &mut State, index: u32) -> std::result::Result<Slot, CloseReason> {
        st.send_free
            .get_mut(index as usize)
            .and_then(Option::take)
            .ok_or_else(|| CloseReason::Local(format!("send slot {index} is not free")))
    }

    /// Writes a control message (`h`, then `meta` and `payload`) into `slot` of
    /// `send` and posts it on `qp`.
    #[allow(clippy::too_many_arguments)]
    fn write_and_post(
        &self,
        send: &mut SlotSlab,
        qp: Option<&QueuePair<Rts>>,
        mut slot: Slot,
        kind: Kind,
        h: &Control,
        meta: &[u8],
        payload: &[u8],
    ) -> std::result::Result<(), CloseReason> {
        let index = slot.index();
        let total = CONTROL_HEADER_LEN + meta.len() + payload.len();
        let buf = send.bytes_mut(&mut slot, total);
        h.write_header(kind, &mut buf[..CONTROL_HEADER_LEN]);
        buf[CONTROL_HEADER_LEN..CONTROL_HEADER_LEN + meta.len()].copy_from_slice(meta);
        buf[CONTROL_HEADER_LEN + meta.len()..].copy_from_slice(payload);
        let wr_id = (TAG_SEND << TAG_SHIFT) | u64::from(index);
        let inline = total <= INLINE_BYTES as usize;
        // An acknowledgement may take back the peer's window on the message it names.
        let invalidate = (kind == Kind::Ack && self.invalidating_acks).then_some(h.rkey);
        let qp = qp.ok_or_else(no_qp)?;
        // SAFETY: as in `post_recv_slot`; the slot is the device's until this SEND's
        // completion hands it back (`on_completion`).
        unsafe { send.post_send(qp, slot, total, wr_id, inline, invalidate) }
            .map_err(|e| CloseReason::Local(e.to_string()))
    }
}
