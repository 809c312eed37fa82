//! The safe posting layer: a queue pair that holds every buffer it posted until the
//! completion that releases it has been handed back, so no safe code can free, reuse
//! or read a buffer the device may still touch.
//!
//! ```no_run
//! # use rdma_safe::*;
//! # use rdma_safe::lease::{Lease, LeasedQp, SendOp};
//! # fn demo(qp: QueuePair<rdma_safe::qp::Rts>, mr: MemoryRegion,
//! #         peer: RemoteSlice) -> Result<()> {
//! let cq = qp.send_cq().clone();
//! let mut conn = LeasedQp::new(qp)?;
//! // The region moves in; nobody can touch it while the WRITE may run.
//! conn.post_send(1, SendOp::Write(peer), Lease::Owned(mr), 0..4096, true)
//!     .map_err(|e| e.error)?;
//! let mut scratch = [WorkCompletion::default(); 16];
//! loop {
//!     // Only a completion polled from the queue pair's own CQ releases anything.
//!     for completion in cq.poll_completions(&mut scratch)? {
//!         for (wr_id, lease) in conn.complete(completion)? {
//!             println!("request {wr_id} done, buffer back: {} bytes", lease.region().len());
//!         }
//!     }
//! #   break;
//! }
//! # Ok(()) }
//! ```
//!
//! A queue pair made with [`QueuePair::new_ex`] posts each operation it was made
//! for through libibverbs' extended interface (`ibv_wr_*`), the others through
//! `ibv_post_send`; the leases work the same either way.
//!
//! Send-queue completions arrive in posting order, so one signaled completion also
//! releases the unsignaled requests posted before it. When only one free slot is left a
//! request is signaled whatever the caller asked, so the queue always drains.
//! Steady-state posting and completing allocate nothing.
//!
//! # One buffer for many requests
//! A [`DeviceRegion`] hands a region to the device as a whole, for as many requests as
//! the program likes, overlapping or not: the C examples' single buffer that every
//! receive lands in and every send goes out of. Its clones reach no byte of it; only
//! [`DeviceRegion::into_region`] gives the region back, and only once no clone is left,
//! that is once every request posted on it was released by its completion (or its
//! `LeasedQp` was dropped). [`LeasedQp::post_send_device`] and
//! [`LeasedQp::post_recv_device`] post on it.
//!
//! # Why a completion cannot be forged
//! [`LeasedQp::complete`] takes a [`Completion`], which only
//! [`CompletionQueue::poll_completions`](crate::CompletionQueue::poll_completions)
//! makes, once per polled entry, tagged with its queue's never-reused id and its
//! number among that queue's completions. It must come from this queue pair's send or
//! receive CQ, name this queue pair's number, carry a work request id this `LeasedQp`
//! posted and has not yet seen completed (bit 63, reserved for `LeasedQp`: the raw
//! posts' contract forbids it, and the one safe post with a caller's id,
//! [`MemoryWindow::bind`](crate::MemoryWindow::bind), refuses it; a tag unique to
//! this `LeasedQp`; the slot's generation and the slot itself), and have been handed
//! out after that request was posted: the generation has 20 bits, so a slot's tag
//! comes round again (after 2^20 posts, on a ring whose size divides 2^20), and a
//! completion kept that long would otherwise name a later request. A post reads
//! the queue's count only while no poll has completions it has not numbered yet
//! (`completion::Numbering`), so one taken off the queue before the post never
//! gets a number after it.
//! [`LeasedQp::complete_ex`] takes the current completion of an extended queue's
//! poll, which is just as real (handed out once, valid only inside the poll's
//! callback, so it cannot be kept); it must come from this queue pair's extended
//! queue, and name this queue pair where the queue reports queue pair numbers. Queue
//! pairs with a shared receive queue and UD queue pairs (whose SENDs need an address
//! handle) are refused.
//!
//! # Why no safe code can see bytes the device may write
//! The device writes into a buffer for receives, READs and atomics. Those take an
//! exclusive [`Lease::Owned`] region (moved in, so nobody else holds it) or a
//! [`DeviceRegion`] (whose clones expose no bytes); a [`Lease::Shared`] region is only
//! ever read by the device. A buffer comes back only when the completion that
//! releases it was handed in, or after the queue pair was destroyed.

mod device;
mod ring;
pub use device::DeviceRegion;
use ring::{Held, Ring, FIELD_MASK, SLOT_BITS};

