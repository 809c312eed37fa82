//! An open device (`ibv_context`) and its queries: device, port, GID table.

use crate::device::DeviceList;
use crate::error::{check, Error, Result};
use crate::gid::{Gid, GidEntry, GidType};
use rdma_verbs_sys as sys;
use std::ptr::NonNull;
use std::sync::Arc;

/// An open RDMA device, closed with `ibv_close_device` when the last `Arc` goes.
///
/// Every object created from it (protection domains, completion queues, ...) holds an
/// `Arc<Context>`, so the device stays open as long as any of them lives.
pub struct Context {
    raw: NonNull<sys::ibv_context>,
}

// SAFETY: libibverbs contexts are thread-safe: the library locks internally.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

/// The variables with which providers take no lock on their queues when set to
/// `1`: rdma-core's mlx5, and the out-of-tree libmlx4 (MLNX_OFED) and libbnxt_re
/// (Broadcom). mlx5 reads its variable into a global whenever it opens a device
/// and applies it to every queue it creates afterwards.
const SINGLE_THREADED: [&str; 3] = [
    "MLX5_SINGLE_THREADED",
    "MLX4_SINGLE_THREADED",
    "BNXT_SINGLE_THREADED",
];

/// Refuses when `name` (one of [`SINGLE_THREADED`]) is `value` = `1`: every
/// rdma-safe object is `Send + Sync` on the strength of the providers' locks
/// (`docs/safety.md`, section 6).
pub(crate) fn provider_locks(name: &str, value: Option<&std::ffi::OsStr>) -> Result<()> {
    if value.is_some_and(|v| v == "1") {
        return Err(Error::Refused(
            format!(
                "{name}=1 switches off the provider's locks, which rdma-safe's Send and \
                 Sync rest on: unset it before opening a device or creating a queue"
            )
            .into(),
        ));
    }
    Ok(())
}

/// [`provider_locks`] of this process's environment, for every variable: checked
/// where a device is opened and where a queue is created.
pub(crate) fn check_provider_locks() -> Result<()> {
    SINGLE_THREADED
        .iter()
        .try_for_each(|name| provider_locks(name, std::env::var_os(name).as_deref()))
}

impl Context {
    /// Opens the device called `name`, or the first device when `name` is `None`.
    ///
    /// ```no_run
    /// let ctx = rdma_safe::Context::open(Some("rxe0"))?;
    /// println!("{} port(s)", ctx.query_device()?.phys_port_cnt());
    /// # Ok::<(), rdma_safe::Error>(())
    /// ```
    pub fn open(name: Option<&str>) -> Result<Arc<Context>> {
        DeviceList::new()?.find(name)?.open()
    }

    /// Takes ownership of an open context.
    ///
    /// # Safety
    /// `raw` must be an open context that nothing else closes.
    pub unsafe fn from_raw(raw: NonNull<sys::ibv_context>) -> Self {
        Context { raw }
    }

    /// The raw `ibv_context`, for escape hatches. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }

    /// The device's kernel name.
    pub fn name(&self) -> String {
        // SAFETY: an open context has a valid device with a NUL-terminated name.
        unsafe { std::ffi::CStr::from_ptr(sys::ibv_get_device_name((*self.as_raw()).device)) }
            .to_string_lossy()
            .into_owned()
    }

    /// The device's transport type.
    pub fn transport(&self) -> sys::ibv_transport_type {
        // SAFETY: an open context has a valid device.
        unsafe { (*(*self.as_raw()).device).transport_type }
    }

    /// How many completion vectors (interrupt channels) the device offers: the range
    /// of a completion queue's `vector` is `0..num_comp_vectors()`.
    pub fn num_comp_vectors(&self) -> i32 {
        // SAFETY: an open context is valid; the field is set once when it is opened.
        unsafe { (*self.as_raw()).num_comp_vectors }
    }

