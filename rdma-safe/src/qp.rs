//! Queue pairs whose state is part of their type.
//!
//! A new queue pair is a `QueuePair<Reset>`. Each transition consumes it and returns
//! the next state, or hands it back with the error:
//!
//! ```text
//! QueuePair<Reset> --to_init--> QueuePair<Init> --to_rtr--> QueuePair<Rtr> --to_rts--> QueuePair<Rts>
//! ```
//! Receives may be posted from `Init` on; sends only on `Rts`. Posting a send on a
//! queue pair that cannot send does not compile:
//!
//! ```compile_fail
//! # use rdma_safe::qp::{QueuePair, Rtr};
//! fn send_too_early(qp: &QueuePair<Rtr>, wr: *mut rdma_safe::sys::ibv_send_wr) {
//!     unsafe { qp.post_send_raw(wr) }.unwrap(); // no such method on QueuePair<Rtr>
//! }
//! ```

use crate::cq::CompletionQueue;
use crate::error::{check, Error, Result};
use crate::gid::Gid;
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use rdma_verbs_sys as sys;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

mod attrs;
mod ex;

pub use attrs::{random_psn, InitAttr, QpConfig, QpType, RemoteEndpoint, RtrAttr, RtsAttr};
pub use ex::SendOps;

mod sealed {
    pub trait Sealed {}
}

/// A queue pair state, as a type.
pub trait State: sealed::Sealed {
    /// The matching `ibv_qp_state`.
    const STATE: sys::ibv_qp_state;
}

/// States in which receives may be posted (`Init`, `Rtr`, `Rts`).
pub trait CanRecv: State {}

macro_rules! state {
    ($(#[$doc:meta])* $name:ident = $raw:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl State for $name {
            const STATE: sys::ibv_qp_state = sys::ibv_qp_state::$raw;
        }
    };
}

state!(
    /// Just created, or reset: nothing can be posted.
    Reset = IBV_QPS_RESET
);
state!(
    /// Initialised: receives can be posted.
    Init = IBV_QPS_INIT
);
state!(
    /// Ready to receive: connected to its peer.
    Rtr = IBV_QPS_RTR
);
state!(
    /// Ready to send.
    Rts = IBV_QPS_RTS
);
impl CanRecv for Init {}
impl CanRecv for Rtr {}
impl CanRecv for Rts {}

/// The resources of a queue pair, whatever its state.
struct Inner {
    raw: NonNull<sys::ibv_qp>,
    qp_type: QpType,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
    caps: sys::ibv_qp_cap,
    /// What `post_send_ex` may post (none unless made by `new_ex`): `SendOps`'
    /// bits, all below 2^16, in the padding after `qp_type`, which keeps `Inner`
    /// (and so `TransitionError`) at its old size.
    send_ops: u16,
    // A QP created by the RDMA CM (`QueuePair::from_owner`) keeps its owner in the
    // QP's own `qp_context` (a `Box<Arc<dyn QpOwner>>`); `QueuePair::new` leaves it
    // null. This keeps `Inner` (and so `TransitionError`) at its old size.
}

/// The creator of a queue pair made outside this module (the RDMA CM id that ran
/// `rdma_create_qp`); it destroys the QP in the way its creator requires.
pub(crate) trait QpOwner: Send + Sync {
    /// Destroys `qp`; called exactly once, from the queue pair's drop. Returns what
    /// `ibv_destroy_qp` returned: on a failure the queue pair lives on, and the
    /// drop stops it.
    ///
    /// # Safety
    /// `qp` is the live queue pair this owner created; nothing uses it afterwards
    /// but that stop.
    unsafe fn destroy_qp(&self, qp: *mut sys::ibv_qp) -> i32;

    /// Runs `f` (an `ibv_query_qp`) where the owner modifies the queue pair on its
    /// own (the RDMA CM, under its id's locks) cannot run at the same time.
    fn serialized(&self, f: &mut dyn FnMut());
}

/// Locks for `ibv_query_qp` and `ibv_modify_qp`, picked by the queue pair's
/// address: both store a state in the shared `ibv_qp`, so two of them on one queue
/// pair on two threads would race on that field (`QueuePair::exclusive`).
static QUERY_LOCKS: [std::sync::Mutex<()>; 16] = [const { std::sync::Mutex::new(()) }; 16];