use crate::completion::Completion;
use crate::cq::ExCompletion;
use crate::error::{Error, Result};
use crate::mr::{LocalSlice, MemoryRegion, RemoteSlice};
use crate::qp::{CanRecv, Init, QpType, QueuePair, Rts, SendOps, State, TransitionError};
use crate::wr::{RecvWr, SendWr};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A registered buffer handed to the device for one request.
#[derive(Debug)]
pub enum Lease {
    /// Exclusive: the device may write into it (receives, READ and atomic targets).
    Owned(MemoryRegion),
    /// Shared with other readers: the device only reads it (SEND, WRITE sources).
    Shared(Arc<MemoryRegion>),
}

impl Lease {
    /// The region.
    pub fn region(&self) -> &MemoryRegion {
        match self {
            Lease::Owned(mr) => mr,
            Lease::Shared(mr) => mr,
        }
    }
}

/// The operation of a send-queue request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm(u32),
    /// SEND that also invalidates the peer's key (SEND_WITH_INV): the peer's
    /// window or region of that key is invalid when the peer polls the receive.
    SendWithInvalidate(u32),
    /// RDMA WRITE to the peer's memory.
    Write(RemoteSlice),
    /// RDMA WRITE with immediate data.
    WriteWithImm(RemoteSlice, u32),
    /// RDMA READ from the peer's memory into the leased buffer.
    Read(RemoteSlice),
    /// Atomic compare-and-swap; the old value lands in the leased buffer (8 bytes).
    CompareAndSwap {
        /// The peer's 8 bytes.
        remote: RemoteSlice,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Atomic fetch-and-add; the old value lands in the leased buffer (8 bytes).
    FetchAndAdd {
        /// The peer's 8 bytes.
        remote: RemoteSlice,
        /// Addend.
        add: u64,
    },
}

/// Why an inline READ or atomic is refused.
const INLINE_WRITES_LOCALLY: &str =
    "inline (IBV_SEND_INLINE) is for SENDs and WRITEs only: for a READ or an atomic \
     verbs leave it undefined, and Soft-RoCE takes the inlined bytes as the list of \
     where the reply is written; post it without inline";

impl SendOp {
    /// True when the device writes into the local buffer.
    fn writes_locally(&self) -> bool {
        matches!(
            self,
            SendOp::Read(_) | SendOp::CompareAndSwap { .. } | SendOp::FetchAndAdd { .. }
        )
    }
}

/// How a send-queue request is posted, beyond its operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags {
    /// Ask for a completion. The last free slot of the queue is signaled whatever
    /// this says, so that the queue always drains.
    pub signaled: bool,
    /// Start only after the earlier READs and atomics of this queue pair finished
    /// (`IBV_SEND_FENCE`).
    pub fenced: bool,
    /// Copy the payload into the request when posting (`IBV_SEND_INLINE`), for
    /// payloads up to the queue pair's `max_inline_data`. The buffer is still held
    /// until the completion, like every other. SENDs and WRITEs only: a READ or an
    /// atomic with it is refused.
    pub inline: bool,
}

impl SendFlags {
    /// Signaled, nothing else.
    pub const SIGNALED: SendFlags = SendFlags {
        signaled: true,
        fenced: false,
        inline: false,
    };
}

/// A post that failed: the reason, and the buffer when the device never got it.
#[derive(Debug)]
pub struct PostError {
    /// The buffer, untouched by the device; `None` when the provider had queued
    /// the request before it failed ([`Error::Queued`]): the request may still run,
    /// so the queue pair keeps the buffer, and [`LeasedQp::complete`] gives it back
    /// with the request's completion (or the queue pair's drop frees it after the
    /// queue pair is destroyed).
    pub lease: Option<Lease>,
    /// Why.
    pub error: Error,
}

impl PostError {
    /// The error of a post that failed holding `held` (`None`: the ring kept it).
    fn of((held, error): (Option<Held>, Error)) -> Self {
        PostError {
            lease: held.map(|h| h.into_lease().expect("a lease was posted")),
            error,
        }
    }
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Bit 63 of the verbs `wr_id`: posted by a `LeasedQp` (reserved by the raw posts'
/// contract).
pub(crate) const LEASED_BIT: u64 = 1 << 63;
/// Bit 62: a receive.
const RECV_BIT: u64 = 1 << 62;
/// Bits 40..62: the owner's tag, never reused on the queue its request completes
/// on ([`crate::CompletionQueue`] hands out [`OWNERS`] of them).
const OWNER_SHIFT: u32 = 40;
/// Owner tags a completion queue hands out, at most.
const OWNERS: u64 = 1 << 22;

/// The next owner tag of a queue whose tags so far `taken` counts: each once, in
/// order, and `None` once all [`OWNERS`] are out.
pub(crate) fn take_owner(taken: &AtomicU64) -> Option<u64> {
    taken
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < OWNERS).then_some(n + 1)
        })
        .ok()
}

