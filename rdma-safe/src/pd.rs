//! Protection domains (`ibv_alloc_pd`).

use crate::context::Context;
use crate::error::{Error, Result};
use rdma_verbs_sys as sys;
use std::ptr::NonNull;
use std::sync::Arc;

/// A protection domain: memory regions, queue pairs and address handles of one PD may
/// work together. Freed with `ibv_dealloc_pd` after its last child is gone.
pub struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: libibverbs objects are thread-safe; the PD is only freed in Drop.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: the context is open while `ctx` lives.
        let raw = unsafe { sys::ibv_alloc_pd(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_alloc_pd"))?;
        Ok(Arc::new(ProtectionDomain {
            raw,
            ctx: ctx.clone(),
        }))
    }

    /// The device context this domain belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw `ibv_pd`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc to this PD, so none is left; freed once.
        let ret = unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_dealloc_pd failed");
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name())
            .finish()
    }
}