    /// Device attributes, extended where the provider supports it (`ibv_query_device_ex`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = sys::ibv_device_attr_ex::default();
        // SAFETY: the context is open; `attr` is a valid out-pointer; NULL input is allowed.
        let ret = unsafe { sys::ibv_query_device_ex(self.as_raw(), std::ptr::null(), &mut attr) };
        if ret != 0 {
            // Providers without the extended query: fall back to the basic one.
            // SAFETY: as above, for the basic attributes.
            check("ibv_query_device", unsafe {
                sys::ibv_query_device(self.as_raw(), &mut attr.orig_attr)
            })?;
        }
        Ok(DeviceAttr(attr))
    }

    /// Attributes of port `port` (numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: the context is open; `attr` is a valid out-pointer.
        check("ibv_query_port", unsafe {
            sys::___ibv_query_port(self.as_raw(), port, &mut attr)
        })
        .map_err(|e| e.with_hint(format!("does the device have a port {port}?")))?;
        Ok(PortAttr(attr))
    }

    /// The GID at `index` of `port`'s table (all zeros for an unused entry).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let mut gid = sys::ibv_gid::default();
        // SAFETY: the context is open; `gid` is a valid out-pointer.
        check("ibv_query_gid", unsafe {
            sys::ibv_query_gid(self.as_raw(), port, index as i32, &mut gid)
        })?;
        // SAFETY: every bit pattern of the union is a valid `raw` array.
        Ok(Gid(unsafe { gid.raw }))
    }

    /// The GID entry at `index` of `port` with its type (IB, RoCE v1, RoCE v2).
    pub fn query_gid_entry(&self, port: u8, index: u32) -> Result<GidEntry> {
        let mut entry = sys::ibv_gid_entry::default();
        // SAFETY: the context is open; `entry` is a valid out-pointer; flags must be 0.
        check("ibv_query_gid_ex", unsafe {
            sys::ibv_query_gid_ex(self.as_raw(), port as u32, index, &mut entry, 0)
        })?;
        Ok(GidEntry::from_raw(&entry))
    }

    /// Every valid GID entry of every port (`ibv_query_gid_table`).
    pub fn gid_table(&self) -> Result<Vec<GidEntry>> {
        let attr = self.query_device()?;
        let mut max = 0usize;
        for port in 1..=attr.phys_port_cnt() {
            max += self.query_port(port)?.gid_tbl_len() as usize;
        }
        let mut entries = vec![sys::ibv_gid_entry::default(); max.max(1)];
        // SAFETY: `entries` has room for `entries.len()` entries; flags must be 0.
        let n = unsafe {
            sys::ibv_query_gid_table(self.as_raw(), entries.as_mut_ptr(), entries.len(), 0)
        };
        if n < 0 {
            return Err(Error::verb("ibv_query_gid_table", (-n) as i32));
        }
        Ok(entries[..n as usize]
            .iter()
            .map(GidEntry::from_raw)
            .collect())
    }

    /// The first RoCE v2 GID of `port` holding an IPv4-mapped address, else index 0.
    ///
    /// That is the entry perftest's `-x` and `ibv_rc_pingpong -g` want on RoCE.
    pub fn default_gid_index(&self, port: u8) -> Result<u32> {
        let table = self.gid_table()?;
        Ok(table
            .iter()
            .find(|e| {
                e.port == port as u32 && e.gid_type == GidType::RoceV2 && e.gid.is_ipv4_mapped()
            })
            .map_or(0, |e| e.index))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context is open and closed once; every child holds an Arc to
        // `self`, so none is left.
        let ret = unsafe { sys::ibv_close_device(self.raw.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_close_device failed");
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name())
            .finish()
    }
}

/// The vendor id Soft-RoCE (`rdma_rxe`) reports (`RXE_VENDOR_ID` in Linux).
const SOFT_ROCE_VENDOR_ID: u32 = 0xFF_FFFF;

/// Device attributes (`ibv_device_attr_ex`).
#[derive(Clone, Copy)]
pub struct DeviceAttr(pub sys::ibv_device_attr_ex);

impl DeviceAttr {
    /// The basic attributes (`ibv_device_attr`), every field public.
    pub fn raw(&self) -> &sys::ibv_device_attr {
        &self.0.orig_attr
    }

    /// Number of physical ports.
    pub fn phys_port_cnt(&self) -> u8 {
        self.0.orig_attr.phys_port_cnt
    }

    /// The mask of completion timestamps (`completion_timestamp_mask`); 0 when the
    /// device cannot timestamp completions (rxe).
    pub fn completion_timestamp_mask(&self) -> u64 {
        self.0.completion_timestamp_mask
    }

    /// The device's clock in kHz for its completion timestamps (`hca_core_clock`).
    pub fn hca_core_clock(&self) -> u64 {
        self.0.hca_core_clock
    }

    /// Bytes of on-device memory `ibv_alloc_dm` can allocate (`max_dm_size`); 0 when
    /// the device has none (rxe).
    pub fn max_dm_size(&self) -> u64 {
        self.0.max_dm_size
    }