/// A queue pair that keeps each posted buffer until its completion: ready to send
/// (`LeasedQp<Rts>`, the default), or not connected yet (`LeasedQp<Init>`, made by
/// [`LeasedQp::before_rts`]), taking only receives.
///
/// Dropping it destroys the queue pair first (the device stops), then releases the
/// buffers still outstanding.
pub struct LeasedQp<S: State = Rts> {
    // Field order matters: the QP is destroyed before the leases are dropped.
    qp: QueuePair<S>,
    send: Ring,
    recv: Ring,
    /// The common part of every `wr_id` it posts.
    bases: Bases,
}

/// Lease bit, kind bit and owner tag of a `LeasedQp`'s sends and of its receives:
/// each tag is its completion queue's, so that a completion a dropped `LeasedQp`
/// left on that queue names no other.
#[derive(Clone, Copy)]
struct Bases {
    send: u64,
    recv: u64,
}

impl LeasedQp<Rts> {
    /// Wraps `qp`; the rings hold as many requests as the queues were created with.
    ///
    /// Refused, with the queue pair back: UD queue pairs (a SEND needs an address
    /// handle, which [`SendOp`] does not carry), queue pairs that take receives from
    /// a shared receive queue (receives posted there are not this value's to
    /// release), queues deeper than 2^20 requests, and queue pairs whose completion
    /// queue has served 2^22 `LeasedQp`s already (each gets tags of its own there,
    /// so that a completion a dropped one left behind releases nothing of another).
    pub fn new(qp: QueuePair<Rts>) -> std::result::Result<Self, TransitionError<QueuePair<Rts>>> {
        Self::wrap(qp)
    }

    /// Posts `op` on `range` of the leased buffer. The buffer comes back from
    /// [`LeasedQp::complete`] (or with the error, if nothing was posted).
    pub fn post_send(
        &mut self,
        wr_id: u64,
        op: SendOp,
        lease: Lease,
        range: Range<usize>,
        signaled: bool,
    ) -> std::result::Result<(), PostError> {
        let flags = SendFlags {
            signaled,
            ..SendFlags::default()
        };
        self.post_send_with(wr_id, op, lease, range, flags)
    }

    /// [`LeasedQp::post_send`] with all of [`SendFlags`]: fenced or inline requests.
    pub fn post_send_with(
        &mut self,
        wr_id: u64,
        op: SendOp,
        lease: Lease,
        range: Range<usize>,
        flags: SendFlags,
    ) -> std::result::Result<(), PostError> {
        if op.writes_locally() && matches!(lease, Lease::Shared(_)) {
            return Err(PostError {
                lease: Some(lease),
                error: Error::InvalidArgument(
                    "this operation writes into the local buffer: lease it exclusively \
                     (Lease::Owned)"
                        .into(),
                ),
            });
        }
        self.post_send_held(wr_id, op, Held::Lease(lease), range, flags)
            .map_err(PostError::of)
    }

    /// Posts `op` on `range` of a region shared by many requests. The device may read
    /// and write it (READs and atomics too); the request holds a clone of `buffer`
    /// until the completion that releases it is handed to [`LeasedQp::complete`],
    /// which gives nothing back for it but [`Released::wr_id`].
    pub fn post_send_device(
        &mut self,
        wr_id: u64,
        op: SendOp,
        buffer: &DeviceRegion,
        range: Range<usize>,
        flags: SendFlags,
    ) -> Result<()> {
        self.post_send_held(wr_id, op, Held::Device(buffer.clone()), range, flags)
            .map_err(|(_, error)| error)
    }