/// The multicast groups each live queue pair joined (its address, the group's GID
/// and LID): the kernel refuses to destroy a queue pair still in a group
/// (`EBUSY`), so its drop leaves them first. Rarely more than a few entries.
static GROUPS: std::sync::Mutex<Vec<(usize, [u8; 16], u16)>> = std::sync::Mutex::new(Vec::new());

/// The groups list, whatever a panicking holder left.
fn groups() -> std::sync::MutexGuard<'static, Vec<(usize, [u8; 16], u16)>> {
    GROUPS.lock().unwrap_or_else(|e| e.into_inner())
}

// SAFETY: libibverbs QPs may be used from any thread; providers lock their queues.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Released at the end of this function, before the fields (the queues).
        let _no_callbacks = crate::cq::hold_for_destroy(&self.send_cq, &self.recv_cq);
        self.leave_groups();
        // SAFETY: the QP is alive; `qp_context` is null or what `from_owner` stored.
        let owner = unsafe { (*self.raw.as_ptr()).qp_context };
        if !owner.is_null() {
            // SAFETY: stored by `from_owner` with Box::into_raw, taken back only here.
            let owner = unsafe { Box::from_raw(owner.cast::<Arc<dyn QpOwner>>()) };
            // SAFETY: the QP is alive and destroyed only here; the owner is dropped
            // after it, the PD and CQs (fields) after this function.
            let ret = unsafe { owner.destroy_qp(self.raw.as_ptr()) };
            if ret != 0 {
                self.stop_or_abort(ret);
            }
            return;
        }
        // SAFETY: created in `QueuePair::new`, destroyed once; the PD and CQs it uses
        // are held by this value and dropped after.
        let ret = unsafe { sys::ibv_destroy_qp(self.raw.as_ptr()) };
        if ret != 0 {
            self.stop_or_abort(ret);
        }
    }
}

impl Inner {
    /// Leaves every multicast group the queue pair joined.
    fn leave_groups(&self) {
        let raw = self.raw.as_ptr() as usize;
        let mut joined = Vec::new();
        groups().retain(|&(qp, gid, lid)| {
            let ours = qp == raw;
            if ours {
                joined.push((gid, lid));
            }
            !ours
        });
        for (gid, lid) in joined {
            let gid = sys::ibv_gid { raw: gid };
            // SAFETY: the QP is alive; `gid` lives across the call. A failure leaves
            // the destroy to say so.
            unsafe { sys::ibv_detach_mcast(self.raw.as_ptr(), &gid, lid) };
        }
    }

    /// The queue pair outlived `ibv_destroy_qp` (which returned `ret`): every
    /// buffer posted on it is released after this, so the device must be done with
    /// them. Reset drops every outstanding request; the queue pair itself, and the
    /// PD, CQs and SRQ it holds (whose destroys the kernel would now refuse), are
    /// left to the process's exit. If even the reset fails, the process aborts,
    /// since going on would hand memory the device may still write to safe code.
    #[cold]
    fn stop_or_abort(&self, ret: i32) {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RESET,
            ..Default::default()
        };
        let mask = sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        // SAFETY: the QP is alive (its destroy failed); `attr` lives across the call.
        if unsafe { sys::ibv_modify_qp(self.raw.as_ptr(), &mut attr, mask) } != 0 {
            use std::io::Write;
            // A failed write must not unwind past the abort.
            let _ = writeln!(
                std::io::stderr(),
                "rdma-safe: ibv_destroy_qp failed ({}) and the queue pair could not be \
                 reset: aborting rather than releasing memory the device may still use",
                std::io::Error::from_raw_os_error(ret.abs())
            );
            std::process::abort();
        }
        std::mem::forget(self.pd.clone());
        std::mem::forget(self.send_cq.clone());
        std::mem::forget(self.recv_cq.clone());
        std::mem::forget(self.srq.clone());
    }
}

