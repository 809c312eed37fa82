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
//! Send-queue completions arrive in posting order, so one signaled completion also
//! releases the unsignaled requests posted before it. When only one free slot is left a
//! request is signaled whatever the caller asked, so the queue always drains.
//! Steady-state posting and completing allocate nothing.
//!
//! # Why a completion cannot be forged
//! [`LeasedQp::complete`] takes a [`Completion`], which only
//! [`CompletionQueue::poll_completions`](crate::CompletionQueue::poll_completions)
//! makes, once per polled entry, tagged with its queue's never-reused id. It must come
//! from this queue pair's send or receive CQ, name this queue pair's number, and carry
//! a work request id this `LeasedQp` posted and has not yet seen completed: bit 63
//! (reserved for `LeasedQp` by the raw posts' contract), a tag unique to this
//! `LeasedQp`, the slot's generation and the slot itself. Queue pairs with a shared
//! receive queue and UD queue pairs (whose SENDs need an address handle) are refused.

use crate::completion::Completion;
use crate::error::Error;
use crate::mr::{MemoryRegion, RemoteSlice};
use crate::qp::{QpType, QueuePair, Rts, TransitionError};
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

impl SendOp {
    /// True when the device writes into the local buffer.
    fn writes_locally(&self) -> bool {
        matches!(
            self,
            SendOp::Read(_) | SendOp::CompareAndSwap { .. } | SendOp::FetchAndAdd { .. }
        )
    }
}

/// A post that did not happen: the buffer comes back with the reason.
#[derive(Debug)]
pub struct PostError {
    /// The buffer, untouched by the device.
    pub lease: Lease,
    /// Why.
    pub error: Error,
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

/// One outstanding request: the verbs `wr_id` it was posted with, the caller's id
/// and the buffer.
struct Slot<T> {
    tag: u64,
    wr_id: u64,
    lease: T,
}

/// Slots of outstanding requests, in posting order (a ring).
struct Ring<T = Lease> {
    slots: Box<[Option<Slot<T>>]>,
    /// Oldest outstanding slot.
    head: usize,
    /// Outstanding requests.
    len: usize,
    /// Requests ever posted: the generation part of the next tag.
    posted: u64,
}

impl<T> Ring<T> {
    fn new(capacity: usize) -> Self {
        Ring {
            slots: (0..capacity.max(1)).map(|_| None).collect(),
            head: 0,
            len: 0,
            posted: 0,
        }
    }

    fn free(&self) -> usize {
        self.slots.len() - self.len
    }

    fn next_slot(&self) -> usize {
        (self.head + self.len) % self.slots.len()
    }

    /// The verbs `wr_id` of the next post: `base` (lease bit, kind bit, owner tag),
    /// the generation and the slot.
    fn next_tag(&self, base: u64) -> u64 {
        let generation = self.posted & FIELD_MASK;
        base | generation << SLOT_BITS | self.next_slot() as u64
    }

    fn push(&mut self, tag: u64, wr_id: u64, lease: T) {
        let slot = self.next_slot();
        self.slots[slot] = Some(Slot { tag, wr_id, lease });
        self.len += 1;
        self.posted += 1;
    }