    fn post_send_held(
        &mut self,
        wr_id: u64,
        op: SendOp,
        held: Held,
        range: Range<usize>,
        flags: SendFlags,
    ) -> std::result::Result<(), (Option<Held>, Error)> {
        if flags.inline && op.writes_locally() {
            return Err((
                Some(held),
                Error::InvalidArgument(INLINE_WRITES_LOCALLY.into()),
            ));
        }
        if self.send.free() == 0 {
            let why = "the send queue is full: poll completions and hand them to complete()";
            return Err((Some(held), Error::InvalidArgument(why.into())));
        }
        let tag = self.send.next_tag(self.bases.send);
        let after = self.qp.send_cq().handed();
        // The last free slot is always signaled, so the ring can drain.
        let signaled = flags.signaled || self.send.free() == 1;
        let flags = SendFlags { signaled, ..flags };
        let posted = self.post_send_on(tag, op, held.region(), range, flags);
        match posted {
            Ok(()) => {
                self.send.push(tag, wr_id, held, after);
                Ok(())
            }
            // The device may run it yet: the ring holds the buffer as if posted.
            Err(error) if error.is_queued() => {
                self.send.push(tag, wr_id, held, after);
                Err((None, error))
            }
            Err(error) => Err((Some(held), error)),
        }
    }

    /// Builds and posts `op` on `range` of `region`, tagged `tag`. The caller moves
    /// the buffer into the ring if this succeeds.
    fn post_send_on(
        &self,
        tag: u64,
        op: SendOp,
        region: &MemoryRegion,
        range: Range<usize>,
        flags: SendFlags,
    ) -> Result<()> {
        let mut sge = [region.local(range)?];
        let used = usize::from(!sge[0].is_empty());
        let wr = send_wr(tag, op, &mut sge[..used])?;
        let wr = if flags.signaled { wr.signaled() } else { wr };
        let wr = if flags.fenced { wr.fenced() } else { wr };
        let mut wr = if flags.inline { wr.inline() } else { wr };
        // A queue pair made with `new_ex` for this operation posts through ibv_wr_*.
        let ex = SendOps::of(wr.raw_mut().opcode).is_some_and(|o| self.qp.send_ops().contains(o));
        // SAFETY: the caller moves the buffer into the ring, which hands it back only
        // through `complete` once the device reported this request (or a later one)
        // done, or after the QP is destroyed. The device writes only into exclusive
        // leases and device regions, whose bytes no safe code reaches.
        unsafe {
            match ex {
                true => self.qp.post_send_ex(&mut wr),
                false => self.qp.post_send(&mut wr),
            }
        }
    }
}

impl<S: CanRecv> LeasedQp<S> {
    /// Wraps a queue pair that is not connected yet (INIT or RTR), refused as
    /// [`LeasedQp::new`] refuses, so that receives go up before the peer can send: the
    /// RDMA CM ports post their first receive before `rdma_connect`/`rdma_accept`.
    /// Sends wait for [`LeasedQp::established`].
    pub fn before_rts(
        qp: QueuePair<S>,
    ) -> std::result::Result<Self, TransitionError<QueuePair<S>>> {
        Self::wrap(qp)
    }

    /// Posts a receive into `range` of `region`.
    pub fn post_recv(
        &mut self,
        wr_id: u64,
        region: MemoryRegion,
        range: Range<usize>,
    ) -> std::result::Result<(), PostError> {
        self.post_recv_held(wr_id, Held::Lease(Lease::Owned(region)), range)
            .map_err(PostError::of)
    }

    /// Posts a receive into `range` of a region shared by many requests (overlapping
    /// receives are allowed: the program cannot read the bytes anyway). As
    /// [`LeasedQp::post_send_device`], its completion gives back only
    /// [`Released::wr_id`].
    pub fn post_recv_device(
        &mut self,
        wr_id: u64,
        buffer: &DeviceRegion,
        range: Range<usize>,
    ) -> Result<()> {
        self.post_recv_held(wr_id, Held::Device(buffer.clone()), range)
            .map_err(|(_, error)| error)
    }

    fn post_recv_held(
        &mut self,
        wr_id: u64,
        held: Held,
        range: Range<usize>,
    ) -> std::result::Result<(), (Option<Held>, Error)> {
        if self.recv.free() == 0 {
            let why = "the receive queue is full: wait for completions";
            return Err((Some(held), Error::InvalidArgument(why.into())));
        }
        let tag = self.recv.next_tag(self.bases.recv);
        let after = self.qp.recv_cq().handed();
        let posted = match held.region().local(range) {
            Ok(sge) => {
                let mut sge = [sge];
                let used = usize::from(!sge[0].is_empty());
                let mut wr = RecvWr::new(tag, &mut sge[..used]);
                // SAFETY: as in `post_send_on`; the region is exclusively leased or a
                // device region.
                unsafe { self.qp.post_recv(&mut wr) }
            }
            Err(error) => Err(error),
        };
        match posted {
            Ok(()) => {
                self.recv.push(tag, wr_id, held, after);
                Ok(())
            }
            // As for sends: the device may take it yet.
            Err(error) if error.is_queued() => {
                self.recv.push(tag, wr_id, held, after);
                Err((None, error))
            }
            Err(error) => Err((Some(held), error)),
        }
    }
}

