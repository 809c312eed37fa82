//! Memory regions (`ibv_reg_mr`): memory the device may read and write.

use crate::access::Access;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use rdma_sys as sys;
use std::alloc::{self, Layout};
use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of the buffers that [`MemoryRegion::new`] allocates (one page).
pub const REGION_ALIGN: usize = 4096;

/// Where a peer finds memory: address, length and rkey, as sent in descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteSlice {
    /// Virtual address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The key that grants access.
    pub rkey: u32,
}

/// A local piece of registered memory, as a work request's scatter/gather entry
/// (laid out as `ibv_sge`).
///
/// It borrows its region, so the region cannot be dropped (deregistered) while a work
/// request built from it exists:
///
/// ```compile_fail
/// # use rdma_safe::*;
/// # fn f(pd: &std::sync::Arc<ProtectionDomain>) -> Result<()> {
/// let mr = MemoryRegion::new(pd, 64, Access::LOCAL_WRITE)?;
/// let mut sge = [mr.local(0..64)?];
/// drop(mr); // error: `mr` is still borrowed by the scatter/gather entry
/// let wr = SendWr::send(1, &mut sge);
/// # Ok(()) }
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalSlice<'mr> {
    /// Start address.
    pub addr: u64,
    /// Length in bytes (at most 2 GiB per entry for most devices).
    pub len: u32,
    /// The local key.
    pub lkey: u32,
    _region: PhantomData<&'mr MemoryRegion>,
}

impl LocalSlice<'_> {
    /// An entry for memory this crate does not know (inline data, user-registered
    /// memory).
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid (and registered under `lkey`, unless the
    /// request is inline) for as long as the device may use it.
    pub unsafe fn from_raw_parts(addr: u64, len: u32, lkey: u32) -> LocalSlice<'static> {
        LocalSlice {
            addr,
            len,
            lkey,
            _region: PhantomData,
        }
    }

    /// The bindings' scatter/gather entry.
    pub fn to_sge(self) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
        }
    }
}

/// Registers `len` bytes at `addr`, turning a memlock failure into a helpful error.
fn reg(
    pd: &ProtectionDomain,
    addr: *mut u8,
    len: usize,
    access: Access,
) -> Result<NonNull<sys::ibv_mr>> {
    // SAFETY: the caller guarantees `addr..addr+len` is valid memory that outlives the
    // registration; the PD is alive.
    let mr = unsafe { sys::ibv_reg_mr(pd.as_raw(), addr.cast(), len, access.bits() as i32) };
    NonNull::new(mr).ok_or_else(|| {
        let err = Error::last("ibv_reg_mr");
        match err.errno() {
            Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN) => err.with_hint(format!(
                "registering {len} bytes pins them in memory; the locked-memory limit is {} \
                 (raise it with `ulimit -l unlimited`, `LimitMEMLOCK=infinity` for services, \
                 or /etc/security/limits.conf)",
                memlock_limit_text()
            )),
            Some(libc::EINVAL) => err.with_hint(format!(
                "access flags {access:?} or the length {len} are not allowed by this device"
            )),
            _ => err,
        }
    })
}

/// The current `RLIMIT_MEMLOCK`, as text.
fn memlock_limit_text() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return "unknown".into();
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} KiB", lim.rlim_cur / 1024)
    }
}