    /// Number of slots from the head up to and including the one `tag` names, if
    /// that slot is outstanding and was posted with exactly this tag.
    fn count_through(&self, tag: u64) -> Option<usize> {
        let slot = (tag & FIELD_MASK) as usize;
        let posted = self.slots.get(slot)?.as_ref()?;
        if posted.tag != tag {
            return None;
        }
        let n = (slot + self.slots.len() - self.head) % self.slots.len() + 1;
        (n <= self.len).then_some(n)
    }
}

/// Bit 63 of the verbs `wr_id`: posted by a `LeasedQp` (reserved by the raw posts'
/// contract).
const LEASED_BIT: u64 = 1 << 63;
/// Bit 62: a receive.
const RECV_BIT: u64 = 1 << 62;
/// Bits 40..62: the owner's tag, unique among the last 4 million `LeasedQp`s.
const OWNER_SHIFT: u32 = 40;
/// Bits 20..40 the generation, bits 0..20 the slot.
const SLOT_BITS: u32 = 20;
/// The largest value of the slot and generation fields.
const FIELD_MASK: u64 = (1 << SLOT_BITS) - 1;
/// The next owner tag.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(0);

/// A ready-to-send queue pair that keeps each posted buffer until its completion.
///
/// Dropping it destroys the queue pair first (the device stops), then releases the
/// buffers still outstanding.
pub struct LeasedQp {
    // Field order matters: the QP is destroyed before the leases are dropped.
    qp: QueuePair<Rts>,
    send: Ring,
    recv: Ring,
    /// Lease bit and owner tag, the common part of every `wr_id` it posts.
    base: u64,
}

impl LeasedQp {
    /// Wraps `qp`; the rings hold as many requests as the queues were created with.
    ///
    /// Refused, with the queue pair back: UD queue pairs (a SEND needs an address
    /// handle, which [`SendOp`] does not carry), queue pairs that take receives from
    /// a shared receive queue (receives posted there are not this value's to
    /// release), and queues deeper than 2^20 requests.
    pub fn new(qp: QueuePair<Rts>) -> std::result::Result<Self, TransitionError<QueuePair<Rts>>> {
        if let Some(why) = Self::refusal(&qp) {
            return Err(TransitionError {
                qp,
                error: Error::InvalidArgument(why.into()),
            });
        }
        let caps = qp.caps();
        let owner = NEXT_OWNER.fetch_add(1, Ordering::Relaxed) & ((1 << 22) - 1);
        Ok(LeasedQp {
            send: Ring::new(caps.max_send_wr as usize),
            recv: Ring::new(caps.max_recv_wr as usize),
            base: LEASED_BIT | owner << OWNER_SHIFT,
            qp,
        })
    }

    fn refusal(qp: &QueuePair<Rts>) -> Option<String> {
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
    pub fn qp(&self) -> &QueuePair<Rts> {
        &self.qp
    }

    /// Requests posted to the send queue and not yet released.
    pub fn outstanding_sends(&self) -> usize {
        self.send.len
    }

    /// Receives posted and not yet completed.
    pub fn outstanding_recvs(&self) -> usize {
        self.recv.len
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
        if op.writes_locally() && matches!(lease, Lease::Shared(_)) {
            return Err(PostError {
                lease,
                error: Error::InvalidArgument(
                    "this operation writes into the local buffer: lease it exclusively \
                     (Lease::Owned)"
                        .into(),
                ),
            });
        }
        if self.send.free() == 0 {
            return Err(PostError {
                lease,
                error: Error::InvalidArgument(
                    "the send queue is full: poll completions and hand them to complete()".into(),
                ),
            });
        }
        let slot = self.send.next_tag(self.base);
        // The last free slot is always signaled, so the ring can drain.
        let signaled = signaled || self.send.free() == 1;
        let posted = {
            let region = lease.region();
            let mut sge = match region.local(range) {
                Ok(sge) => [sge],
                Err(error) => return Err(PostError { lease, error }),
            };
            let wr = match op {
                SendOp::Send => SendWr::send(slot, &mut sge),
                SendOp::SendWithImm(imm) => SendWr::send_with_imm(slot, &mut sge, imm),
                SendOp::Write(remote) => SendWr::rdma_write(slot, &mut sge, remote),
                SendOp::WriteWithImm(remote, imm) => {
                    SendWr::rdma_write_with_imm(slot, &mut sge, remote, imm)
                }
                SendOp::Read(remote) => SendWr::rdma_read(slot, &mut sge, remote),
                SendOp::CompareAndSwap {
                    remote,
                    compare,
                    swap,
                } => SendWr::compare_and_swap(slot, &mut sge, remote, compare, swap),
                SendOp::FetchAndAdd { remote, add } => {
                    SendWr::fetch_and_add(slot, &mut sge, remote, add)
                }
            };
            let mut wr = if signaled { wr.signaled() } else { wr };
            // SAFETY: the buffer is moved into the ring below and only handed back by
            // `complete` once the device reported this request (or a later one) done,
            // or after the QP is destroyed; writes go only to exclusive leases.
            unsafe { self.qp.post_send(&mut wr) }
        };
        match posted {
            Ok(()) => {
                self.send.push(slot, wr_id, lease);
                Ok(())
            }
            Err(error) => Err(PostError { lease, error }),
        }
    }

    /// Posts a receive into `range` of `region`.
    pub fn post_recv(
        &mut self,
        wr_id: u64,
        region: MemoryRegion,
        range: Range<usize>,
    ) -> std::result::Result<(), PostError> {
        let lease = Lease::Owned(region);
        if self.recv.free() == 0 {
            return Err(PostError {
                lease,
                error: Error::InvalidArgument(
                    "the receive queue is full: wait for completions".into(),
                ),
            });
        }
        let slot = self.recv.next_tag(self.base | RECV_BIT);
        let posted = {
            let mut sge = match lease.region().local(range) {
                Ok(sge) => [sge],
                Err(error) => return Err(PostError { lease, error }),
            };
            let mut wr = RecvWr::new(slot, &mut sge);
            // SAFETY: as in `post_send`; the region is exclusively leased.
            unsafe { self.qp.post_recv(&mut wr) }
        };
        match posted {
            Ok(()) => {
                self.recv.push(slot, wr_id, lease);
                Ok(())
            }
            Err(error) => Err(PostError { lease, error }),
        }
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
        let tag = completion.wr_id();
        let is_recv = tag & RECV_BIT != 0;
        let (ring, cq) = if is_recv {
            (&mut self.recv, self.qp.recv_cq())
        } else {
            (&mut self.send, self.qp.send_cq())
        };
        let why = if completion.cq_id() != cq.id() {
            format!(
                "it was polled from completion queue {}, not from this queue pair's {} queue {}",
                completion.cq_id(),
                if is_recv { "receive" } else { "send" },
                cq.id()
            )
        } else if completion.qp_num() != self.qp.qp_num() {
            format!(
                "it is QP {:#x}'s, handed to QP {:#x}",
                completion.qp_num(),
                self.qp.qp_num()
            )
        } else if tag & !(RECV_BIT | FIELD_MASK << SLOT_BITS | FIELD_MASK) != self.base {
            format!("work request id {tag:#x} was not posted by this LeasedQp")
        } else {
            match ring.count_through(tag) {
                Some(left) => return Ok(Released { ring, left }),
                None => format!("work request {tag:#x} is not outstanding (completed already?)"),
            }
        };
        Err(Rejected {
            error: Error::InvalidArgument(format!("completion refused: {why}").into()),
            completion,
        })
    }
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

/// The buffers one completion released: `(wr_id, lease)`, oldest first.
pub struct Released<'a> {
    ring: &'a mut Ring,
    left: usize,
}

impl std::fmt::Debug for Released<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Released")
            .field("left", &self.left)
            .finish()
    }
}

