//! The core's actions that touch the queue pair, the buffers or the session's
//! state, one function each (see `Conn::act`). All run under the session's lock.
//!
//! Those a small message's round trip never runs are kept out of line
//! (`#[inline(never)]`; `#[cold]` for the close), so that `act_all`, which runs
//! after every completion, stays small and touches few pages of code: in the
//! emulated guest the code a message touches costs as much as its instructions
//! (docs/performance-history.md, session 34).

use super::{no_qp, Conn, Event, Incoming, State, TAG_BIND, TAG_INV, TAG_READ, TAG_SHIFT};
use crate::error::CloseReason;
use crate::message::{Message, Payload};
use crate::protocol::Kind;
use rdma_safe::{Access, MemoryWindow, MwType, RemoteSlice, SendWr};
use std::sync::atomic::Ordering;

type Outcome = std::result::Result<(), CloseReason>;

fn local(e: rdma_safe::Error) -> CloseReason {
    CloseReason::Local(e.to_string())
}

impl Conn {
    /// A data message arrived: a cached pool buffer becomes its READ target. Where
    /// the cache has none of its class, registering one would hold this thread
    /// (and whatever waits on it) for as long as a peer's choice of length makes
    /// it take: the poller registers it instead (`crate::registrar`), and the
    /// core holds the message's READs until then.
    #[inline(never)]
    pub(super) fn start_read(&self, st: &mut State, id: u64, len: u64) -> Outcome {
        let Some((arrived, Kind::Data, mut inc)) = st.arrived.take() else {
            return Err(CloseReason::Local(format!(
                "read of message {id}, which did not arrive"
            )));
        };
        debug_assert_eq!(arrived, id);
        match self.pool.cached_for(len as usize) {
            Some(buf) => {
                inc.buf = Payload::Pooled(buf);
                st.incoming.insert(id, inc);
            }
            None => {
                st.incoming.insert(id, inc);
                st.targets_wanted.push_back((id, len));
                st.core.awaiting_target(id);
                self.registrar.ask(self.id);
            }
        }
        Ok(())
    }

    /// Registers the READ targets this session waits for (the poller's work, with
    /// no lock held meanwhile), and lets each message's READs go. When none can be
    /// registered (the memlock limit), the message is refused as busy, and the
    /// session goes on: its sender may try again, as after any refusal. What that
    /// causes (a delivery the refusal let go, a close) is handed to `route` under
    /// the drain lock, as every drain does, so deliveries keep their order. At most
    /// the targets asked for before this began: more asked meanwhile are asked for
    /// again, so that one session cannot hold the poller.
    pub(crate) fn register_targets(&self, route: &mut dyn FnMut(Event)) {
        let mut events = Vec::new();
        let count = self.state.lock().targets_wanted.len();
        for _ in 0..count {
            let (id, len) = {
                let mut st = self.state.lock();
                match st.targets_wanted.pop_front() {
                    // Still waiting: not discarded by a close meanwhile.
                    Some((id, len)) if st.incoming.contains_key(&id) => (id, len),
                    Some(_) => continue,
                    None => return,
                }
            };
            #[cfg(feature = "fault-injection")]
            crate::faults::target_registration();
            let got = self.pool.new_for(len as usize, crate::pool::For::Peer);
            // In the drains' order: the drain lock, then the state.
            let _drain = self.drain_lock.lock();
            let mut st = self.state.lock();
            let unused = match got {
                Ok(buf) => match st.incoming.get_mut(&id) {
                    Some(inc) => {
                        inc.buf = Payload::Pooled(buf);
                        st.core.target_ready(id);
                        None
                    }
                    None => Some(buf),
                },
                Err(e) => {
                    events.push(Event::Noted(format!(
                        "session {} ({}) refused message {id} ({len} bytes) as busy: no \
                         buffer to read it into: {e}",
                        self.id, self.peer
                    )));
                    st.incoming.remove(&id);
                    st.core.no_read_target(id);
                    None
                }
            };
            self.act_all(&mut st, &mut events);
            drop(st);
            // A buffer the closed session no longer wants goes back (or is
            // deregistered) with no lock held.
            drop(unused);
            for ev in events.drain(..) {
                route(ev);
            }
        }
        if !self.state.lock().targets_wanted.is_empty() {
            self.registrar.ask(self.id);
        }
    }

