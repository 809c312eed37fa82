//! Work requests built on the stack: every opcode, scatter/gather lists, flags and
//! chains, with no allocation. Posting them is `unsafe` (the buffers must outlive the
//! completion); [`crate::lease`] is the safe layer on top.
//!
//! ```no_run
//! # use rdma_safe::*;
//! # fn demo(qp: &QueuePair<rdma_safe::qp::Rts>, mr: &MemoryRegion, peer: RemoteSlice) -> Result<()> {
//! let mut sge = [mr.local(0..4096)?];
//! let mut wr = SendWr::rdma_write(1, &mut sge, peer).signaled();
//! // SAFETY: `mr` stays alive and untouched until the completion of wr 1 is polled.
//! unsafe { qp.post_send(&mut wr)? };
//! # Ok(()) }
//! ```
//!
//! # What a posted request may touch
//!
//! Every raw post's contract (`QueuePair::post_send`, `post_send_raw`,
//! `post_recv`, `post_recv_raw`, `post_send_ex`, `SharedReceiveQueue::post_recv`,
//! the `Endpoint` posts) holds the memory a request names until its completion.
//! That is more than the bytes its entries count:
//! - **An entry of length zero** may mean 2 GiB to a device (mlx4 receives take
//!   it so): post no empty entry, or hold 2 GiB from its address.
//! - **An atomic's entry** receives 8 bytes at its address whatever its length
//!   (mlx5 writes 8): make it exactly 8 bytes, 8-byte aligned.
//! - **What else a request names** stays alive until its completion too: the
//!   memory window and the region of a bind, and the address handle of a UD
//!   send. (A type 1 bind through the safe [`crate::MemoryWindow::bind`] keeps
//!   its region while the window lives; a window dropped before its bind
//!   completes relies on the device refusing a bind of a deallocated window, as
//!   Soft-RoCE does by comparing the whole key.)
//!
//! The safe layer ([`crate::LeasedQp`]) posts no entry for an empty range,
//! refuses atomics whose entry is not 8 aligned bytes, and holds what its
//! requests name.

use crate::ah::AddressHandle;
use crate::error::Result;
use crate::mr::{LocalSlice, RemoteSlice};
use crate::qp::{CanRecv, QueuePair, Rts};
use rdma_verbs_sys as sys;
use std::marker::PhantomData;
use std::ptr;

const _: () = {
    // `LocalSlice` is passed to the device as `ibv_sge`.
    assert!(std::mem::size_of::<LocalSlice<'static>>() == std::mem::size_of::<sys::ibv_sge>());
    assert!(std::mem::align_of::<LocalSlice<'static>>() == std::mem::align_of::<sys::ibv_sge>());
};

/// A send work request (`ibv_send_wr`) borrowing its scatter/gather list.
#[repr(transparent)]
pub struct SendWr<'a> {
    raw: sys::ibv_send_wr,
    _borrows: PhantomData<&'a mut [LocalSlice<'a>]>,
}

