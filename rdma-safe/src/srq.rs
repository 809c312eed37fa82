//! Shared receive queues (`ibv_create_srq`): one pool of receives for many QPs.

use crate::error::{check, Error, Result};
use crate::pd::ProtectionDomain;
use crate::wr::RecvWr;
use rdma_verbs_sys as sys;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// A shared receive queue; QPs created on it hold it alive.
pub struct SharedReceiveQueue {
    raw: NonNull<sys::ibv_srq>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: SRQs may be posted to from any thread (providers lock internally).
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// Creates an SRQ with room for `max_wr` receives of up to `max_sge` entries.
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32, max_sge: u32) -> Result<Arc<Self>> {
        crate::context::check_provider_locks()?;
        let mut attr = sys::ibv_srq_init_attr {
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
            ..Default::default()
        };
        // SAFETY: the PD is alive; `attr` is initialised.
        let raw = unsafe { sys::ibv_create_srq(pd.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::last("ibv_create_srq").with_hint("check max_srq_wr / max_srq_sge of the device")
        })?;
        Ok(Arc::new(SharedReceiveQueue {
            raw,
            _pd: pd.clone(),
        }))
    }

    /// The protection domain the queue was created in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self._pd
    }

    /// Posts receives to the shared queue.
    ///
    /// # Safety
    /// The buffers must stay allocated, registered and unread until their completions
    /// (on whichever QP's receive CQ consumed them) have been polled. Work request ids
    /// with bit 63 set are reserved for [`crate::LeasedQp`]: never post one. A
    /// failure may have posted receives before the one the provider named:
    /// [`crate::Error::Queued`] says so (see `QueuePair::post_send_raw`). An empty
    /// entry may mean 2 GiB: see [what a posted request may
    /// touch](crate::wr#what-a-posted-request-may-touch).
    pub unsafe fn post_recv(&self, wr: &mut RecvWr<'_>) -> Result<()> {
        let mut bad = ptr::null_mut();
        let first = wr.as_raw();
        // SAFETY: the caller keeps the buffers alive; the SRQ is alive.
        let ret = unsafe { sys::ibv_post_srq_recv(self.raw.as_ptr(), first, &mut bad) };
        let result = check("ibv_post_srq_recv", ret);
        crate::qp::queued_if_not_first(result, first, bad)
            .map_err(|e| e.with_hint("the SRQ may be full (max_wr)"))
    }

    /// Arms the limit event: an `SRQ_LIMIT_REACHED` asynchronous event fires when
    /// fewer than `limit` receives remain.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        let mut attr = sys::ibv_srq_attr {
            srq_limit: limit,
            ..Default::default()
        };
        // SAFETY: the SRQ is alive; only the limit is modified.
        let ret = unsafe {
            sys::ibv_modify_srq(
                self.raw.as_ptr(),
                &mut attr,
                sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        check("ibv_modify_srq", ret)
    }

    /// Current attributes: `max_wr`, `max_sge`, `srq_limit` (`ibv_query_srq`).
    pub fn query(&self) -> Result<sys::ibv_srq_attr> {
        let mut attr = sys::ibv_srq_attr::default();
        // SAFETY: the SRQ is alive; `attr` is a valid out-pointer.
        check("ibv_query_srq", unsafe {
            sys::ibv_query_srq(self.raw.as_ptr(), &mut attr)
        })?;
        Ok(attr)
    }

    /// The raw `ibv_srq`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_srq {
        self.raw.as_ptr()
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: every QP on this SRQ holds an Arc to it, so none is left.
        let ret = unsafe { sys::ibv_destroy_srq(self.raw.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_destroy_srq failed");
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue").finish_non_exhaustive()
    }
}