/// A queue pair in state `S`.
pub struct QueuePair<S: State> {
    inner: Inner,
    _state: PhantomData<S>,
}

/// A failed transition: the error and the queue pair, unchanged in its old state.
#[derive(Debug)]
pub struct TransitionError<Q> {
    /// The queue pair, still usable in its previous state.
    pub qp: Q,
    /// Why the transition failed.
    pub error: Error,
}

impl<Q> std::fmt::Display for TransitionError<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<Q: std::fmt::Debug> std::error::Error for TransitionError<Q> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<Q> From<TransitionError<Q>> for Error {
    fn from(t: TransitionError<Q>) -> Error {
        t.error
    }
}

/// Result of a transition from state `From` to `To`.
pub type Transition<From, To> =
    std::result::Result<QueuePair<To>, TransitionError<QueuePair<From>>>;

impl QueuePair<Reset> {
    /// Creates a queue pair in `pd` (`ibv_create_qp`).
    pub fn new(pd: &Arc<ProtectionDomain>, config: &QpConfig) -> Result<Self> {
        crate::context::check_provider_locks()?;
        config.check_context(pd, "ibv_create_qp")?;
        let mut init = config.to_raw();
        // SAFETY: pd and the CQs are alive and of one device context (checked);
        // `init` is fully initialised.
        let raw = unsafe { sys::ibv_create_qp(pd.as_raw(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::last("ibv_create_qp").with_hint(
                "are the queue depths and SGE counts within the device's max_qp_wr/max_sge?",
            )
        })?;
        Ok(Self::created(raw, pd, config, init.cap, 0))
    }

    /// The queue pair `raw` just created in `pd` from `config`, with the sizes
    /// the device granted and the extended interface's operations (`SendOps`
    /// bits; 0 for none).
    fn created(
        raw: NonNull<sys::ibv_qp>,
        pd: &Arc<ProtectionDomain>,
        config: &QpConfig,
        caps: sys::ibv_qp_cap,
        send_ops: u16,
    ) -> Self {
        QueuePair {
            inner: Inner {
                raw,
                qp_type: config.qp_type,
                pd: pd.clone(),
                send_cq: config.send_cq.clone(),
                recv_cq: config.recv_cq.clone(),
                srq: config.srq.clone(),
                caps,
                send_ops,
            },
            _state: PhantomData,
        }
    }

    /// RESET -> INIT.
    pub fn to_init(self, attr: &InitAttr) -> Transition<Reset, Init> {
        use sys::ibv_qp_attr_mask as M;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: attr.pkey_index,
            port_num: attr.port,
            qp_access_flags: attr.access.bits(),
            qkey: attr.qkey,
            ..Default::default()
        };
        let mut mask = M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT;
        mask |= if self.inner.qp_type == QpType::Ud {
            M::IBV_QP_QKEY
        } else {
            M::IBV_QP_ACCESS_FLAGS
        };
        self.modify(&mut a, mask, "ibv_modify_qp(RESET->INIT)")
    }
}

