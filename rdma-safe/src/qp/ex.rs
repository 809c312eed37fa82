//! libibverbs' extended send interface (`ibv_qp_ex`, the `ibv_wr_*` verbs): a
//! queue pair made with [`QueuePair::new_ex`] names the operations it will post,
//! and [`QueuePair::post_send_ex`] posts the same [`SendWr`]s as
//! [`QueuePair::post_send`] through `ibv_wr_start`, one `ibv_wr_<opcode>` and
//! `ibv_wr_set_sge_list` (or `ibv_wr_set_inline_data_list`) a request, and
//! `ibv_wr_complete`. The whole chain is checked before `ibv_wr_start`, so a
//! refused request posts nothing, and the provider's send-queue lock, which it
//! holds from `ibv_wr_start` to `ibv_wr_complete`, is never held past the call.
//!
//! ```no_run
//! # use rdma_safe::*;
//! # use rdma_safe::qp::{QpConfig, SendOps};
//! # fn demo(pd: &std::sync::Arc<ProtectionDomain>, cq: &std::sync::Arc<CompletionQueue>) -> Result<()> {
//! let qp = QueuePair::new_ex(pd, &QpConfig::rc(cq), SendOps::SEND | SendOps::RDMA_WRITE)?;
//! assert!(qp.send_ops().contains(SendOps::SEND));
//! # Ok(()) }
//! ```

use super::{Inner, QpType, QueuePair, Reset, Rts, State};
use crate::error::{check, Error, Result};
use crate::pd::ProtectionDomain;
use crate::wr::SendWr;
use crate::QpConfig;
use rdma_verbs_sys as sys;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

/// The operations a queue pair made with [`QueuePair::new_ex`] may post
/// (`ibv_qp_create_send_ops_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendOps(u64);

impl SendOps {
    /// None: the queue pair posts only through `ibv_post_send`.
    pub const NONE: SendOps = SendOps(0);
    /// RDMA WRITE.
    pub const RDMA_WRITE: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE);
    /// RDMA WRITE with immediate data.
    pub const RDMA_WRITE_WITH_IMM: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM);
    /// SEND.
    pub const SEND: SendOps = Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND);
    /// SEND with immediate data.
    pub const SEND_WITH_IMM: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM);
    /// RDMA READ.
    pub const RDMA_READ: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ);
    /// Atomic compare and swap.
    pub const ATOMIC_CMP_AND_SWP: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP);
    /// Atomic fetch and add.
    pub const ATOMIC_FETCH_AND_ADD: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD);
    /// Local invalidation.
    pub const LOCAL_INV: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_LOCAL_INV);
    /// SEND that invalidates a key at the peer.
    pub const SEND_WITH_INV: SendOps =
        Self::op(sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV);

    const fn op(flag: sys::ibv_qp_create_send_ops_flags) -> SendOps {
        SendOps(flag.0 as u64)
    }

    /// The raw bits.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// True when every operation of `other` is in `self`.
    pub fn contains(self, other: SendOps) -> bool {
        self.0 & other.0 == other.0
    }

    /// The operation that posts `opcode`, if the extended interface has one here.
    fn of(opcode: sys::ibv_wr_opcode) -> Option<SendOps> {
        use sys::ibv_wr_opcode as O;
        Some(match opcode {
            O::IBV_WR_RDMA_WRITE => Self::RDMA_WRITE,
            O::IBV_WR_RDMA_WRITE_WITH_IMM => Self::RDMA_WRITE_WITH_IMM,
            O::IBV_WR_SEND => Self::SEND,
            O::IBV_WR_SEND_WITH_IMM => Self::SEND_WITH_IMM,
            O::IBV_WR_RDMA_READ => Self::RDMA_READ,
            O::IBV_WR_ATOMIC_CMP_AND_SWP => Self::ATOMIC_CMP_AND_SWP,
            O::IBV_WR_ATOMIC_FETCH_AND_ADD => Self::ATOMIC_FETCH_AND_ADD,
            O::IBV_WR_LOCAL_INV => Self::LOCAL_INV,
            O::IBV_WR_SEND_WITH_INV => Self::SEND_WITH_INV,
            _ => return None,
        })
    }
}

