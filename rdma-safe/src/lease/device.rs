//! [`DeviceRegion`]: one registered buffer shared by many outstanding requests.

use crate::error::Result;
use crate::mr::{MemoryRegion, RemoteSlice};
use std::ops::Range;
use std::sync::Arc;

/// A region handed to the device as a whole: any number of requests, overlapping or
/// not, may read and write it at once (the C examples' single buffer that every receive
/// lands in and every send goes out of).
///
/// No clone reaches the bytes: there is no slice, no copy and no `&MemoryRegion` to be
/// had from it, so nothing the program does can race with the device. The region
/// comes back whole from [`DeviceRegion::into_region`] once no other clone is left:
/// every request posted on it ([`super::LeasedQp::post_send_device`],
/// [`super::LeasedQp::post_recv_device`]) holds one until the completion that
/// releases it was handed to [`super::LeasedQp::complete`], or until its queue pair was
/// destroyed (dropping the `LeasedQp`).
///
/// ```compile_fail
/// # use rdma_safe::lease::DeviceRegion;
/// # fn f(buffer: &DeviceRegion) {
/// let bytes = buffer.as_slice(); // error: a device region has no bytes to show
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct DeviceRegion(Arc<MemoryRegion>);

impl DeviceRegion {
    /// Hands `region` to the device. Fill it first: its bytes are out of reach until
    /// [`DeviceRegion::into_region`].
    pub fn new(region: MemoryRegion) -> Self {
        DeviceRegion(Arc::new(region))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A checked sub-range as a peer would address it (if the region was registered
    /// for remote access).
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        self.0.remote(range)
    }

    /// The region, if this is the last clone: no request holds it any more. Otherwise
    /// the value comes back unchanged; hand the outstanding completions to
    /// [`super::LeasedQp::complete`] (or drop the `LeasedQp`) and try again.
    pub fn into_region(self) -> std::result::Result<MemoryRegion, DeviceRegion> {
        Arc::try_unwrap(self.0).map_err(DeviceRegion)
    }

    /// Clones that exist, this one included: 1 + the requests that still hold it.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// The region, for posting only (private to the lease module: it must never reach
    /// code that could borrow its bytes).
    pub(super) fn region(&self) -> &MemoryRegion {
        &self.0
    }
}