impl QueuePair<Init> {
    /// INIT -> RTR: connects to the peer (RC/UC) or just enables receiving (UD).
    pub fn to_rtr(self, attr: &RtrAttr) -> Transition<Init, Rtr> {
        use sys::ibv_qp_attr_mask as M;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTR,
            ..Default::default()
        };
        if self.inner.qp_type == QpType::Ud {
            return self.modify(&mut a, M::IBV_QP_STATE, "ibv_modify_qp(INIT->RTR)");
        }
        a.path_mtu = attr.mtu;
        a.dest_qp_num = attr.remote.qpn;
        a.rq_psn = attr.remote.psn;
        a.ah_attr = sys::ibv_ah_attr {
            dlid: attr.remote.lid,
            sl: attr.sl,
            port_num: attr.port,
            ..Default::default()
        };
        if let Some(gid) = attr.remote.gid {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh = sys::ibv_global_route {
                dgid: gid.to_raw(),
                sgid_index: attr.sgid_index,
                hop_limit: attr.hop_limit,
                traffic_class: attr.traffic_class,
                ..Default::default()
            };
        }
        let mut mask = M::IBV_QP_STATE
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_RQ_PSN;
        if self.inner.qp_type == QpType::Rc {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            a.min_rnr_timer = attr.min_rnr_timer;
            mask |= M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_MIN_RNR_TIMER;
        }
        let sgid = attr.sgid_index;
        let is_roce = attr.remote.gid.is_some();
        match self.modify(&mut a, mask, "ibv_modify_qp(INIT->RTR)") {
            Ok(qp) => Ok(qp),
            Err(mut t) => {
                let routing = matches!(
                    t.error.errno(),
                    Some(
                        libc::ETIMEDOUT
                            | libc::ENETUNREACH
                            | libc::EHOSTUNREACH
                            | libc::EINVAL
                            | libc::ENODATA
                    )
                );
                if routing {
                    let hint = if is_roce {
                        format!(
                            "no route to the peer's GID from GID index {sgid}: on RoCE pick the \
                             index of a GID of the same type and subnet as the peer's \
                             (`ibv_devinfo -v`, RDMA_GID_INDEX, perftest -x)"
                        )
                    } else {
                        "on RoCE (Ethernet link layer) a GID is required: the LID is 0".into()
                    };
                    t.error = t.error.with_hint(hint);
                }
                Err(t)
            }
        }
    }
}

impl QueuePair<Rtr> {
    /// RTR -> RTS: enables sending.
    pub fn to_rts(self, attr: &RtsAttr) -> Transition<Rtr, Rts> {
        use sys::ibv_qp_attr_mask as M;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: attr.psn,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            max_rd_atomic: attr.max_rd_atomic,
            ..Default::default()
        };
        let mask = match self.inner.qp_type {
            QpType::Rc => {
                M::IBV_QP_STATE
                    | M::IBV_QP_SQ_PSN
                    | M::IBV_QP_TIMEOUT
                    | M::IBV_QP_RETRY_CNT
                    | M::IBV_QP_RNR_RETRY
                    | M::IBV_QP_MAX_QP_RD_ATOMIC
            }
            QpType::Uc | QpType::Ud => M::IBV_QP_STATE | M::IBV_QP_SQ_PSN,
        };
        self.modify(&mut a, mask, "ibv_modify_qp(RTR->RTS)")
    }
}

impl QueuePair<Rts> {
    /// Sets the RNR NAK timer (`min_rnr_timer`, the IB code 0-31: 12 is 0.64 ms, 0 is
    /// 655 ms) that this QP, as a responder, asks a sender to wait after finding no
    /// receive posted (`ibv_modify_qp` RTS -> RTS). perftest sets 12 on CM-connected
    /// QPs, whose default from the RDMA CM is 0.
    pub fn set_min_rnr_timer(&self, timer: u8) -> Result<()> {
        if timer > 31 {
            return Err(Error::InvalidArgument(
                format!("min_rnr_timer {timer} is not an IB RNR timer code (0-31)").into(),
            ));
        }
        let mut a = sys::ibv_qp_attr {
            min_rnr_timer: timer,
            ..Default::default()
        };
        let mask = sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: the QP is alive and `a` is a valid attribute block; only the RNR
        // timer is modified (no state change), which RTS -> RTS allows; a refusal
        // leaves the QP as it was.
        let ret = unsafe { self.modify_raw(&mut a, mask.0 as i32) };
        check("ibv_modify_qp(min_rnr_timer)", ret)
    }