impl std::ops::BitOr for SendOps {
    type Output = SendOps;
    fn bitor(self, rhs: SendOps) -> SendOps {
        SendOps(self.0 | rhs.0)
    }
}

/// Inline payloads of one request at most (gathered from its SGEs).
const MAX_INLINE_PIECES: usize = 16;

impl QueuePair<Reset> {
    /// Creates a queue pair that can also post through the extended interface
    /// (`ibv_create_qp_ex` with `send_ops_flags`), for the operations `ops`.
    pub fn new_ex(pd: &Arc<ProtectionDomain>, config: &QpConfig, ops: SendOps) -> Result<Self> {
        crate::context::check_provider_locks()?;
        config.check_context(pd, "ibv_create_qp_ex")?;

        let base = config.to_raw();
        let mut init = sys::ibv_qp_init_attr_ex {
            send_cq: base.send_cq,
            recv_cq: base.recv_cq,
            srq: base.srq,
            cap: base.cap,
            qp_type: base.qp_type,
            sq_sig_all: base.sq_sig_all,
            comp_mask: (sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
                | sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0),
            pd: pd.as_raw(),
            send_ops_flags: ops.bits(),
            ..Default::default()
        };
        // SAFETY: the context, PD and CQs are alive and of one device context
        // (checked); `init` is fully initialised and lives across the call.
        let raw = unsafe { sys::ibv_create_qp_ex(pd.context().as_raw(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::last("ibv_create_qp_ex").with_hint(
                "does the device support these send operations through ibv_wr_*, and are \
                 the queue depths within its limits?",
            )
        })?;
        Ok(QueuePair {
            inner: Inner {
                raw,
                qp_type: config.qp_type,
                pd: pd.clone(),
                send_cq: config.send_cq.clone(),
                recv_cq: config.recv_cq.clone(),
                srq: config.srq.clone(),
                caps: init.cap,
                // Every operation's bit is below 2^16 (the constants above).
                send_ops: ops.0 as u16,
            },
            _state: PhantomData,
        })
    }
}

impl<S: State> QueuePair<S> {
    /// The operations [`QueuePair::post_send_ex`] may post ([`SendOps::NONE`]
    /// unless made with [`QueuePair::new_ex`]).
    pub fn send_ops(&self) -> SendOps {
        SendOps(u64::from(self.inner.send_ops))
    }
}

impl QueuePair<Rts> {
    /// Posts a chain of send work requests through the extended interface
    /// (`ibv_wr_start` .. `ibv_wr_complete`), as [`QueuePair::post_send`] posts
    /// them through `ibv_post_send`. Every request's operation must be among
    /// [`QueuePair::send_ops`], else nothing is posted and the error says which.
    /// Memory-window binds are not posted this way.
    ///
    /// # Safety
    /// As for [`QueuePair::post_send`]: every buffer a request names stays
    /// allocated, registered and untouched until its completion has been polled,
    /// and the bit-63 work request ids are [`crate::LeasedQp`]'s. A failure of
    /// `ibv_wr_complete` on Soft-RoCE (its doorbell) may have queued the whole
    /// chain: [`Error::Queued`] says so, as for `post_send`.
    pub unsafe fn post_send_ex(&self, wr: &mut SendWr<'_>) -> Result<()> {
        let first: *mut sys::ibv_send_wr = wr.raw_mut();
        // SAFETY: the chain is valid for the call (the caller's contract).
        unsafe { self.check_chain(first) }?;
        // SAFETY: made by `new_ex` (send_ops is not NONE, checked above), so the QP
        // is embedded in an `ibv_qp_ex`.
        let qpx = unsafe { sys::ibv_qp_to_qp_ex(self.inner.raw.as_ptr()) };
        // SAFETY: a live extended QP; the provider locks its send queue until the
        // complete or abort below, both reached on every path.
        unsafe { sys::ibv_wr_start(qpx) };
        let ud = self.inner.qp_type == QpType::Ud;
        let mut next = first;
        while !next.is_null() {
            // SAFETY: `next` is a request of the checked chain.
            let w = unsafe { &*next };
            // SAFETY: `qpx` is between start and complete; `w` passed the checks.
            unsafe { build(qpx, w, ud) };
            next = w.next;
        }
        // SAFETY: as for the start.
        let ret = unsafe { sys::ibv_wr_complete(qpx) };
        check("ibv_wr_complete", ret).map_err(|e| match e {
            // Soft-RoCE rings its doorbell with a write(2) after making the requests
            // visible: a failure there may leave them queued. EINVAL is an error
            // it recorded while building, before anything was visible.
            Error::Verb { verb, source, .. }
                if self.send_cq().maybe_soft_roce()
                    && source.raw_os_error() != Some(libc::EINVAL) =>
            {
                Error::Queued { verb, source }
            }
            e => e.with_hint("a work request is invalid for this QP (SGE count, inline size)"),
        })
    }

