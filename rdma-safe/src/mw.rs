//! Memory windows (`ibv_alloc_mw`): grant a peer access to part of a region, and take
//! it back, without re-registering.

use crate::access::Access;
use crate::error::{check, Error, Result};
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{QueuePair, Rts};
use crate::wr::SendWr;
use rdma_verbs_sys as sys;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

/// Type 1 windows are bound with `ibv_bind_mw`; type 2 with a BIND_MW work request
/// and are tied to one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MwType {
    /// Bound by `ibv_bind_mw`, invalidated by binding a zero length.
    Type1,
    /// Bound by a work request, invalidated by LOCAL_INV or SEND_WITH_INV.
    Type2,
}

/// A memory window.
///
/// A window keeps the regions of its binds alive (`Arc`s), so a region can never be
/// deregistered, freed or borrowed as a slice while a peer may still reach it
/// through the window: a bind's region only until the window is proven unbound
/// ([`MemoryWindow::release_region`]) or deallocated, not merely until the next bind,
/// since an older binding stays valid until a new bind has run, and for good if
/// that bind fails.
///
/// Binding takes `&mut self`: the window's key changes with every bind, and the
/// provider reads the current key from the window when the bind is posted, so no
/// two binds of one window may be built or posted at the same time.
pub struct MemoryWindow {
    raw: NonNull<sys::ibv_mw>,
    kind: MwType,
    /// The region of the latest bind request.
    region: Option<Arc<MemoryRegion>>,
    /// The regions of earlier binds since the window was last proven unbound.
    earlier: Vec<Arc<MemoryRegion>>,
    /// The key of the latest bind request (type 2 binds posted with `ibv_post_send`
    /// do not update the provider's copy; this does, before the next bind).
    rkey: u32,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: windows are device objects usable from any thread.
unsafe impl Send for MemoryWindow {}
// SAFETY: as above.
unsafe impl Sync for MemoryWindow {}

impl MemoryWindow {
    /// Allocates a window in `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, kind: MwType) -> Result<Self> {
        let raw_kind = match kind {
            MwType::Type1 => sys::ibv_mw_type::IBV_MW_TYPE_1,
            MwType::Type2 => sys::ibv_mw_type::IBV_MW_TYPE_2,
        };
        // SAFETY: the PD is alive.
        let raw = unsafe { sys::ibv_alloc_mw(pd.as_raw(), raw_kind) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::last("ibv_alloc_mw")
                .with_hint("does the device support memory windows (MEM_WINDOW in ibv_devinfo -v)?")
        })?;
        // SAFETY: just allocated.
        let rkey = unsafe { (*raw.as_ptr()).rkey };
        Ok(MemoryWindow {
            raw,
            kind,
            region: None,
            earlier: Vec::new(),
            rkey,
            _pd: pd.clone(),
        })
    }

    /// The key of the window's latest bind (what a peer uses once the bind completed,
    /// and what LOCAL_INV revokes).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Type 1 or 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }

    /// Binds a type 1 window to `range` of `mr` (`ibv_bind_mw`); an empty range
    /// unbinds it. The bind completes on `qp`'s send CQ as `wr_id`; the window's new
    /// rkey is returned. The window keeps `mr` alive, and every region it was bound
    /// to before, until [`Self::release_region`] or its drop. A `wr_id` with bit 63
    /// set is refused: those are [`crate::LeasedQp`]'s, which knows its requests'
    /// completions by them.
    pub fn bind(
        &mut self,
        qp: &QueuePair<Rts>,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
        access: Access,
        wr_id: u64,
    ) -> Result<u32> {
        if self.kind != MwType::Type1 {
            return Err(Error::InvalidArgument(
                "ibv_bind_mw binds type 1 windows; use SendWr::bind_mw for type 2".into(),
            ));
        }
        if wr_id & crate::lease::LEASED_BIT != 0 {
            return Err(Error::InvalidArgument(
                format!(
                    "ibv_bind_mw: work request id {wr_id:#x} has bit 63 set, which is \
                     reserved for LeasedQp's requests; use an id below 2^63"
                )
                .into(),
            ));
        }
        // Binds are RC and UC work requests: mlx5 builds a UD request's datagram
        // segment from its address handle, which a bind has not (a null pointer).
        if qp.qp_type() == crate::qp::QpType::Ud {
            return Err(Error::InvalidArgument(
                "ibv_bind_mw: a UD queue pair cannot bind a window (binds are RC and UC \
                 work requests)"
                    .into(),
            ));
        }
        // The window's driver posts the bind on `qp`: a queue pair of another
        // protection domain, perhaps another device's, must not reach it.
        self.check_pd("ibv_bind_mw", mr, Some(qp.pd()))?;
        let remote = mr.remote(range)?;
        mr.check_window_access(access)?;
        let mut bind = sys::ibv_mw_bind {
            wr_id,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            bind_info: sys::ibv_mw_bind_info {
                mr: mr.as_raw(),
                addr: remote.addr,
                length: remote.len,
                mw_access_flags: access.bits(),
            },
        };
        self.keep(mr);
        // SAFETY: QP, window and region are alive and of one protection domain
        // (checked); the window keeps the region registered (alive) while it may be
        // bound to it.
        let ret = unsafe { sys::ibv_bind_mw(qp.as_raw(), self.raw.as_ptr(), &mut bind) };
        check("ibv_bind_mw", ret).map_err(|e| match e {
            // Soft-RoCE posts the bind as a send, which a failed doorbell leaves
            // queued (see `Error::Queued`); `ibv_bind_mw` does not say which.
            // (EINVAL: refused before anything was queued; no doorbell says it.)
            Error::Verb { verb, source, .. }
                if qp.send_cq().maybe_soft_roce()
                    && source.raw_os_error() != Some(libc::EINVAL) =>
            {
                Error::Queued { verb, source }
            }
            e => e,
        })?;
        // SAFETY: the window is alive; `ibv_bind_mw` updated its key.
        self.rkey = unsafe { (*self.raw.as_ptr()).rkey };
        Ok(self.rkey)
    }

    /// Refuses a region (and queue pair) of another protection domain than the
    /// window's: a driver takes the objects a bind names for its own, and those of
    /// another device are not (memory corruption in the C library).
    fn check_pd(
        &self,
        verb: &str,
        mr: &MemoryRegion,
        qp: Option<&Arc<ProtectionDomain>>,
    ) -> Result<()> {
        let pd = self._pd.as_raw();
        let foreign = if mr.pd().as_raw() != pd {
            "region"
        } else if qp.is_some_and(|q| q.as_raw() != pd) {
            "queue pair"
        } else {
            return Ok(());
        };
        Err(Error::InvalidArgument(
            format!("{verb}: the {foreign} is of another protection domain than the window").into(),
        ))
    }

    /// Holds `mr` for as long as the window may be bound to it. The previous region
    /// is held too: its binding stays valid until this bind has run (and for good
    /// if this bind fails), so it must not be freed, nor lent out as a slice as a
    /// region no window reaches. Each region is held once.
    fn keep(&mut self, mr: &Arc<MemoryRegion>) {
        if self.region.as_ref().is_some_and(|h| Arc::ptr_eq(h, mr)) {
            return;
        }
        self.earlier.retain(|h| !Arc::ptr_eq(h, mr));
        if let Some(previous) = self.region.replace(mr.clone()) {
            self.earlier.push(previous);
        }
    }

    /// The key for a type 2 bind about to be built: the provider's copy of the window
    /// key is brought up to the latest bind (posted by now: binds of one window are
    /// posted in the order they are built), and the next key is returned.
    fn next_key(&mut self) -> u32 {
        // SAFETY: the window is alive and `&mut self` excludes any concurrent bind
        // (the provider reads this field only while a bind of it is posted).
        unsafe { (*self.raw.as_ptr()).rkey = self.rkey };
        // SAFETY: a pure function of its argument.
        self.rkey = unsafe { sys::ibv_inc_rkey(self.rkey) };
        self.rkey
    }

    /// The region of the latest bind, if any.
    pub fn region(&self) -> Option<Arc<MemoryRegion>> {
        self.region.clone()
    }

    /// Lets go of the regions of the binds so far (so that their owners can reuse
    /// them) and returns the latest one.
    ///
    /// # Safety
    /// The window must not be bound: the completion of its invalidation (LOCAL_INV, or
    /// a received SEND_WITH_INV of its rkey, or a zero-length type 1 bind) has been
    /// polled, and no bind of it is outstanding (a bind that failed with
    /// [`Error::Queued`] is, until the queue pair's destruction).
    pub unsafe fn release_region(&mut self) -> Option<Arc<MemoryRegion>> {
        self.earlier.clear();
        self.region.take()
    }

    /// The raw `ibv_mw`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_mw {
        self.raw.as_ptr()
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        let ret = unsafe { sys::ibv_dealloc_mw(self.raw.as_ptr()) };
        if ret != 0 {
            // The window may still be bound: its regions must never be freed.
            std::mem::forget(self.region.take());
            std::mem::forget(std::mem::take(&mut self.earlier));
        }
    }
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("kind", &self.kind)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl<'a> SendWr<'a> {
    /// BIND_MW: binds type 2 window `mw` to `range` of `mr` with a new rkey
    /// (`ibv_inc_rkey` of the current one), returned with the request. The window
    /// keeps `mr` alive from now on (until [`MemoryWindow::release_region`] or its
    /// drop), so the region cannot be freed while a peer may write through the window.
    /// A region of another protection domain than the window's is refused; the
    /// queue pair the request is posted on must be of it too (`post_send`'s contract).
    pub fn bind_mw(
        wr_id: u64,
        mw: &'a mut MemoryWindow,
        mr: &'a Arc<MemoryRegion>,
        range: Range<usize>,
        access: Access,
    ) -> Result<(Self, u32)> {
        mw.check_pd("BIND_MW", mr, None)?;
        let remote = mr.remote(range)?;
        mr.check_window_access(access)?;
        if mw.kind != MwType::Type2 {
            return Err(Error::InvalidArgument(
                "a BIND_MW request binds type 2 windows; use MemoryWindow::bind for type 1".into(),
            ));
        }
        mw.keep(mr);
        let rkey = mw.next_key();
        let mut wr = SendWr::without_sges(wr_id, sys::ibv_wr_opcode::IBV_WR_BIND_MW);
        wr.raw_mut().__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw: mw.as_raw(),
            rkey,
            bind_info: sys::ibv_mw_bind_info {
                mr: mr.as_raw(),
                addr: remote.addr,
                length: remote.len,
                mw_access_flags: access.bits(),
            },
        };
        Ok((wr, rkey))
    }

    /// LOCAL_INV: invalidates `rkey` (a type 2 window's) on this side.
    pub fn local_invalidate(wr_id: u64, rkey: u32) -> Self {
        let mut wr = SendWr::without_sges(wr_id, sys::ibv_wr_opcode::IBV_WR_LOCAL_INV);
        wr.raw_mut().__bindgen_anon_1.invalidate_rkey = rkey;
        wr
    }
}
