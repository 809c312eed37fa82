//! The list of RDMA devices (`ibv_get_device_list`) and the devices in it.

use crate::context::Context;
use crate::error::{Error, Result};
use rdma_verbs_sys as sys;
use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

/// The RDMA devices of this machine, freed with `ibv_free_device_list` on drop.
///
/// Contexts opened from it stay valid after the list is gone.
pub struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

// SAFETY: the list is an immutable array of device pointers owned by this value;
// libibverbs allows using devices from any thread.
unsafe impl Send for DeviceList {}
// SAFETY: as above; nothing here is mutated through `&self`.
unsafe impl Sync for DeviceList {}

impl DeviceList {
    /// Reads the device list. An empty list is not an error here.
    pub fn new() -> Result<Self> {
        let mut len = 0;
        // SAFETY: `len` is a valid out-pointer; the list is freed in `Drop`.
        let list = unsafe { sys::ibv_get_device_list(&mut len) };
        let list = NonNull::new(list).ok_or_else(|| {
            Error::last("ibv_get_device_list")
                .with_hint("is the ib_uverbs kernel module loaded and /dev/infiniband present?")
        })?;
        Ok(DeviceList {
            list,
            len: len.max(0) as usize,
        })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the machine has no RDMA device.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The devices, in the order libibverbs lists them.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).map(move |i| Device {
            // SAFETY: `i < len`, and the list holds `len` valid device pointers while
            // `self` lives.
            raw: unsafe { *self.list.as_ptr().add(i) },
            _list: self,
        })
    }

    /// The device called `name`, or the first one when `name` is `None`.
    pub fn find(&self, name: Option<&str>) -> Result<Device<'_>> {
        let mut devices = self.iter();
        match name {
            None => devices.next().ok_or(Error::NoDevice),
            Some(wanted) => {
                if self.is_empty() {
                    return Err(Error::NoDevice);
                }
                self.iter()
                    .find(|d| d.name() == wanted)
                    .ok_or_else(|| Error::DeviceNotFound {
                        wanted: wanted.to_string(),
                        available: self.iter().map(|d| d.name()).collect::<Vec<_>>().join(", "),
                    })
            }
        }
    }

    /// The raw `ibv_device **` array (NULL-terminated), for escape hatches.
    pub fn as_raw(&self) -> *mut *mut sys::ibv_device {
        self.list.as_ptr()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from `ibv_get_device_list` and is freed once.
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// One device of a [`DeviceList`].
#[derive(Clone, Copy)]
pub struct Device<'list> {
    raw: *mut sys::ibv_device,
    _list: &'list DeviceList,
}

impl Device<'_> {
    /// The kernel name, e.g. `mlx5_0` or `rxe0`.
    pub fn name(&self) -> String {
        // SAFETY: `raw` is a valid device; the name is a NUL-terminated string it owns.
        unsafe { CStr::from_ptr(sys::ibv_get_device_name(self.raw)) }
            .to_string_lossy()
            .into_owned()
    }

    /// The node GUID in host order.
    pub fn guid(&self) -> u64 {
        // SAFETY: `raw` is a valid device.
        u64::from_be(unsafe { sys::ibv_get_device_guid(self.raw) })
    }

    /// The transport (InfiniBand for IB and RoCE, iWARP, ...).
    pub fn transport(&self) -> sys::ibv_transport_type {
        // SAFETY: `raw` is a valid device.
        unsafe { (*self.raw).transport_type }
    }

    /// The node type (CA, switch, router, RNIC, ...).
    pub fn node_type(&self) -> sys::ibv_node_type {
        // SAFETY: `raw` is a valid device.
        unsafe { (*self.raw).node_type }
    }

    /// Opens the device (`ibv_open_device`). Refused while `MLX5_SINGLE_THREADED`
    /// (or a like variable) is `1`, which switches off the provider locks
    /// rdma-safe relies on.
    pub fn open(&self) -> Result<Arc<Context>> {
        crate::context::check_provider_locks()?;
        // SAFETY: `raw` is a valid device of a live list.
        let ctx = unsafe { sys::ibv_open_device(self.raw) };
        let ctx = NonNull::new(ctx).ok_or_else(|| {
            Error::last("ibv_open_device")
                .with_hint("check the permissions of /dev/infiniband/uverbs*")
        })?;
        // SAFETY: `ctx` was just opened and is owned by the new Context.
        Ok(Arc::new(unsafe { Context::from_raw(ctx) }))
    }

    /// The raw `ibv_device`.
    pub fn as_raw(&self) -> *mut sys::ibv_device {
        self.raw
    }
}

impl std::fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .field("guid", &format_args!("{:016x}", self.guid()))
            .finish()
    }
}