    /// Posts a chain of send work requests (`ibv_post_send`).
    ///
    /// # Safety
    /// Every work request of the chain and everything it points to (SGE lists) must be
    /// valid for the call; every local buffer named by an SGE must stay allocated,
    /// registered and otherwise untouched until the completion of that request (or of
    /// a later signaled request on this queue) has been polled; remote addresses and
    /// keys are the caller's to get right (a wrong one fails the request, not memory
    /// safety). Address handles and memory windows named by a request must be of this
    /// queue pair's protection domain: the driver takes them for its own objects.
    /// Work request ids with bit 63 set are reserved for [`crate::LeasedQp`]:
    /// never post one (a `LeasedQp` knows its requests' completions by their ids, and
    /// an extended queue's completion need not name its queue pair).
    ///
    /// A failure does not always mean nothing was posted: [`Error::Queued`] says
    /// the requests before the one the provider named (every one, when it named
    /// none) may be on the queue, and their buffers are then bound as above.
    /// Any other error posted nothing.
    ///
    /// A request holds more than the bytes its entries count (an empty entry, an
    /// atomic's entry, a bind's window and region, a UD send's address handle): see
    /// [what a posted request may touch](crate::wr#what-a-posted-request-may-touch).
    #[inline]
    pub unsafe fn post_send_raw(&self, wr: *mut sys::ibv_send_wr) -> Result<()> {
        let mut bad = ptr::null_mut();
        // SAFETY: the caller upholds the contract above; the QP is alive.
        let ret = unsafe { sys::inline::ibv_post_send(self.inner.raw.as_ptr(), wr, &mut bad) };
        let result = check("ibv_post_send", ret);
        queued_if_not_first(result, wr, bad).map_err(|e| match e.errno() {
            Some(libc::ENOMEM) => e.with_hint("the send queue is full: poll completions first"),
            Some(libc::EINVAL) => e.with_hint(
                "a work request is invalid for this QP (opcode, SGE count, inline size)",
            ),
            _ => e,
        })
    }
}

impl<S: CanRecv> QueuePair<S> {
    /// Posts a chain of receive work requests (`ibv_post_recv`).
    ///
    /// # Safety
    /// Every work request and SGE list must be valid for the call, and every buffer
    /// it names must stay allocated, registered and untouched until its completion
    /// has been polled (or the QP was destroyed or reset). Work request ids with bit
    /// 63 set are reserved for [`crate::LeasedQp`]: never post one, as for
    /// `post_send_raw`. A failure may have posted requests, as there:
    /// [`Error::Queued`] says so. An empty entry may mean 2 GiB: see [what a posted
    /// request may touch](crate::wr#what-a-posted-request-may-touch).
    #[inline]
    pub unsafe fn post_recv_raw(&self, wr: *mut sys::ibv_recv_wr) -> Result<()> {
        let mut bad = ptr::null_mut();
        // SAFETY: the caller upholds the contract above; the QP is alive.
        let ret = unsafe { sys::inline::ibv_post_recv(self.inner.raw.as_ptr(), wr, &mut bad) };
        let result = check("ibv_post_recv", ret);
        queued_if_not_first(result, wr, bad)
            .map_err(|e| e.with_hint("the receive queue may be full (max_recv_wr)"))
    }
}

/// A failed post whose provider named another request than the first as the one
/// it could not post (none at all: Soft-RoCE after its doorbell failed) may have
/// queued what came before: [`Error::Queued`]. Reading it so when nothing was
/// queued (some providers name none for a request they refused outright) only
/// holds buffers longer than needed; the other way round would free them early.
pub(crate) fn queued_if_not_first<T>(result: Result<()>, first: *mut T, bad: *mut T) -> Result<()> {
    match result {
        Err(Error::Verb { verb, source, .. }) if bad != first => {
            Err(Error::Queued { verb, source })
        }
        other => other,
    }
}