impl LeasedQp<Init> {
    /// Once the RDMA CM connected the queue pair (after `Established` on the active
    /// side, after `accept` on the passive side; see [`crate::cm::established`]): the
    /// same value, ready to send, its receives still posted. A queue pair that is not
    /// in RTS comes back unchanged with the error.
    // The error hands the whole value back, as every queue pair transition does.
    #[allow(clippy::result_large_err)]
    pub fn established(
        self,
    ) -> std::result::Result<LeasedQp<Rts>, TransitionError<LeasedQp<Init>>> {
        let LeasedQp {
            qp,
            send,
            recv,
            bases,
        } = self;
        match crate::cm::established(qp) {
            Ok(qp) => Ok(LeasedQp {
                qp,
                send,
                recv,
                bases,
            }),
            Err(TransitionError { qp, error }) => Err(TransitionError {
                qp: LeasedQp {
                    qp,
                    send,
                    recv,
                    bases,
                },
                error,
            }),
        }
    }
}

impl<S: State> LeasedQp<S> {
    /// Wraps `qp` if `LeasedQp` can own it (see [`LeasedQp::new`]).
    fn wrap(qp: QueuePair<S>) -> std::result::Result<Self, TransitionError<QueuePair<S>>> {
        if let Some(why) = Self::refusal(&qp) {
            return Err(TransitionError {
                qp,
                error: Error::InvalidArgument(why.into()),
            });
        }
        // One queue for both: one tag (the kind bit tells sends from receives).
        let (send_cq, recv_cq) = (qp.send_cq(), qp.recv_cq());
        let tags = if Arc::ptr_eq(send_cq, recv_cq) {
            send_cq.next_owner().map(|t| (t, t))
        } else {
            send_cq.next_owner().zip(recv_cq.next_owner())
        };
        let Some((send, recv)) = tags else {
            let why = format!(
                "a completion queue of this queue pair has served {OWNERS} LeasedQps, \
                 the most it tells apart: create a new completion queue"
            );
            return Err(TransitionError {
                qp,
                error: Error::InvalidArgument(why.into()),
            });
        };
        let caps = qp.caps();
        Ok(LeasedQp {
            send: Ring::new(caps.max_send_wr as usize),
            recv: Ring::new(caps.max_recv_wr as usize),
            bases: Bases {
                send: LEASED_BIT | send << OWNER_SHIFT,
                recv: LEASED_BIT | RECV_BIT | recv << OWNER_SHIFT,
            },
            qp,
        })
    }

    fn refusal(qp: &QueuePair<S>) -> Option<String> {
        let caps = qp.caps();
        if qp.qp_type() == QpType::Ud {
            return Some(
                "LeasedQp takes RC and UC queue pairs: a UD SEND needs an address handle \
                 (post UD sends with QueuePair::post_send and SendWr::ud)"
                    .into(),
            );
        }
        if qp.srq().is_some() {
            return Some(
                "LeasedQp cannot own a queue pair that takes its receives from a shared \
                 receive queue: completions of receives posted there would look like its own"
                    .into(),
            );
        }
        let deepest = caps.max_send_wr.max(caps.max_recv_wr) as u64;
        (deepest > FIELD_MASK + 1).then(|| {
            format!(
                "LeasedQp tracks at most {} requests per queue, not {deepest}",
                FIELD_MASK + 1
            )
        })
    }

    /// The queue pair.
    pub fn qp(&self) -> &QueuePair<S> {
        &self.qp
    }

    /// Requests posted to the send queue and not yet released.
    pub fn outstanding_sends(&self) -> usize {
        self.send.len()
    }

    /// Receives posted and not yet completed.
    pub fn outstanding_recvs(&self) -> usize {
        self.recv.len()
    }

