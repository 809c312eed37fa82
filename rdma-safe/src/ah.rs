//! Address handles (`ibv_create_ah`): how a UD send reaches its destination.

use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::pd::ProtectionDomain;
use rdma_verbs_sys as sys;
use std::ptr::NonNull;
use std::sync::Arc;

/// Where a datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Our port, from 1.
    pub port: u8,
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Destination GID: required on RoCE.
    pub gid: Option<Gid>,
    /// Our GID index for the GRH.
    pub sgid_index: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// Service level.
    pub sl: u8,
}

impl AhAttr {
    /// A destination reached by GID from `sgid_index` on port 1 (RoCE, routed IB).
    pub fn global(gid: Gid, sgid_index: u8) -> Self {
        AhAttr {
            port: 1,
            dlid: 0,
            gid: Some(gid),
            sgid_index,
            hop_limit: 0xff,
            sl: 0,
        }
    }

    pub(crate) fn to_raw(self) -> sys::ibv_ah_attr {
        let mut raw = sys::ibv_ah_attr {
            dlid: self.dlid,
            sl: self.sl,
            port_num: self.port,
            ..Default::default()
        };
        if let Some(gid) = self.gid {
            raw.is_global = 1;
            raw.grh = sys::ibv_global_route {
                dgid: gid.to_raw(),
                sgid_index: self.sgid_index,
                hop_limit: self.hop_limit,
                ..Default::default()
            };
        }
        raw
    }
}

/// An address handle, destroyed after every request that names it completed (keep it
/// alive as long as such sends are outstanding).
pub struct AddressHandle {
    raw: NonNull<sys::ibv_ah>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: address handles are immutable device objects usable from any thread.
unsafe impl Send for AddressHandle {}
// SAFETY: as above.
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// Creates an address handle in `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, attr: &AhAttr) -> Result<Arc<Self>> {
        let mut raw_attr = attr.to_raw();
        // SAFETY: the PD is alive; `raw_attr` is fully initialised.
        let raw = unsafe { sys::ibv_create_ah(pd.as_raw(), &mut raw_attr) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::last("ibv_create_ah").with_hint(format!(
                "no route to the destination from GID index {}: on RoCE the destination \
                 needs a GID and a valid source GID index",
                attr.sgid_index
            ))
        })?;
        Ok(Arc::new(AddressHandle {
            raw,
            _pd: pd.clone(),
        }))
    }

    /// The raw `ibv_ah`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_ah {
        self.raw.as_ptr()
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let ret = unsafe { sys::ibv_destroy_ah(self.raw.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_destroy_ah failed");
    }
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle").finish_non_exhaustive()
    }
}