    /// Refuses a chain with an operation this queue pair was not made for, a
    /// memory-window bind, or an inline request of more pieces than it gathers.
    ///
    /// # Safety
    /// `first` starts a valid chain.
    unsafe fn check_chain(&self, first: *mut sys::ibv_send_wr) -> Result<()> {
        let ops = self.send_ops();
        if ops == SendOps::NONE {
            return Err(Error::InvalidArgument(
                "post_send_ex: this queue pair was not made with QueuePair::new_ex".into(),
            ));
        }
        let mut next = first;
        while !next.is_null() {
            // SAFETY: a request of the valid chain.
            let w = unsafe { &*next };
            let Some(op) = SendOps::of(w.opcode) else {
                return Err(Error::InvalidArgument(
                    format!(
                        "post_send_ex: {:?} is not posted through ibv_wr_* here",
                        w.opcode
                    )
                    .into(),
                ));
            };
            if !ops.contains(op) {
                return Err(Error::InvalidArgument(
                    format!(
                        "post_send_ex: the queue pair was not made for {:?} (SendOps {:#x})",
                        w.opcode,
                        ops.bits()
                    )
                    .into(),
                ));
            }
            let inline = w.send_flags & sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0;
            if (inline && w.num_sge as usize > MAX_INLINE_PIECES) || w.num_sge < 0 {
                return Err(Error::InvalidArgument(
                    format!("post_send_ex: {} SGEs in one request", w.num_sge).into(),
                ));
            }
            // SAFETY: a UD request's union holds its address (as ibv_post_send reads it).
            if self.inner.qp_type == QpType::Ud && unsafe { w.wr.ud.ah.is_null() } {
                return Err(Error::InvalidArgument(
                    "post_send_ex: a UD request without an address handle".into(),
                ));
            }
            next = w.next;
        }
        Ok(())
    }
}

/// Adds one request to the open batch: its id and flags, its operation, its
/// address (on a UD queue pair, `ud`), then its data.
///
/// # Safety
/// `qpx` is between `ibv_wr_start` and `ibv_wr_complete`; `w` passed
/// `check_chain` for this queue pair.
unsafe fn build(qpx: *mut sys::ibv_qp_ex, w: &sys::ibv_send_wr, ud: bool) {
    use sys::ibv_wr_opcode as O;
    // SAFETY: `qpx` is live; these two fields are the caller's to set per request.
    // IBV_SEND_INLINE stays in the flags: Soft-RoCE's kernel half reads the
    // payload from the request only when the flag says it is there.
    unsafe {
        (*qpx).wr_id = w.wr_id;
        (*qpx).wr_flags = w.send_flags;
    }
    // SAFETY: the union fields read are the ones the opcode uses (as
    // ibv_post_send reads them); the QP was made for the opcode (checked).
    unsafe {
        let rdma = w.wr.rdma;
        let imm = w.__bindgen_anon_1.imm_data;
        match w.opcode {
            O::IBV_WR_RDMA_WRITE => sys::ibv_wr_rdma_write(qpx, rdma.rkey, rdma.remote_addr),
            O::IBV_WR_RDMA_WRITE_WITH_IMM => {
                sys::ibv_wr_rdma_write_imm(qpx, rdma.rkey, rdma.remote_addr, imm)
            }
            O::IBV_WR_SEND => sys::ibv_wr_send(qpx),
            O::IBV_WR_SEND_WITH_IMM => sys::ibv_wr_send_imm(qpx, imm),
            O::IBV_WR_SEND_WITH_INV => {
                sys::ibv_wr_send_inv(qpx, w.__bindgen_anon_1.invalidate_rkey)
            }
            O::IBV_WR_RDMA_READ => sys::ibv_wr_rdma_read(qpx, rdma.rkey, rdma.remote_addr),
            O::IBV_WR_ATOMIC_CMP_AND_SWP => {
                let a = w.wr.atomic;
                sys::ibv_wr_atomic_cmp_swp(qpx, a.rkey, a.remote_addr, a.compare_add, a.swap)
            }
            O::IBV_WR_ATOMIC_FETCH_AND_ADD => {
                let a = w.wr.atomic;
                sys::ibv_wr_atomic_fetch_add(qpx, a.rkey, a.remote_addr, a.compare_add)
            }
            O::IBV_WR_LOCAL_INV => sys::ibv_wr_local_inv(qpx, w.__bindgen_anon_1.invalidate_rkey),
            // Refused by check_chain.
            _ => unreachable!("checked before ibv_wr_start"),
        }
    }
    if ud {
        // SAFETY: on a UD queue pair the union holds the address, with a live
        // address handle (checked).
        unsafe {
            let a = w.wr.ud;
            sys::ibv_wr_set_ud_addr(qpx, a.ah, a.remote_qpn, a.remote_qkey);
        }
    }
    let n = w.num_sge.max(0) as usize;
    if matches!(w.opcode, O::IBV_WR_LOCAL_INV) {
        return;
    }
    if w.send_flags & sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
        // SAFETY: the SGEs name the caller's buffers, valid for the call.
        unsafe { set_inline(qpx, w, n) };
    } else {
        // SAFETY: the SGE list has `num_sge` entries (the caller's contract).
        unsafe { sys::ibv_wr_set_sge_list(qpx, n, w.sg_list) };
    }
}