    /// Posts an RDMA READ of `len` bytes of the peer's message `id` into its
    /// target at `offset`.
    #[inline(never)]
    pub(super) fn post_read(
        st: &mut State,
        id: u64,
        offset: u64,
        len: u32,
        remote: RemoteSlice,
    ) -> Outcome {
        let Some(Incoming {
            buf: Payload::Pooled(target),
            ..
        }) = st.incoming.get(&id)
        else {
            return Err(CloseReason::Local(format!(
                "read into message {id}, which has no target"
            )));
        };
        let start = offset as usize;
        let mut sge = [target
            .region()
            .local(start..start + len as usize)
            .map_err(local)?];
        let mut wr = SendWr::rdma_read((TAG_READ << TAG_SHIFT) | id, &mut sge, remote).signaled();
        let qp = st.qp.as_ref().ok_or_else(no_qp)?;
        // SAFETY: the target buffer stays in `incoming` until this READ's
        // completion (the core delivers or discards it only after that, and
        // discards only after the QP is destroyed).
        unsafe { qp.post_send(&mut wr) }.map_err(local)
    }

    /// Posts receive slot `index` again.
    pub(super) fn repost(st: &mut State, index: u32) -> Outcome {
        st.recv.repost(st.qp.as_ref(), index)
    }

    /// Hands the peer's message `id` to the caller as an event.
    #[inline(never)]
    pub(super) fn deliver(st: &mut State, id: u64, events: &mut Vec<Event>) -> Outcome {
        // Usually the message that just arrived (nothing was ahead of it).
        let inc = match st.arrived.take() {
            Some((arrived, _, inc)) if arrived == id => Some(inc),
            other => {
                st.arrived = other;
                st.incoming.remove(&id)
            }
        };
        let inc = inc.ok_or_else(|| {
            CloseReason::Local(format!("delivery of message {id}, which is not here"))
        })?;
        events.push(Event::Delivered(Message::from_parts(inc.buf, inc.meta)));
        Ok(())
    }

    /// Posts the LOCAL_INV of our message `id`'s window.
    #[inline(never)]
    pub(super) fn invalidate(st: &mut State, id: u64) -> Outcome {
        let rkey = st
            .outgoing
            .get(&id)
            .and_then(|o| o.window.as_ref())
            .ok_or_else(|| {
                CloseReason::Local(format!("invalidation of message {id}, which has no window"))
            })?
            .rkey();
        let mut wr = SendWr::local_invalidate((TAG_INV << TAG_SHIFT) | id, rkey).signaled();
        let qp = st.qp.as_ref().ok_or_else(no_qp)?;
        // SAFETY: no local buffer is named.
        unsafe { qp.post_send(&mut wr) }.map_err(local)
    }

    /// Lets go of our message `id`'s bytes and takes its window back.
    #[inline(never)]
    pub(super) fn release(st: &mut State, id: u64) {
        let Some(out) = st.outgoing.get_mut(&id) else {
            return;
        };
        if let Some(mut window) = out.window.take() {
            // SAFETY: the core releases a message with a window only after that
            // window was invalidated: by the acknowledgement's SEND_WITH_INV, whose
            // receive completion named exactly this window's key
            // (`check_invalidation`), or by our LOCAL_INV, completed successfully
            // (a failed one closes the session, and a closed session's windows are
            // deallocated before this, at `DestroyQp`).
            unsafe { window.release_region() };
            st.windows.push(window);
        }
        // The buffer goes now; the entry stays for `Finished`.
        drop(std::mem::replace(
            &mut out.bytes,
            Payload::Bytes(Vec::new()),
        ));
    }

    /// Destroys the queue pair, windows first.
    #[cold]
    pub(super) fn destroy_qp(st: &mut State) {
        // Nothing held back is posted any more.
        st.gate.clear();
        // Windows first: deallocated, none grants the peer anything any more
        // (and rxe stalls destroying a QP a bound type 2 window refers to).
        st.windows.clear();
        for out in st.outgoing.values_mut() {
            drop(out.window.take());
        }
        // Destroying the QP (not resetting it: Soft-RoCE in Linux 6.1 underflows a
        // reference count destroying a QP it had reset) discards every outstanding
        // request; after it the device no longer reads or writes our buffers, which
        // the core releases next.
        drop(st.qp.take());
    }