impl<'a> SendWr<'a> {
    fn new(wr_id: u64, sges: &'a mut [LocalSlice<'a>], opcode: sys::ibv_wr_opcode) -> Self {
        SendWr {
            raw: sys::ibv_send_wr {
                wr_id,
                next: ptr::null_mut(),
                sg_list: sges.as_mut_ptr().cast(),
                num_sge: sges.len() as i32,
                opcode,
                ..Default::default()
            },
            _borrows: PhantomData,
        }
    }

    /// A request without data (binds, invalidations).
    pub(crate) fn without_sges(wr_id: u64, opcode: sys::ibv_wr_opcode) -> Self {
        Self::new(wr_id, &mut [], opcode)
    }

    pub(crate) fn raw_mut(&mut self) -> &mut sys::ibv_send_wr {
        &mut self.raw
    }

    /// SEND_WITH_INV: a SEND that also invalidates `rkey` at the peer.
    pub fn send_with_invalidate(wr_id: u64, sges: &'a mut [LocalSlice<'a>], rkey: u32) -> Self {
        let mut wr = Self::new(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV);
        wr.raw.__bindgen_anon_1.invalidate_rkey = rkey;
        wr
    }

    /// SEND: the bytes of `sges` go into the peer's next receive.
    pub fn send(wr_id: u64, sges: &'a mut [LocalSlice<'a>]) -> Self {
        Self::new(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_SEND)
    }

    /// SEND with 32 bits of immediate data (given in host order).
    pub fn send_with_imm(wr_id: u64, sges: &'a mut [LocalSlice<'a>], imm: u32) -> Self {
        let mut wr = Self::new(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM);
        wr.raw.__bindgen_anon_1.imm_data = imm.to_be();
        wr
    }

    /// RDMA WRITE of `sges` to `remote`.
    pub fn rdma_write(wr_id: u64, sges: &'a mut [LocalSlice<'a>], remote: RemoteSlice) -> Self {
        let mut wr = Self::new(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        wr.set_rdma(remote);
        wr
    }

    /// RDMA WRITE with immediate data: also consumes a receive at the peer.
    pub fn rdma_write_with_imm(
        wr_id: u64,
        sges: &'a mut [LocalSlice<'a>],
        remote: RemoteSlice,
        imm: u32,
    ) -> Self {
        let mut wr = Self::new(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        wr.set_rdma(remote);
        wr.raw.__bindgen_anon_1.imm_data = imm.to_be();
        wr
    }

    /// RDMA READ of `remote` into `sges`.
    pub fn rdma_read(wr_id: u64, sges: &'a mut [LocalSlice<'a>], remote: RemoteSlice) -> Self {
        let mut wr = Self::new(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_RDMA_READ);
        wr.set_rdma(remote);
        wr
    }

    /// Atomic compare-and-swap of the 8 bytes at `remote`: if they equal `compare`
    /// they become `swap`; the old value lands in `result` (8 bytes).
    pub fn compare_and_swap(
        wr_id: u64,
        result: &'a mut [LocalSlice<'a>; 1],
        remote: RemoteSlice,
        compare: u64,
        swap: u64,
    ) -> Self {
        let mut wr = Self::new(wr_id, result, sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP);
        wr.raw.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: remote.addr,
            compare_add: compare,
            swap,
            rkey: remote.rkey,
        };
        wr
    }

    /// Atomic fetch-and-add of `add` to the 8 bytes at `remote`; the old value lands
    /// in `result` (8 bytes).
    pub fn fetch_and_add(
        wr_id: u64,
        result: &'a mut [LocalSlice<'a>; 1],
        remote: RemoteSlice,
        add: u64,
    ) -> Self {
        let mut wr = Self::new(
            wr_id,
            result,
            sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
        );
        wr.raw.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: remote.addr,
            compare_add: add,
            swap: 0,
            rkey: remote.rkey,
        };
        wr
    }

    fn set_rdma(&mut self, remote: RemoteSlice) {
        self.raw.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
    }

    fn flag(mut self, flag: sys::ibv_send_flags) -> Self {
        self.raw.send_flags |= flag.0;
        self
    }

    /// Generate a completion for this request (needed unless the QP has `sq_sig_all`).
    pub fn signaled(self) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_SIGNALED)
    }

    /// Wait for earlier RDMA READs and atomics before this request starts.
    pub fn fenced(self) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_FENCE)
    }

    /// Wake a peer that asked for solicited events only.
    pub fn solicited(self) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_SOLICITED)
    }

    /// Copy the payload into the request at post time (up to `max_inline_data`): the
    /// buffer is free again as soon as the post returns and needs no lkey.
    ///
    /// For SENDs and WRITEs only. On a READ or an atomic, verbs leave it undefined,
    /// and Soft-RoCE takes the inlined bytes as the scatter list the reply is
    /// written to, wherever they point in the protection domain: a raw post of
    /// such a request breaks its contract (`QueuePair::post_send`).
    pub fn inline(self) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_INLINE)
    }

    /// Addresses a UD peer: its address handle, QP number and Q_Key.
    pub fn to_ud(mut self, ah: &'a AddressHandle, remote_qpn: u32, qkey: u32) -> Self {
        self.raw.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey: qkey,
        };
        self
    }

    /// Chains `next` after this request: both are posted by one call.
    pub fn chain(&mut self, next: &'a mut SendWr<'a>) {
        self.raw.next = &mut next.raw;
    }

    /// The work request id.
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    /// The raw request.
    pub fn as_raw(&mut self) -> *mut sys::ibv_send_wr {
        &mut self.raw
    }
}