impl<S: State> QueuePair<S> {
    /// The queue pair number, what the peer needs to reach us.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is alive.
        unsafe { (*self.inner.raw.as_ptr()).qp_num }
    }

    /// The queue sizes the device granted (at least what was asked).
    pub fn caps(&self) -> sys::ibv_qp_cap {
        self.inner.caps
    }

    /// The completion queue of its send queue.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.inner.send_cq
    }

    /// The completion queue of its receive queue.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.inner.recv_cq
    }

    /// The shared receive queue it takes receives from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.inner.srq.as_ref()
    }

    /// RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.inner.pd
    }

    /// The state the device reports now: `S` normally, `IBV_QPS_ERR` after an error.
    pub fn query_state(&self) -> Result<sys::ibv_qp_state> {
        let mask = sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        Ok(self.query_raw(mask)?.0.qp_state)
    }

    /// `ibv_query_qp` of the attributes in `mask`, never at the same time as another
    /// query or change of this queue pair ([`Self::exclusive`]).
    fn query_raw(&self, mask: i32) -> Result<(sys::ibv_qp_attr, sys::ibv_qp_init_attr)> {
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        let raw = self.inner.raw.as_ptr();
        let mut ret = 0;
        self.exclusive(&mut || {
            // SAFETY: the QP is alive; both out-pointers are valid; no other query
            // or modification of it runs meanwhile (`exclusive`).
            ret = unsafe { sys::ibv_query_qp(raw, &mut attr, mask, &mut init) };
        });
        check("ibv_query_qp", ret)?;
        Ok((attr, init))
    }

    /// `ibv_modify_qp` of the attributes in `mask`, never at the same time as another
    /// query or change of this queue pair ([`Self::exclusive`]); its return value.
    ///
    /// # Safety
    /// `attr` is initialised for every field in `mask`, and the change is one the
    /// queue pair's type state allows.
    unsafe fn modify_raw(&self, attr: &mut sys::ibv_qp_attr, mask: i32) -> i32 {
        let raw = self.inner.raw.as_ptr();
        let mut ret = 0;
        self.exclusive(&mut || {
            // SAFETY: the QP is alive; `attr` is the caller's (see above); no other
            // query or modification of it runs meanwhile (`exclusive`).
            ret = unsafe { sys::ibv_modify_qp(raw, attr, mask) };
        });
        ret
    }

    /// Runs `f`, a verb that writes the `state` field of the shared `ibv_qp`
    /// (`ibv_query_qp` stores the state it read, as `ibv_modify_qp` does), where no
    /// other such verb on this queue pair runs: this crate's (a lock per address)
    /// or, for a CM queue pair, librdmacm's own changes (its owner's locks: event
    /// processing, `rdma_accept`, `rdma_disconnect`).
    fn exclusive(&self, f: &mut dyn FnMut()) {
        let raw = self.inner.raw.as_ptr();
        let slot = (raw as usize / std::mem::align_of::<sys::ibv_qp>()) % QUERY_LOCKS.len();
        // The address's lock innermost: it is never held while waiting for another.
        let mut locked = || {
            let _lock = QUERY_LOCKS[slot].lock().unwrap_or_else(|e| e.into_inner());
            f()
        };
        // SAFETY: the QP is alive; `qp_context` is null or what `from_owner` stored,
        // which lives until the QP's drop.
        let owner = unsafe { (*raw).qp_context.cast::<Arc<dyn QpOwner>>().as_ref() };
        match owner {
            Some(owner) => owner.serialized(&mut locked),
            None => locked(),
        }
    }

    /// Joins the multicast group `gid` (and `lid` on InfiniBand; 0 on RoCE): a UD QP
    /// then receives what is sent to the group (`ibv_attach_mcast`). Dropping the
    /// queue pair leaves it.
    pub fn attach_mcast(&self, gid: Gid, lid: u16) -> Result<()> {
        let raw = gid.to_raw();
        // Held across the verb, so that the record and the kernel agree whatever
        // other threads attach or detach meanwhile.
        let mut groups = groups();
        // SAFETY: the QP is alive; `raw` lives across the call.
        check("ibv_attach_mcast", unsafe {
            sys::ibv_attach_mcast(self.inner.raw.as_ptr(), &raw, lid)
        })
        .map_err(|e| e.with_hint("multicast needs a UD QP and a multicast GID (ff..::)"))?;
        // Left again by the drop (the kernel would refuse to destroy the QP).
        let joined = (self.inner.raw.as_ptr() as usize, gid.0, lid);
        if !groups.contains(&joined) {
            groups.push(joined);
        }
        Ok(())
    }

    /// Leaves the multicast group `gid` (`ibv_detach_mcast`).
    pub fn detach_mcast(&self, gid: Gid, lid: u16) -> Result<()> {
        let raw = gid.to_raw();
        // Held across the verb, as in `attach_mcast`.
        let mut groups = groups();
        // SAFETY: the QP is alive; `raw` lives across the call.
        check("ibv_detach_mcast", unsafe {
            sys::ibv_detach_mcast(self.inner.raw.as_ptr(), &raw, lid)
        })?;
        let left = (self.inner.raw.as_ptr() as usize, gid.0, lid);
        groups.retain(|joined| *joined != left);
        Ok(())
    }

    /// Every attribute the device reports (`ibv_query_qp` with all mask bits): state,
    /// PSNs, path MTU, destination, timeouts, capabilities.
    pub fn query(&self) -> Result<(sys::ibv_qp_attr, sys::ibv_qp_init_attr)> {
        // Every attribute bit up to IBV_QP_DEST_QPN (what RC/UC/UD use).
        let mask = (sys::ibv_qp_attr_mask::IBV_QP_DEST_QPN.0 << 1) - 1;
        self.query_raw(mask as i32)
    }

    /// Moves the queue pair back to RESET from any state (e.g. after an error); every
    /// outstanding work request is dropped by the device.
    ///
    /// On mlx5 a reset cleans the queue pair's completions out of its completion
    /// queues under their locks, so inside a [`CompletionQueue::poll_ex`] callback
    /// it is refused as polling those queues is: when one of them is the
    /// callback's queue, or was created before it.
    pub fn reset(self) -> Transition<S, Reset> {
        let what = "ibv_modify_qp(->RESET) of a queue pair";
        let cqs = [&self.inner.send_cq, &self.inner.recv_cq];
        if let Some(error) = cqs
            .iter()
            .find_map(|cq| cq.check_outside_callback(what).err())
        {
            return Err(TransitionError { qp: self, error });
        }
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RESET,
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp(->RESET)",
        )
    }

    /// The raw `ibv_qp`; it stays owned by `self`. Changing its state behind the
    /// type's back makes the type lie: do not.
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.inner.raw.as_ptr()
    }

    fn modify<T: State>(
        self,
        attr: &mut sys::ibv_qp_attr,
        mask: sys::ibv_qp_attr_mask,
        verb: &'static str,
    ) -> Transition<S, T> {
        // SAFETY: `attr` is initialised for every field in `mask`, a change the
        // callers' type states allow.
        let ret = unsafe { self.modify_raw(attr, mask.0 as i32) };
        match check(verb, ret) {
            Ok(()) => Ok(QueuePair {
                inner: self.inner,
                _state: PhantomData,
            }),
            Err(error) => Err(TransitionError { qp: self, error }),
        }
    }
}

