//! The safe posting layer: a queue pair that holds every buffer it posted until the
//! completion that releases it has been handed back, so no safe code can free, reuse
//! or read a buffer the device may still touch.
//!
//! ```no_run
//! # use rdma_safe::*;
//! # use rdma_safe::lease::{Lease, LeasedQp, SendOp};
//! # fn demo(qp: QueuePair<rdma_safe::qp::Rts>, cq: &CompletionQueue, mr: MemoryRegion,
//! #         peer: RemoteSlice) -> Result<()> {
//! let mut conn = LeasedQp::new(qp);
//! // The region moves in; nobody can touch it while the WRITE may run.
//! conn.post_send(1, SendOp::Write(peer), Lease::Owned(mr), 0..4096, true)
//!     .map_err(|e| e.error)?;
//! let mut wcs = [WorkCompletion::default(); 16];
//! loop {
//!     for wc in cq.poll(&mut wcs)?.iter() {
//!         for (wr_id, lease) in conn.complete(wc)? {
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

use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::mr::{MemoryRegion, RemoteSlice};
use crate::qp::{QueuePair, Rts};
use crate::wr::{RecvWr, SendWr};
use std::ops::Range;
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

/// Slots of outstanding requests, in posting order (a ring).
struct Ring {
    slots: Box<[Option<(u64, Lease)>]>,
    /// Oldest outstanding slot.
    head: usize,
    /// Outstanding requests.
    len: usize,
}

impl Ring {
    fn new(capacity: usize) -> Self {
        Ring {
            slots: (0..capacity.max(1)).map(|_| None).collect(),
            head: 0,
            len: 0,
        }
    }

    fn free(&self) -> usize {
        self.slots.len() - self.len
    }

    fn next_slot(&self) -> usize {
        (self.head + self.len) % self.slots.len()
    }

    fn push(&mut self, wr_id: u64, lease: Lease) {
        let slot = self.next_slot();
        self.slots[slot] = Some((wr_id, lease));
        self.len += 1;
    }

    /// Number of slots from the head up to and including `slot`, if it is outstanding.
    fn count_through(&self, slot: usize) -> Option<usize> {
        let n = (slot + self.slots.len() - self.head) % self.slots.len() + 1;
        (slot < self.slots.len() && n <= self.len).then_some(n)
    }
}

/// Bit of the verbs `wr_id` that marks a receive; the rest is the ring slot.
const RECV_BIT: u64 = 1 << 63;

/// A ready-to-send queue pair that keeps each posted buffer until its completion.
///
/// Dropping it destroys the queue pair first (the device stops), then releases the
/// buffers still outstanding.
pub struct LeasedQp {
    // Field order matters: the QP is destroyed before the leases are dropped.
    qp: QueuePair<Rts>,
    send: Ring,
    recv: Ring,
}

impl LeasedQp {
    /// Wraps `qp`; the rings hold as many requests as the queues were created with.
    pub fn new(qp: QueuePair<Rts>) -> Self {
        let caps = qp.caps();
        LeasedQp {
            send: Ring::new(caps.max_send_wr as usize),
            recv: Ring::new(caps.max_recv_wr as usize),
            qp,
        }
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
        let slot = self.send.next_slot() as u64;
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
                self.send.push(wr_id, lease);
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
        let slot = self.recv.next_slot() as u64;
        let posted = {
            let mut sge = match lease.region().local(range) {
                Ok(sge) => [sge],
                Err(error) => return Err(PostError { lease, error }),
            };
            let mut wr = RecvWr::new(slot | RECV_BIT, &mut sge);
            // SAFETY: as in `post_send`; the region is exclusively leased.
            unsafe { self.qp.post_recv(&mut wr) }
        };
        match posted {
            Ok(()) => {
                self.recv.push(wr_id, lease);
                Ok(())
            }
            Err(error) => Err(PostError { lease, error }),
        }
    }

    /// Takes a completion of this QP and gives back the buffers it releases, with the
    /// caller's `wr_id`s, oldest first. A failed completion still releases (the device
    /// is done with the buffer); check `wc.result()` for the status.
    pub fn complete(&mut self, wc: &WorkCompletion) -> Result<Released<'_>> {
        if wc.qp_num() != self.qp.qp_num() {
            return Err(Error::InvalidArgument(
                format!(
                    "completion of QP {:#x} handed to QP {:#x}",
                    wc.qp_num(),
                    self.qp.qp_num()
                )
                .into(),
            ));
        }
        let is_recv = wc.wr_id() & RECV_BIT != 0;
        let ring = if is_recv {
            &mut self.recv
        } else {
            &mut self.send
        };
        let slot = (wc.wr_id() & !RECV_BIT) as usize;
        let count = ring.count_through(slot).ok_or_else(|| {
            Error::InvalidArgument(
                format!("completion for slot {slot}, which is not outstanding").into(),
            )
        })?;
        Ok(Released { ring, left: count })
    }
}

/// The buffers one completion released: `(wr_id, lease)`, oldest first.
pub struct Released<'a> {
    ring: &'a mut Ring,
    left: usize,
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
        item
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
    fn ring_counts_through_wrapping_slots() {
        let mut r = Ring::new(4);
        assert_eq!(r.count_through(0), None);
        r.head = 3;
        r.len = 3; // slots 3, 0, 1
        assert_eq!(r.count_through(3), Some(1));
        assert_eq!(r.count_through(0), Some(2));
        assert_eq!(r.count_through(1), Some(3));
        assert_eq!(r.count_through(2), None, "slot 2 is free");
        assert_eq!(r.count_through(9), None, "out of range");
        assert_eq!(r.next_slot(), 2);
        assert_eq!(r.free(), 1);
    }
}