/// Bytes of an inline payload gathered on the stack (more than any device
/// inlines).
const INLINE_GATHER: usize = 4096;

/// Sets an inline payload from the request's SGEs with one
/// `ibv_wr_set_inline_data`: Soft-RoCE's `ibv_wr_set_inline_data_list` before
/// rdma-core 64 sends none of the bytes (it never adds up their length), so the
/// pieces are gathered here first. A payload larger than `INLINE_GATHER`, which
/// no device inlines, is left to the list.
///
/// # Safety
/// `qpx` is between `ibv_wr_start` and `ibv_wr_complete`; `w`'s SGE list has
/// `n` entries whose buffers are valid for the call.
unsafe fn set_inline(qpx: *mut sys::ibv_qp_ex, w: &sys::ibv_send_wr, n: usize) {
    let mut pieces = [sys::ibv_data_buf::default(); MAX_INLINE_PIECES];
    let mut total = 0usize;
    for (i, piece) in pieces.iter_mut().enumerate().take(n) {
        // SAFETY: i < num_sge, inside the request's SGE list.
        let sge = unsafe { &*w.sg_list.add(i) };
        *piece = sys::ibv_data_buf {
            addr: sge.addr as usize as *mut std::ffi::c_void,
            length: sge.length as usize,
        };
        total = total.saturating_add(sge.length as usize);
    }
    if n == 1 {
        // SAFETY: the caller's buffer, copied by this call.
        unsafe { sys::ibv_wr_set_inline_data(qpx, pieces[0].addr, pieces[0].length) };
        return;
    }
    if n == 0 || total > INLINE_GATHER {
        // SAFETY: the pieces name the caller's buffers, copied by this call.
        unsafe { sys::ibv_wr_set_inline_data_list(qpx, n, pieces.as_ptr()) };
        return;
    }
    let mut gathered = [0u8; INLINE_GATHER];
    let mut at = 0;
    for piece in &pieces[..n] {
        // SAFETY: each piece is a caller's buffer of `length` bytes (valid for the
        // call), copied into `gathered`, which has room for all of them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                piece.addr.cast::<u8>(),
                gathered.as_mut_ptr().add(at),
                piece.length,
            )
        };
        at += piece.length;
    }
    // SAFETY: `gathered` holds `at` bytes and lives across the call, which copies.
    unsafe { sys::ibv_wr_set_inline_data(qpx, gathered.as_mut_ptr().cast(), at) };
}