impl Iterator for Released<'_> {
    type Item = (u64, Lease);

    fn next(&mut self) -> Option<(u64, Lease)> {
        if self.left == 0 {
            return None;
        }
        let ring = &mut *self.ring;
        let item = ring.slots[ring.head].take();
        ring.head = (ring.head + 1) % ring.slots.len();
        ring.len -= 1;
        self.left -= 1;
        item.map(|slot| (slot.wr_id, slot.lease))
    }
}

impl Drop for Released<'_> {
    /// Releases whatever the caller did not iterate, so the ring stays consistent.
    fn drop(&mut self) {
        for _ in self.by_ref() {}
    }
}

impl std::fmt::Debug for LeasedQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedQp")
            .field("qp", &self.qp)
            .field("outstanding_sends", &self.send.len)
            .field("outstanding_recvs", &self.recv.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_counts_through_wrapping_slots_with_exact_tags() {
        let mut r = Ring::<()>::new(4);
        let base = LEASED_BIT | 5 << OWNER_SHIFT;
        let mut tags = Vec::new();
        for i in 0..3 {
            let tag = r.next_tag(base);
            tags.push(tag);
            r.push(tag, i, ());
        }
        assert_eq!(r.count_through(tags[0]), Some(1));
        assert_eq!(r.count_through(tags[2]), Some(3));
        assert_eq!(
            r.count_through(tags[2] ^ 1 << SLOT_BITS),
            None,
            "another generation"
        );
        assert_eq!(r.count_through(base | 3), None, "slot 3 is free");
        assert_eq!(r.count_through(base | 9), None, "out of range");
        // Release two, then wrap: slot 0 comes round again with a new generation.
        r.head = 2;
        r.len = 1;
        r.slots[0] = None;
        r.slots[1] = None;
        let t3 = r.next_tag(base);
        r.push(t3, 3, ());
        let t4 = r.next_tag(base);
        r.push(t4, 4, ());
        assert_eq!(t4 & FIELD_MASK, 0, "slot 0 again");
        assert_ne!(t4, tags[0], "a new generation");
        assert_eq!(r.count_through(tags[0]), None, "the stale tag of slot 0");
        assert_eq!(r.count_through(t4), Some(3));
        assert_eq!(r.free(), 1);
    }
}