/// A registered buffer that this value owns: allocated page-aligned and zeroed,
/// registered on creation, deregistered and then freed on drop. The memory cannot be
/// freed while registered.
pub struct MemoryRegion {
    mr: NonNull<sys::ibv_mr>,
    buf: NonNull<u8>,
    len: usize,
    access: Access,
    /// False for memory registered with [`MemoryRegion::register_raw`]: not ours to free.
    owned: bool,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the buffer is owned and only reached through `&self`/`&mut self`; the MR
// handle is thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access only reads (slices are handed out by `&self`).
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Allocates `len` zeroed bytes and registers them with `access`.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a memory region needs at least one byte".into(),
            ));
        }
        let layout = Layout::from_size_align(len, REGION_ALIGN).map_err(|_| {
            Error::InvalidArgument(format!("region of {len} bytes is too large").into())
        })?;
        // SAFETY: the layout has a non-zero size.
        let buf = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::InvalidArgument(format!("cannot allocate {len} bytes").into()))?;
        match reg(pd, buf.as_ptr(), len, access) {
            Ok(mr) => Ok(MemoryRegion {
                mr,
                buf,
                len,
                access,
                owned: true,
                pd: pd.clone(),
            }),
            Err(err) => {
                // SAFETY: allocated above with this layout and not registered.
                unsafe { alloc::dealloc(buf.as_ptr(), layout) };
                Err(err)
            }
        }
    }

    /// Registers memory the caller manages (`ibv_reg_mr` on `addr..addr+len`). The
    /// region deregisters on drop but never frees the memory.
    ///
    /// # Safety
    /// `addr..addr+len` must be valid, readable and writable memory that stays
    /// allocated until the region is dropped, and that nothing else reads or writes
    /// while the region's slices are borrowed or the device may access it.
    pub unsafe fn register_raw(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        let buf = NonNull::new(addr)
            .ok_or_else(|| Error::InvalidArgument("cannot register a null address".into()))?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a memory region needs at least one byte".into(),
            ));
        }
        let mr = reg(pd, buf.as_ptr(), len, access)?;
        Ok(MemoryRegion {
            mr,
            buf,
            len,
            access,
            owned: false,
            pd: pd.clone(),
        })
    }

    /// Changes the access flags (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS`);
    /// the keys may change. Nothing may be outstanding on the region.
    pub fn rereg_access(&mut self, access: Access) -> Result<()> {
        // SAFETY: the MR is registered; `&mut self` means no request built from this
        // region (they borrow it) exists; other arguments are unused for this flag.
        let ret = unsafe {
            sys::ibv_rereg_mr(
                self.mr.as_ptr(),
                sys::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS.0 as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                access.bits() as i32,
            )
        };
        if ret != 0 {
            let err = Error::last("ibv_rereg_mr");
            let hint = if err.errno() == Some(libc::EOPNOTSUPP) {
                "this device cannot re-register (Soft-RoCE cannot): register a new region \
                 instead; this one is unchanged"
                    .to_string()
            } else {
                format!("ibv_rereg_mr code {ret}")
            };
            return Err(err.with_hint(hint));
        }
        self.access = access;
        Ok(())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access flags it was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered while `self` lives.
        unsafe { self.mr.as_ref().lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: the MR is registered while `self` lives.
        unsafe { self.mr.as_ref().rkey }
    }

    /// Start address of the buffer.
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// The bytes. The device may write into them while receives or READs are posted:
    /// read them after the completion.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `buf` holds `len` initialised (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr(), self.len) }
    }

    /// A checked sub-range as a scatter/gather entry.
    pub fn local(&self, range: Range<usize>) -> Result<LocalSlice<'_>> {
        self.check_range(&range)?;
        let len = u32::try_from(range.len()).map_err(|_| {
            Error::InvalidArgument("a scatter/gather entry holds at most 4 GiB - 1".into())
        })?;
        Ok(LocalSlice {
            addr: self.addr() + range.start as u64,
            len,
            lkey: self.lkey(),
            _region: PhantomData,
        })
    }

    /// A checked sub-range as a peer would address it.
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        self.check_range(&range)?;
        Ok(RemoteSlice {
            addr: self.addr() + range.start as u64,
            len: range.len() as u64,
            rkey: self.rkey(),
        })
    }

    fn check_range(&self, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::InvalidArgument(
                format!(
                    "range {range:?} is outside the region of {} bytes",
                    self.len
                )
                .into(),
            ));
        }
        Ok(())
    }

    /// The protection domain it is registered in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The raw `ibv_mr`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_mr {
        self.mr.as_ptr()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `new` and deregistered once, before the memory is freed.
        let ret = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_dereg_mr failed");
        if !self.owned {
            return;
        }
        let layout = Layout::from_size_align(self.len, REGION_ALIGN).expect("checked in new");
        // SAFETY: allocated in `new` with this layout; no longer registered.
        unsafe { alloc::dealloc(self.buf.as_ptr(), layout) };
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}