    /// Firmware version text.
    pub fn fw_ver(&self) -> String {
        let raw = &self.0.orig_attr.fw_ver;
        let bytes: Vec<u8> = raw
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether this is Soft-RoCE (Linux's `rdma_rxe`), known by the vendor id it
    /// reports, 0xFFFFFF (as SPDK tells it apart). Software that must work around
    /// one of its behaviours asks this rather than the device's name, which the
    /// administrator chooses.
    pub fn is_soft_roce(&self) -> bool {
        self.0.orig_attr.vendor_id == SOFT_ROCE_VENDOR_ID
    }

    /// Node GUID in host order.
    pub fn node_guid(&self) -> u64 {
        u64::from_be(self.0.orig_attr.node_guid)
    }

    /// System image GUID in host order.
    pub fn sys_image_guid(&self) -> u64 {
        u64::from_be(self.0.orig_attr.sys_image_guid)
    }

    /// Largest number of scatter/gather entries per work request.
    pub fn max_sge(&self) -> u32 {
        self.0.orig_attr.max_sge as u32
    }

    /// Largest number of outstanding work requests per queue.
    pub fn max_qp_wr(&self) -> u32 {
        self.0.orig_attr.max_qp_wr as u32
    }
}

/// Port attributes (`ibv_port_attr`).
#[derive(Clone, Copy)]
pub struct PortAttr(pub sys::ibv_port_attr);

impl PortAttr {
    /// Logical state.
    pub fn state(&self) -> sys::ibv_port_state {
        self.0.state
    }

    /// True when the port is `PORT_ACTIVE`.
    pub fn is_active(&self) -> bool {
        self.0.state == sys::ibv_port_state::IBV_PORT_ACTIVE
    }

    /// Largest MTU the port supports.
    pub fn max_mtu(&self) -> sys::ibv_mtu {
        self.0.max_mtu
    }

    /// MTU in use.
    pub fn active_mtu(&self) -> sys::ibv_mtu {
        self.0.active_mtu
    }

    /// Base LID (0 on RoCE, which routes by GID).
    pub fn lid(&self) -> u16 {
        self.0.lid
    }

    /// True for RoCE (Ethernet link layer): addressing needs a GID.
    pub fn is_ethernet(&self) -> bool {
        self.0.link_layer as u32 == sys::IBV_LINK_LAYER_ETHERNET
    }

    /// Size of the GID table.
    pub fn gid_tbl_len(&self) -> i32 {
        self.0.gid_tbl_len
    }
}

impl std::fmt::Debug for PortAttr {
    /// The state and MTUs by name, or as `ibv_port_state(<number>)` / `ibv_mtu(<number>)`
    /// when the headers do not list the value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortAttr")
            .field("state", &self.0.state)
            .field("max_mtu", &self.0.max_mtu)
            .field("active_mtu", &self.0.active_mtu)
            .field("lid", &self.0.lid)
            .field("link_layer", &self.0.link_layer)
            .field("gid_tbl_len", &self.0.gid_tbl_len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_threaded_1_is_refused() {
        let refused = provider_locks("MLX5_SINGLE_THREADED", Some("1".as_ref())).unwrap_err();
        assert!(matches!(refused, Error::Refused(_)), "{refused:?}");
        let text = refused.to_string();
        assert!(text.contains("MLX5_SINGLE_THREADED=1"), "{text}");
        assert!(text.contains("unset it"), "{text}");
        // mlx5 itself takes anything but "1" as "keep the locks".
        for value in [None, Some("0"), Some(""), Some("yes"), Some("1 ")] {
            let got = provider_locks("MLX5_SINGLE_THREADED", value.map(AsRef::as_ref));
            assert!(got.is_ok(), "{value:?}");
        }
    }

    #[test]
    fn unlisted_port_state_and_mtu_are_reported_with_their_number() {
        // A port attribute as a kernel newer than these headers could fill it.
        let port = PortAttr(sys::ibv_port_attr {
            // What C may write there: numbers no enum of these headers lists.
            state: sys::ibv_port_state(0x7777),
            max_mtu: sys::ibv_mtu(0x7777),
            active_mtu: sys::ibv_mtu(0x7778),
            ..Default::default()
        });
        assert!(!port.is_active());
        assert_eq!(port.state().0, 0x7777);
        assert_eq!(port.state().name(), None);
        assert_eq!(port.max_mtu().0, 0x7777);
        assert_eq!(port.active_mtu().0, 0x7778);
        assert_eq!(port.active_mtu().name(), None);
        let text = format!("{port:?}");
        assert!(text.contains("state: ibv_port_state(30583)"), "{text}");
        assert!(text.contains("max_mtu: ibv_mtu(30583)"), "{text}");
        assert!(text.contains("active_mtu: ibv_mtu(30584)"), "{text}");
    }

    #[test]
    fn listed_port_state_and_mtu_show_their_names() {
        let port = PortAttr(sys::ibv_port_attr {
            state: sys::ibv_port_state::IBV_PORT_ACTIVE,
            active_mtu: sys::ibv_mtu::IBV_MTU_1024,
            ..Default::default()
        });
        assert!(port.is_active());
        let text = format!("{port:?}");
        assert!(text.contains("state: IBV_PORT_ACTIVE"), "{text}");
        assert!(text.contains("active_mtu: IBV_MTU_1024"), "{text}");
    }
}