/// A receive work request (`ibv_recv_wr`) borrowing its scatter/gather list.
#[repr(transparent)]
pub struct RecvWr<'a> {
    raw: sys::ibv_recv_wr,
    _borrows: PhantomData<&'a mut [LocalSlice<'a>]>,
}

impl<'a> RecvWr<'a> {
    /// A receive into `sges`.
    pub fn new(wr_id: u64, sges: &'a mut [LocalSlice<'a>]) -> Self {
        RecvWr {
            raw: sys::ibv_recv_wr {
                wr_id,
                next: ptr::null_mut(),
                sg_list: sges.as_mut_ptr().cast(),
                num_sge: sges.len() as i32,
            },
            _borrows: PhantomData,
        }
    }

    /// Chains `next` after this request.
    pub fn chain(&mut self, next: &'a mut RecvWr<'a>) {
        self.raw.next = &mut next.raw;
    }

    /// The raw request.
    pub fn as_raw(&mut self) -> *mut sys::ibv_recv_wr {
        &mut self.raw
    }
}

impl QueuePair<Rts> {
    /// Posts `wr` and everything chained to it.
    ///
    /// # Safety
    /// Every buffer named by the scatter/gather lists must stay allocated, registered
    /// and unwritten by the program (unread, for READ and atomic targets) until the
    /// completion of its request, or of a later signaled request, has been polled.
    /// An address handle or memory window a request names must be of this queue
    /// pair's protection domain (the driver takes it for its own). Request ids with
    /// bit 63 set are reserved for [`crate::LeasedQp`]. Only SENDs and WRITEs may be
    /// inline ([`SendWr::inline`]). Window binds and local invalidations go on RC
    /// and UC queue pairs only (mlx5 reads a UD request's address handle, which
    /// they have not). A failure may still have queued the requests
    /// ([`crate::Error::Queued`]: see `post_send_raw`). Empty entries, atomics'
    /// entries, windows and address handles: see [what a posted request may
    /// touch](crate::wr#what-a-posted-request-may-touch).
    pub unsafe fn post_send(&self, wr: &mut SendWr<'_>) -> Result<()> {
        // SAFETY: the request is well-formed by construction; the caller keeps the
        // buffers alive.
        unsafe { self.post_send_raw(wr.as_raw()) }
    }
}

impl<S: CanRecv> QueuePair<S> {
    /// Posts `wr` and everything chained to it.
    ///
    /// # Safety
    /// The buffers must stay allocated, registered and unread until the completion
    /// has been polled (or the QP was reset or destroyed). Request ids with bit 63 set
    /// are reserved for [`crate::LeasedQp`]. An empty entry may mean 2 GiB: see
    /// [what a posted request may touch](crate::wr#what-a-posted-request-may-touch).
    pub unsafe fn post_recv(&self, wr: &mut RecvWr<'_>) -> Result<()> {
        // SAFETY: a `RecvWr` is well-formed by construction (its lists point into
        // registered regions it borrows); the caller keeps the buffers alive and
        // unread until the completion.
        unsafe { self.post_recv_raw(wr.as_raw()) }
    }
}