    /// Takes a completion of this QP and gives back the buffers it releases, with the
    /// caller's `wr_id`s, oldest first. A failed completion still releases (the device
    /// is done with the buffer); check `result()` for the status.
    ///
    /// A completion that is not this queue pair's (another queue, another queue
    /// pair's number, a request this `LeasedQp` did not post or already saw complete)
    /// comes back with the reason, so that it can be handed to its owner.
    pub fn complete(
        &mut self,
        completion: Completion,
    ) -> std::result::Result<Released<'_>, Rejected> {
        let origin = Origin {
            cq: Queue::Id(completion.cq_id()),
            qp_num: Some(completion.qp_num()),
            seq: Some(completion.seq()),
        };
        match self.release(completion.wr_id(), origin) {
            Ok((is_recv, left, wr_id)) => {
                let ring = if is_recv {
                    &mut self.recv
                } else {
                    &mut self.send
                };
                Ok(Released { ring, left, wr_id })
            }
            Err(error) => Err(Rejected { error, completion }),
        }
    }

    /// [`LeasedQp::complete`] for a completion of an extended queue, handed in inside
    /// [`CompletionQueue::poll_ex`](crate::CompletionQueue::poll_ex)'s callback, which
    /// hands each polled completion out once and only while it is current. The queue
    /// it came from must be this queue pair's send or receive queue, its queue pair's
    /// number (where the queue reports [`WcFlags::QP_NUM`](crate::WcFlags::QP_NUM))
    /// this one's, and its work request id one this `LeasedQp` posted: it names this
    /// `LeasedQp`, the slot and its generation. A second call for the same completion
    /// is refused: the request is no longer outstanding.
    pub fn complete_ex(&mut self, completion: &ExCompletion<'_>) -> Result<Released<'_>> {
        let origin = Origin {
            cq: Queue::Ex(completion.cq_ex()),
            qp_num: completion.qp_num(),
            seq: None,
        };
        let (is_recv, left, wr_id) = self.release(completion.wr_id(), origin)?;
        let ring = if is_recv {
            &mut self.recv
        } else {
            &mut self.send
        };
        Ok(Released { ring, left, wr_id })
    }

    /// Checks a completion of request `tag` (from `origin`): whether it is a receive,
    /// how many requests it releases and the caller's id of the one it names.
    fn release(&self, tag: u64, origin: Origin) -> Result<(bool, usize, u64)> {
        let is_recv = tag & RECV_BIT != 0;
        let (ring, cq) = if is_recv {
            (&self.recv, self.qp.recv_cq())
        } else {
            (&self.send, self.qp.send_cq())
        };
        let which = if is_recv { "receive" } else { "send" };
        let why = match (origin.cq, origin.qp_num) {
            (Queue::Id(id), _) if id != cq.id() => format!(
                "it was polled from completion queue {id}, not from this queue pair's \
                 {which} queue {}",
                cq.id()
            ),
            (Queue::Ex(ex), _) if cq.ex_raw() != Some(ex) => {
                format!("it was polled from another queue than this queue pair's {which} queue")
            }
            (_, Some(qpn)) if qpn != self.qp.qp_num() => {
                format!("it is QP {qpn:#x}'s, handed to QP {:#x}", self.qp.qp_num())
            }
            _ if tag & !(FIELD_MASK << SLOT_BITS | FIELD_MASK)
                != if is_recv {
                    self.bases.recv
                } else {
                    self.bases.send
                } =>
            {
                format!("work request id {tag:#x} was not posted by this LeasedQp")
            }
            _ => match ring.count_through(tag, origin.seq) {
                Some(left) => return Ok((is_recv, left, ring.wr_id_of(tag))),
                None => format!("work request {tag:#x} is not outstanding (completed already?)"),
            },
        };
        Err(Error::InvalidArgument(
            format!("completion refused: {why}").into(),
        ))
    }
}

/// Where a completion handed to [`LeasedQp::complete`] or
/// [`LeasedQp::complete_ex`] came from.
struct Origin {
    cq: Queue,
    /// Its queue pair's number, where known.
    qp_num: Option<u32>,
    /// Its number among its queue's completions (not for an extended queue's, which
    /// cannot be kept past its poll).
    seq: Option<u64>,
}

/// The queue a completion was polled from.
enum Queue {
    /// A [`Completion`]'s, by [`crate::CompletionQueue::id`].
    Id(u64),
    /// The extended queue of an [`ExCompletion`].
    Ex(*mut crate::sys::ibv_cq_ex),
}

