//! libibverbs' extended send interface (`ibv_qp_ex`, the `ibv_wr_*` verbs): a
//! queue pair made with [`QueuePair::new_ex`] names the operations it will post,
//! and [`QueuePair::post_send_ex`] posts the same [`SendWr`]s as
//! [`QueuePair::post_send`] through `ibv_wr_start`, one `ibv_wr_<opcode>` and
//! `ibv_wr_set_sge_list` (or one `ibv_wr_set_inline_data`) a request, and
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

use super::{QpType, QueuePair, Reset, Rts, State};
use crate::error::{check, Error, Result};
use crate::pd::ProtectionDomain;
use crate::wr::SendWr;
use crate::QpConfig;
use rdma_verbs_sys as sys;
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
    pub(crate) fn of(opcode: sys::ibv_wr_opcode) -> Option<SendOps> {
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

// The operations live in a `u16` of the queue pair.
const _: () = assert!(
    (SendOps::RDMA_WRITE.0
        | SendOps::RDMA_WRITE_WITH_IMM.0
        | SendOps::SEND.0
        | SendOps::SEND_WITH_IMM.0
        | SendOps::RDMA_READ.0
        | SendOps::ATOMIC_CMP_AND_SWP.0
        | SendOps::ATOMIC_FETCH_AND_ADD.0
        | SendOps::LOCAL_INV.0
        | SendOps::SEND_WITH_INV.0)
        <= u16::MAX as u64
);

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
        // Every operation's bit is below 2^16 (asserted above).
        let qp = Self::created(raw, pd, config, init.cap, ops.0 as u16);
        // SAFETY: a live QP; the call only reads whether the provider embedded it
        // in an `ibv_qp_ex` (NULL if not), which `post_send_ex` relies on.
        let qpx = unsafe { sys::ibv_qp_to_qp_ex(raw.as_ptr()) };
        // SAFETY: when not NULL, the provider's live `ibv_qp_ex` of this QP.
        let hooks = (!qpx.is_null()).then(|| unsafe { &*qpx });
        if !hooks.is_some_and(|h| has_hooks(h, ops, config.qp_type)) {
            // Dropping `qp` destroys it.
            return Err(Error::InvalidArgument(
                "ibv_create_qp_ex: the provider made a queue pair without the extended \
                 interface for these operations (ibv_qp_to_qp_ex or one of its ibv_wr_* \
                 entry points is NULL)"
                    .into(),
            ));
        }
        Ok(qp)
    }
}

