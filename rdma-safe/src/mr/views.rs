//! Read views: registrations over part of a region's bytes that grant nothing
//! themselves and let memory windows grant RDMA READ within exactly that part, kept
//! by the region for reuse and dropped with it, before its memory.
//!
//! A device that checks a window's accesses against the region it is bound to, not
//! against the window's own bounds (rxe does), needs such a view for a window to
//! hold its bounds. Registering one per message costs a system call and pinning
//! pages; a region sent again and again over the same bytes reuses its view.

use super::MemoryRegion;
use crate::access::Access;
use crate::error::Result;
use crate::pd::ProtectionDomain;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Ranges whose views a region keeps; the oldest goes when another is added.
pub const READ_VIEWS_KEPT: usize = 8;

/// The views a region keeps, newest last; boxed on first use, so that a region
/// that never gives a view stays small.
#[derive(Default)]
pub(super) struct Views(Mutex<Option<Box<Kept>>>);

/// The kept views and the ranges of the region they cover, and the views let go
/// of while something else still held them (watched until the region drops).
#[derive(Default)]
struct Kept {
    list: Vec<(Range<usize>, Arc<MemoryRegion>)>,
    retired: Vec<Arc<MemoryRegion>>,
}

impl Views {
    /// Drops every view (the region is being dropped); false if some view is still
    /// held elsewhere, so that its windows may still reach the region's memory.
    pub(super) fn release(&mut self) -> bool {
        let kept = self.0.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        let Some(kept) = kept else {
            return true;
        };
        let Kept { list, retired } = *kept;
        // `&mut` on the region: no `read_view` call can clone a view meanwhile. Each
        // view held nowhere else is deregistered here, so that one whose
        // deregistration fails keeps the region's memory from being freed.
        let views = list.into_iter().map(|(_, v)| v).chain(retired);
        views.fold(true, |gone, view| {
            let released = match Arc::try_unwrap(view) {
                Ok(mut view) => view.release(),
                Err(_) => false,
            };
            gone & released
        })
    }
}

/// A read view and whether it was registered for this call.
pub struct ReadView {
    /// The view: bind windows to it, granting at most `REMOTE_READ`.
    pub view: Arc<MemoryRegion>,
    /// True when this call registered it; false when a kept view was reused.
    pub registered: bool,
}

impl MemoryRegion {
    /// A registration over exactly `range` of this region's bytes that grants
    /// nothing itself and lets memory windows bound to it grant `REMOTE_READ` (a
    /// window bound to the whole region could reach its other bytes on a device
    /// that checks only the region, as rxe does). The region keeps the views of its
    /// last [`READ_VIEWS_KEPT`] ranges: asking again for one of them registers
    /// nothing. Kept views are dropped with the region, before its memory.
    ///
    /// Each kept view pins its pages again, so they count again against the
    /// locked-memory limit for as long as the region lives.
    ///
    /// # Safety
    /// The view reaches this region's memory: no window may stay bound to it, and it
    /// may not be used, once this region is dropped. Drop (or unbind) every window
    /// bound to it, and every handle on it, before the region. It is for binding
    /// windows that grant at most `REMOTE_READ` only: never read or write its bytes
    /// through it (`as_slice`, `read_at`, `as_mut_slice` and `write_at` refuse; do
    /// not call `to_vec` or the unchecked slices on it), nor widen its access or
    /// window rights: the region may lend the same bytes as slices, mutable ones
    /// too, meanwhile.
    pub unsafe fn read_view(&self, range: Range<usize>) -> Result<ReadView> {
        let mut guard = self.views.0.lock().unwrap_or_else(|e| e.into_inner());
        let kept = guard.get_or_insert_with(Default::default);
        kept.retired.retain(|v| Arc::strong_count(v) > 1);
        if let Some((_, view)) = kept.list.iter().find(|(r, _)| *r == range) {
            return Ok(ReadView {
                view: view.clone(),
                registered: false,
            });
        }
        // SAFETY: the view is kept in this region and dropped before its memory,
        // and the caller drops its own handles and windows first (the contract).
        let view = Arc::new(unsafe { self.new_read_view(&self.pd, range.clone()) }?);
        if kept.list.len() == READ_VIEWS_KEPT {
            let (_, oldest) = kept.list.remove(0);
            if Arc::strong_count(&oldest) > 1 {
                kept.retired.push(oldest);
            }
        }
        kept.list.push((range, view.clone()));
        Ok(ReadView {
            view,
            registered: true,
        })
    }

    /// A read view as [`Self::read_view`] gives, registered in `pd` (which may be
    /// another protection domain than this region's) and not kept: the caller keeps
    /// it, and drops it before this region.
    ///
    /// # Safety
    /// As for [`Self::read_view`]: no window may stay bound to the view, and it may
    /// not be used, once this region is dropped; nothing reads or writes its bytes
    /// through it or widens it.
    pub unsafe fn new_read_view(
        &self,
        pd: &Arc<ProtectionDomain>,
        range: Range<usize>,
    ) -> Result<MemoryRegion> {
        let at = self.remote(range.clone())?.addr;
        // SAFETY: `range` lies in this region (checked by `remote`), whose memory is
        // valid and registered; the caller drops the view before this region.
        let mut view =
            unsafe { MemoryRegion::register_raw(pd, at as *mut u8, range.len(), Access::MW_BIND) }?;
        view.set_window_rights(Access::REMOTE_READ);
        view.view = true;
        Ok(view)
    }
}