    /// The session is closed, for `reason`.
    #[cold]
    pub(super) fn closed_now(&self, st: &mut State, reason: CloseReason, events: &mut Vec<Event>) {
        // Eager messages not sent by now fail (`wait_eager` tells why).
        st.eager_out.clear();
        st.arrived = None;
        // No READ target is registered for a closed session.
        st.targets_wanted.clear();
        let _ = self.tcp.shutdown(std::net::Shutdown::Both);
        st.closed = Some(reason.clone());
        self.is_closed.store(true, Ordering::Release);
        // The runners deliver what is queued; nothing more is queued.
        self.callbacks.close();
        events.push(Event::Closed(reason));
    }

    /// The session's close failed (a bug in kiara-ib, after another in its drain):
    /// it is marked closed without the core, its queue pair destroyed first, and
    /// what the core still holds is left to the session's drop (which destroys the
    /// queue pair before freeing anything). Waiters wake and find it closed.
    #[cold]
    pub(crate) fn closed_by_force(&self) {
        let mut st = self.state.lock();
        if st.qp.is_some() {
            Self::destroy_qp(&mut st);
            st.recv.drain();
        }
        if st.closed.is_none() {
            let reason = CloseReason::Local(
                "kiara-ib failed while handling the session's completions and again \
                 while closing it (a bug: please report it)"
                    .into(),
            );
            // Read messages' waiters are told (their buffers stay with the session
            // until it is dropped).
            for out in st.outgoing.values_mut() {
                if let Some(done) = out.done.take() {
                    done.finish(Err(reason.clone()));
                }
            }
            self.closed_now(&mut st, reason, &mut Vec::new());
        }
        drop(st);
        self.cond.notify_all();
    }

    /// Binds a window over exactly message `id`'s bytes, granting RDMA READ to the
    /// peer on this session's queue pair only. The bind goes on the send queue ahead
    /// of the descriptor (the core's next action), so it is in place before the peer
    /// can know the key. When the view or the window cannot be had, it binds
    /// nothing and marks the message `unbound`: its descriptor then goes as a
    /// withdrawal (`post_control`).
    #[inline(never)]
    pub(super) fn bind_window(
        &self,
        st: &mut State,
        id: u64,
        events: &mut Vec<Event>,
    ) -> std::result::Result<(), CloseReason> {
        let local = |e: rdma_safe::Error| CloseReason::Local(e.to_string());
        let qp = st.qp.as_ref().ok_or_else(no_qp)?;
        let out = st
            .outgoing
            .get_mut(&id)
            .ok_or_else(|| CloseReason::Local(format!("descriptor of vanished message {id}")))?;
        // A registration refused here (the view: the memlock limit; the window:
        // the device's) fails this message alone: its descriptor's slot goes as a
        // CREDIT (`post_control`).
        let unbound = |why: String, events: &mut Vec<Event>| {
            events.push(Event::Noted(format!(
                "session {} ({}) withdrew message {id} of ours: its window could not be \
                 bound: {why}",
                self.id, self.peer
            )));
            Some(why)
        };
        let view = match self.read_view(&mut out.bytes) {
            Ok(view) => view,
            Err(e) => {
                out.unbound = unbound(e.to_string(), events);
                return Ok(());
            }
        };
        let mut window = match st.windows.pop() {
            Some(w) => w,
            None => match MemoryWindow::new(qp.pd(), MwType::Type2) {
                Ok(w) => w,
                Err(e) => {
                    out.unbound = unbound(e.to_string(), events);
                    return Ok(());
                }
            },
        };
        let len = view.len();
        let (mut wr, _) = SendWr::bind_mw(
            (TAG_BIND << TAG_SHIFT) | id,
            &mut window,
            &view,
            0..len,
            Access::REMOTE_READ,
        )
        .map_err(local)?;
        // SAFETY: no local buffer is named; the window holds the view (an `Arc`)
        // while bound, and is deallocated before the QP and the bytes on close.
        unsafe { qp.post_send(&mut wr) }.map_err(local)?;
        out.window = Some(window);
        Ok(())
    }
}