/// Whether the provider installed every `ibv_wr_*` entry point `post_send_ex`
/// may call on a queue pair of `qp_type` made for `ops`.
fn has_hooks(h: &sys::ibv_qp_ex, ops: SendOps, qp_type: QpType) -> bool {
    let base = h.wr_start.is_some()
        && h.wr_complete.is_some()
        && h.wr_abort.is_some()
        && h.wr_set_sge_list.is_some()
        && h.wr_set_inline_data.is_some()
        && (qp_type != QpType::Ud || h.wr_set_ud_addr.is_some());
    let each = [
        (SendOps::RDMA_WRITE, h.wr_rdma_write.is_some()),
        (SendOps::RDMA_WRITE_WITH_IMM, h.wr_rdma_write_imm.is_some()),
        (SendOps::SEND, h.wr_send.is_some()),
        (SendOps::SEND_WITH_IMM, h.wr_send_imm.is_some()),
        (SendOps::RDMA_READ, h.wr_rdma_read.is_some()),
        (SendOps::ATOMIC_CMP_AND_SWP, h.wr_atomic_cmp_swp.is_some()),
        (
            SendOps::ATOMIC_FETCH_AND_ADD,
            h.wr_atomic_fetch_add.is_some(),
        ),
        (SendOps::LOCAL_INV, h.wr_local_inv.is_some()),
        (SendOps::SEND_WITH_INV, h.wr_send_inv.is_some()),
    ];
    base && each.iter().all(|&(op, set)| !ops.contains(op) || set)
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
    /// chain: [`Error::Queued`] says so, as for `post_send`. Empty entries, atomics'
    /// entries, windows and address handles: see [what a posted request may
    /// touch](crate::wr#what-a-posted-request-may-touch).
    pub unsafe fn post_send_ex(&self, wr: &mut SendWr<'_>) -> Result<()> {
        let first: *mut sys::ibv_send_wr = wr.raw_mut();
        // SAFETY: the chain is valid for the call (the caller's contract).
        unsafe { self.check_chain(first) }?;
        // SAFETY: made by `new_ex` (send_ops is not NONE, checked above), so the QP
        // is embedded in an `ibv_qp_ex`.
        let qpx = unsafe { sys::ibv_qp_to_qp_ex(self.inner.raw.as_ptr()) };
        // SAFETY: a live extended QP; the provider locks its send queue until the
        // complete below (or the abort, should anything between unwind).
        unsafe { sys::ibv_wr_start(qpx) };
        let batch = Batch(qpx);
        let ud = self.inner.qp_type == QpType::Ud;
        let mut next = first;
        while !next.is_null() {
            // SAFETY: `next` is a request of the checked chain.
            let w = unsafe { &*next };
            // SAFETY: `qpx` is between start and complete; `w` passed the checks.
            unsafe { build(qpx, w, ud) };
            next = w.next;
        }
        std::mem::forget(batch);
        // SAFETY: as for the start.
        let ret = unsafe { sys::ibv_wr_complete(qpx) };
        check("ibv_wr_complete", ret).map_err(|e| match e {
            // Soft-RoCE makes the requests visible, then rings its doorbell with a
            // write(2): any errno of that write leaves them queued. What it
            // records while building is ENOSPC (a full queue; the sizes were
            // checked above), and then nothing was made visible. Other providers
            // roll back on an error, and their doorbell cannot fail.
            Error::Verb { verb, source, .. }
                if self.send_cq().maybe_soft_roce()
                    && source.raw_os_error() != Some(libc::ENOSPC) =>
            {
                Error::Queued { verb, source }
            }
            e => e.with_hint("the send queue may be full: poll completions first"),
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
                "post_send_ex: this queue pair was made for no operation of the extended \
                 interface (QueuePair::new_ex names them)"
                    .into(),
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
            // SAFETY: the request's SGE list is valid for the call.
            unsafe { self.check_data(w) }?;
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

impl QueuePair<Rts> {
    /// Refuses what the providers would only record as an error inside the batch
    /// (too many SGEs, too long an inline payload: on Soft-RoCE a failed complete
    /// could not tell it from a queued batch) and what they get wrong: an inline
    /// READ or atomic, and on Soft-RoCE before rdma-core 64 a list of SGEs of
    /// unequal lengths (its `ibv_wr_set_sge_list` counts the request's length as
    /// the first one's times their number).
    ///
    /// # Safety
    /// `w`'s SGE list holds `num_sge` valid entries.
    unsafe fn check_data(&self, w: &sys::ibv_send_wr) -> Result<()> {
        let refuse = |why: String| {
            Err(Error::InvalidArgument(
                format!("post_send_ex: {why}").into(),
            ))
        };
        let inline = w.send_flags & sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0;
        let max_sges = match inline {
            true => MAX_INLINE_PIECES,
            false => self.inner.caps.max_send_sge as usize,
        };
        let n = match usize::try_from(w.num_sge) {
            Ok(n) if n <= max_sges && (n == 0 || !w.sg_list.is_null()) => n,
            _ => {
                return refuse(format!(
                    "{} SGEs in one request; the queue pair takes {max_sges} (max_send_sge, \
                     or pieces of an inline payload)",
                    w.num_sge
                ))
            }
        };
        let sges = match n {
            0 => &[][..],
            // SAFETY: the caller's contract: `num_sge` valid entries (not null).
            _ => unsafe { std::slice::from_raw_parts(w.sg_list, n) },
        };
        if !inline {
            let unequal = sges.iter().any(|s| s.length != sges[0].length);
            if unequal && self.send_cq().maybe_soft_roce() {
                return refuse(
                    "SGEs of unequal lengths: Soft-RoCE's ibv_wr_set_sge_list (rdma-core \
                     before 64) takes the first one's length times their number for the \
                     request's; post this one with post_send"
                        .into(),
                );
            }
            return Ok(());
        }
        use sys::ibv_wr_opcode as O;
        if !matches!(
            w.opcode,
            O::IBV_WR_SEND
                | O::IBV_WR_SEND_WITH_IMM
                | O::IBV_WR_SEND_WITH_INV
                | O::IBV_WR_RDMA_WRITE
                | O::IBV_WR_RDMA_WRITE_WITH_IMM
        ) {
            return refuse(format!(
                "inline data with {:?} (SENDs and WRITEs only)",
                w.opcode
            ));
        }
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        // Several pieces are gathered on the stack; one goes as it is.
        let mut max = u64::from(self.inner.caps.max_inline_data);
        if n > 1 {
            max = max.min(INLINE_GATHER as u64);
        }
        if total > max {
            return refuse(format!(
                "an inline payload of {total} bytes in {n} pieces; the queue pair inlines \
                 {max} at most (max_inline_data), in {MAX_INLINE_PIECES} pieces"
            ));
        }
        Ok(())
    }
}

/// An open batch: aborted (the provider's lock let go, nothing posted) if it
/// is dropped before its complete, as on an unwind.
struct Batch(*mut sys::ibv_qp_ex);

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: between ibv_wr_start and ibv_wr_complete of this live QP.
        unsafe { sys::ibv_wr_abort(self.0) };
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

/// Bytes of an inline payload gathered on the stack at most (more than any
/// device inlines; a longer payload is refused).
const INLINE_GATHER: usize = 4096;

/// Sets an inline payload from the request's SGEs with one
/// `ibv_wr_set_inline_data`, never the list: Soft-RoCE's
/// `ibv_wr_set_inline_data_list` before rdma-core 64 never adds up the pieces'
/// lengths, so it sends none of the bytes and does not bound its copies (past
/// the request's slot when they add up to more than it holds). The pieces are
/// gathered here first; `check_data` bounded their total.
///
/// # Safety
/// `qpx` is between `ibv_wr_start` and `ibv_wr_complete`; `w`'s SGE list has
/// `n` entries whose buffers are valid for the call.
unsafe fn set_inline(qpx: *mut sys::ibv_qp_ex, w: &sys::ibv_send_wr, n: usize) {
    let mut pieces = [sys::ibv_data_buf::default(); MAX_INLINE_PIECES];
    for (i, piece) in pieces.iter_mut().enumerate().take(n) {
        // SAFETY: i < num_sge, inside the request's SGE list.
        let sge = unsafe { &*w.sg_list.add(i) };
        *piece = sys::ibv_data_buf {
            addr: sge.addr as usize as *mut std::ffi::c_void,
            length: sge.length as usize,
        };
    }
    if n == 1 {
        // SAFETY: the caller's buffer, copied by this call.
        unsafe { sys::ibv_wr_set_inline_data(qpx, pieces[0].addr, pieces[0].length) };
        return;
    }
    let mut gathered = [0u8; INLINE_GATHER];
    let mut at = 0;
    for piece in &pieces[..n] {
        // `check_data` bounded the total by INLINE_GATHER; never copy past it.
        let len = piece.length.min(INLINE_GATHER - at);
        let src = piece.addr.cast::<u8>();
        for (k, byte) in gathered[at..at + len].iter_mut().enumerate() {
            // SAFETY: each piece is a caller's buffer of at least `len` bytes, valid
            // for the call. Read volatile, a byte at a time: a peer may be writing
            // the source (a region with remote write), which a plain copy must not
            // read.
            *byte = unsafe { std::ptr::read_volatile(src.add(k)) };
        }
        at += len;
    }
    // SAFETY: `gathered` holds `at` bytes and lives across the call, which copies.
    unsafe { sys::ibv_wr_set_inline_data(qpx, gathered.as_mut_ptr().cast(), at) };
}