/// The work request of `op` on `sges` (one entry, or none for an empty range: a
/// zero length in an entry means 2 GiB to some devices), tagged `tag`.
fn send_wr<'a>(tag: u64, op: SendOp, sges: &'a mut [LocalSlice<'a>]) -> Result<SendWr<'a>> {
    // Exactly 8 bytes, 8-byte aligned, as verbs define an atomic's local buffer:
    // not left for each device to check.
    let one = |sges: &'a mut [LocalSlice<'a>]| {
        let why = "an atomic's local buffer (its old value lands there) must be 8 bytes, \
                   8-byte aligned";
        let refused = || Error::InvalidArgument(why.into());
        if !matches!(sges, [s] if s.len() == 8 && s.addr() % 8 == 0) {
            return Err(refused());
        }
        <&mut [LocalSlice<'a>; 1]>::try_from(sges).map_err(|_| refused())
    };
    Ok(match op {
        SendOp::Send => SendWr::send(tag, sges),
        SendOp::SendWithImm(imm) => SendWr::send_with_imm(tag, sges, imm),
        SendOp::SendWithInvalidate(rkey) => SendWr::send_with_invalidate(tag, sges, rkey),
        SendOp::Write(remote) => SendWr::rdma_write(tag, sges, remote),
        SendOp::WriteWithImm(remote, imm) => SendWr::rdma_write_with_imm(tag, sges, remote, imm),
        SendOp::Read(remote) => SendWr::rdma_read(tag, sges, remote),
        SendOp::CompareAndSwap {
            remote,
            compare,
            swap,
        } => SendWr::compare_and_swap(tag, one(sges)?, remote, compare, swap),
        SendOp::FetchAndAdd { remote, add } => SendWr::fetch_and_add(tag, one(sges)?, remote, add),
    })
}

/// A completion [`LeasedQp::complete`] refused, handed back with the reason.
#[derive(Debug)]
pub struct Rejected {
    /// The completion, for its owner.
    pub completion: Completion,
    /// Why it was refused.
    pub error: Error,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Rejected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Rejected> for Error {
    fn from(r: Rejected) -> Error {
        r.error
    }
}

/// The buffers one completion released: `(wr_id, lease)`, oldest first. Requests
/// posted on a [`DeviceRegion`] give nothing back but their hold, which is dropped.
pub struct Released<'a> {
    ring: &'a mut Ring,
    left: usize,
    wr_id: u64,
}

impl Released<'_> {
    /// The caller's `wr_id` of the request the completion reports (the newest it
    /// releases), whatever buffer it was posted on.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }
}

impl std::fmt::Debug for Released<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Released")
            .field("wr_id", &self.wr_id)
            .field("left", &self.left)
            .finish()
    }
}

impl Iterator for Released<'_> {
    type Item = (u64, Lease);

    fn next(&mut self) -> Option<(u64, Lease)> {
        while self.left > 0 {
            self.left -= 1;
            let item = self.ring.pop_oldest();
            if let Some((wr_id, Some(lease))) = item.map(|(id, held)| (id, held.into_lease())) {
                return Some((wr_id, lease));
            }
        }
        None
    }
}

impl Drop for Released<'_> {
    /// Releases whatever the caller did not iterate, so the ring stays consistent.
    fn drop(&mut self) {
        for _ in self.by_ref() {}
    }
}

impl<S: State> std::fmt::Debug for LeasedQp<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedQp")
            .field("qp", &self.qp)
            .field("outstanding_sends", &self.send.len())
            .field("outstanding_recvs", &self.recv.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_hands_out_each_owner_tag_once_then_none() {
        let taken = AtomicU64::new(0);
        assert_eq!(take_owner(&taken), Some(0));
        assert_eq!(take_owner(&taken), Some(1));
        taken.store(OWNERS - 2, Ordering::Relaxed);
        assert_eq!(take_owner(&taken), Some(OWNERS - 2));
        assert_eq!(take_owner(&taken), Some(OWNERS - 1));
        for _ in 0..3 {
            assert_eq!(take_owner(&taken), None, "no tag comes round again");
        }
        // The last tag still fits its field of the work request id.
        let last = LEASED_BIT | RECV_BIT | (OWNERS - 1) << OWNER_SHIFT;
        assert_eq!(last >> OWNER_SHIFT & (OWNERS - 1), OWNERS - 1);
        assert_eq!(last & (FIELD_MASK << SLOT_BITS | FIELD_MASK), 0);
    }
}