/// Queue pairs created by the RDMA CM (`rdma_create_qp`), whose states librdmacm
/// moves itself during connect/accept (see [`crate::cm`]).
impl<S: State> QueuePair<S> {
    /// Wraps a queue pair that `owner` created with `config`'s PD and CQs; `owner`
    /// destroys it when the returned value drops.
    ///
    /// # Safety
    /// `raw` must be a live QP in state `S`, created on `pd` with `config`'s CQs and
    /// SRQ, owned by nothing else than `owner`, with a null `qp_context` (it is
    /// taken to hold `owner`).
    pub(crate) unsafe fn from_owner(
        raw: NonNull<sys::ibv_qp>,
        pd: &Arc<ProtectionDomain>,
        config: &QpConfig,
        caps: sys::ibv_qp_cap,
        owner: Arc<dyn QpOwner>,
    ) -> Self {
        let owner = Box::into_raw(Box::new(owner));
        // SAFETY: the QP is alive and its user context unused (see above).
        unsafe { (*raw.as_ptr()).qp_context = owner.cast() };
        QueuePair {
            inner: Inner {
                raw,
                qp_type: config.qp_type,
                pd: pd.clone(),
                send_cq: config.send_cq.clone(),
                recv_cq: config.recv_cq.clone(),
                srq: config.srq.clone(),
                caps,
                send_ops: 0,
            },
            _state: PhantomData,
        }
    }

    /// Changes the type after the CM moved the QP to state `T` itself; the caller
    /// has checked (`query_state`) that the device reports `T`.
    pub(crate) fn retype<T: State>(self) -> QueuePair<T> {
        QueuePair {
            inner: self.inner,
            _state: PhantomData,
        }
    }
}

impl<S: State> std::fmt::Debug for QueuePair<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("type", &self.inner.qp_type)
            .field("state", &S::STATE)
            .finish()
    }
}
