//! Memory regions (`ibv_reg_mr`): memory the device may read and write.

use crate::access::Access;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use rdma_verbs_sys as sys;
use std::alloc::{self, Layout};
use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

mod views;
pub use views::{ReadView, READ_VIEWS_KEPT};

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
/// request built from it exists. Its fields are read with [`LocalSlice::addr`],
/// [`LocalSlice::len`] and [`LocalSlice::lkey`]: an entry that names memory other
/// than the region it borrows is made only with the `unsafe`
/// [`LocalSlice::from_raw_parts`].
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
    addr: u64,
    len: u32,
    lkey: u32,
    _region: PhantomData<&'mr MemoryRegion>,
}

impl LocalSlice<'_> {
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes (at most 2 GiB per entry for most devices).
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True for an entry of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

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

/// What windows on a region registered with `access` may grant by default.
fn default_window_rights(access: Access) -> Access {
    if access.contains(Access::MW_BIND) {
        Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC
    } else {
        Access::NONE
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
    /// The most a memory window bound to this region may grant a peer.
    window_rights: Access,
    /// The region was registered for remote writes (or atomics) once, and
    /// `rereg_access` took them away: it stays [remotely
    /// writable](MemoryRegion::remotely_writable), since no verb promises that a
    /// peer's write let in before the change has landed by the time it returns.
    writes_granted: bool,
    /// False for memory registered with [`MemoryRegion::register_raw`]: not ours to free.
    owned: bool,
    /// A read view of another region's bytes ([`MemoryRegion::read_view`]): never
    /// written through, its access and window rights never widened.
    view: bool,
    /// Read views of this region's bytes ([`MemoryRegion::read_view`]), dropped first.
    views: views::Views,
    /// What [`Self::release`] found, once it ran (a view its region let go of:
    /// `views::Views::release`).
    released: Option<bool>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the buffer is owned and only reached through `&self`/`&mut self`; the MR
// handle is thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access only reads (slices and `read_at` take `&self`; writes need
// `&mut self`).
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
                window_rights: default_window_rights(access),
                writes_granted: false,
                owned: true,
                view: false,
                views: Default::default(),
                released: None,
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
            window_rights: default_window_rights(access),
            writes_granted: false,
            owned: false,
            view: false,
            views: Default::default(),
            released: None,
            pd: pd.clone(),
        })
    }

    /// Changes the access flags (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS`);
    /// the keys may change. Nothing may be outstanding on the region.
    ///
    /// Taking remote write (or atomic) access away does not make the region's bytes
    /// borrowable as slices again: a peer's RDMA WRITE the device let in before the
    /// change may still be landing when this returns (neither the verb nor the
    /// specification says otherwise; a provider may change the key in place), so the
    /// region stays [remotely writable](Self::remotely_writable). Read and write it
    /// with [`Self::read_at`] and [`Self::write_at`], or register a new region.
    pub fn rereg_access(&mut self, access: Access) -> Result<()> {
        self.refuse_if_view("rereg_access")?;
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
                // A failure that reached the kernel may have applied part of the
                // change (the man page: the region should not be used). Slices are
                // judged by the old rights and the new together from now on, so a
                // half-granted remote write still refuses them. (What windows may
                // be given keep the old rights; the device refuses a bind the
                // region does not in fact allow.)
                self.access |= access;
                format!(
                    "ibv_rereg_mr code {ret}; the region may have some of the new rights, \
                     and is treated as having both: register a new region instead"
                )
            };
            return Err(err.with_hint(hint));
        }
        // Its own key's rights only: a window's end with the window (`&mut self`
        // means none holds the region), as `set_window_rights` trusts.
        let writes = (Access::REMOTE_WRITE | Access::REMOTE_ATOMIC).bits();
        self.writes_granted |= self.access.bits() & writes != 0;
        self.access = access;
        self.window_rights = default_window_rights(access);
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
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: the MR is registered while `self` lives.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// Start address of the buffer.
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// True when a peer may write into the region at any time: it was registered with
    /// `REMOTE_WRITE` or `REMOTE_ATOMIC`, or a memory window bound to it may grant
    /// remote writes or atomics (`MW_BIND`, unless [`Self::set_window_rights`] limited
    /// windows to reads), or it was remotely writable before [`Self::rereg_access`]
    /// took that away.
    pub fn remotely_writable(&self) -> bool {
        let writes = (Access::REMOTE_WRITE | Access::REMOTE_ATOMIC).bits();
        self.writes_granted || (self.access.bits() | self.window_rights.bits()) & writes != 0
    }

    /// The most a memory window bound to this region may grant: every remote access
    /// for a region registered with `MW_BIND`, nothing otherwise.
    pub fn window_rights(&self) -> Access {
        self.window_rights
    }

    /// Limits what windows bound to this region may grant to `rights` (remote
    /// read, write and atomic flags; others are ignored); binds asking for more are
    /// refused. A region whose windows may only grant `REMOTE_READ` (and which is not
    /// itself registered for remote writes) is not [remotely
    /// writable](Self::remotely_writable): its bytes can be borrowed as slices while
    /// peers read them through windows. `&mut self`: no window is bound to it now
    /// (a window holds an `Arc` of every region it may be bound to) and no slice is
    /// borrowed. A read view
    /// ([`Self::read_view`]) can only be narrowed.
    pub fn set_window_rights(&mut self, rights: Access) {
        let remote = (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC).bits();
        let allowed = match self.view {
            true => self.window_rights.bits(),
            false => default_window_rights(self.access).bits(),
        };
        self.window_rights = Access::from_bits(rights.bits() & remote & allowed);
    }

    /// Refuses to read or write through, or re-register, a read view: its bytes are
    /// another region's, which may lend them as slices (mutable ones too) meanwhile.
    fn refuse_if_view(&self, what: &str) -> Result<()> {
        if self.view {
            return Err(Error::InvalidArgument(
                format!(
                    "{what}: this is a read view of another region's bytes \
                     (MemoryRegion::read_view), for binding read-only windows; read, \
                     write or re-register the region itself"
                )
                .into(),
            ));
        }
        Ok(())
    }

    /// Refuses a window bind asking for more than [`Self::window_rights`].
    pub(crate) fn check_window_access(&self, access: Access) -> Result<()> {
        let remote = (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC).bits();
        let asked = access.bits() & remote;
        if asked & !self.window_rights.bits() != 0 {
            return Err(Error::InvalidArgument(
                format!(
                    "a window on this region may grant at most {:?}, not {:?} (see \
                     MemoryRegion::set_window_rights; binding needs MW_BIND access)",
                    self.window_rights,
                    Access::from_bits(asked)
                )
                .into(),
            ));
        }
        Ok(())
    }

    /// The bytes, for a region no peer can write into.
    ///
    /// Fails for a read view ([`Self::read_view`]), whose region may lend the same
    /// bytes mutably meanwhile, and for a [remotely writable](Self::remotely_writable)
    /// region: a peer (or an
    /// RDMA WRITE posted on another queue pair of this program) may write into it at any
    /// moment, and a Rust slice over bytes that change under it is a data race. Copy
    /// them out with [`Self::read_at`] instead, or use [`Self::as_slice_unchecked`]
    /// where the protocol guarantees no writer. The device's own writes (receives, READ
    /// and atomic results) cannot race with this borrow: posting them needs the region
    /// leased exclusively ([`crate::lease`]) or an `unsafe` post.
    pub fn as_slice(&self) -> Result<&[u8]> {
        self.refuse_if_view("as_slice")?;
        self.refuse_if_remotely_writable("as_slice", "read_at")?;
        // SAFETY: no peer can write into the region (checked above); local device
        // writes need an exclusive lease or an unsafe post whose contract forbids
        // borrowing the bytes meanwhile.
        Ok(unsafe { self.as_slice_unchecked() })
    }

    /// The bytes, mutably, for a region no peer can write into; fails as
    /// [`Self::as_slice`] does (use [`Self::write_at`] for a remotely writable one).
    /// A peer allowed to READ the region may read while the bytes are written, and
    /// then gets some old and some new: keep such reads apart by the protocol.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.refuse_if_view("as_mut_slice")?;
        self.refuse_if_remotely_writable("as_mut_slice", "write_at")?;
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference.
        Ok(unsafe { self.as_mut_slice_unchecked() })
    }

    /// The bytes, whatever the access flags.
    ///
    /// # Safety
    /// While the slice lives, nothing may write into the region: no peer holding its
    /// rkey (or a window's) may issue an RDMA WRITE or atomic to it, and no work request
    /// that writes into it (receive, READ, atomic) may be outstanding. Remote access
    /// cannot be revoked without deregistering, so this usually needs a protocol in
    /// which the peer has finished writing *and cannot write again* (trusting a peer is
    /// not enough for soundness: prefer [`Self::read_at`]).
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: `buf` holds `len` initialised (zeroed) bytes owned by `self`; the
        // caller guarantees that nothing writes into them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr(), self.len) }
    }

    /// The bytes, mutably, whatever the access flags.
    ///
    /// # Safety
    /// As [`Self::as_slice_unchecked`]. The device may still read the bytes while the
    /// slice writes them (a SEND or WRITE from them, a peer's RDMA READ), as with
    /// [`Self::as_mut_slice`]: what it reads is then a mix of old and new bytes, which
    /// is the protocol's concern, not this process's memory safety.
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only Rust reference.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr(), self.len) }
    }

    /// Copies `out.len()` bytes starting at `offset` out of the region with volatile
    /// reads, so no reference to memory a peer may be writing is ever made. If a peer
    /// writes meanwhile, `out` may hold a mix of old and new bytes: finish the protocol
    /// step (the peer's completion or message) before reading.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.refuse_if_view("read_at")?;
        self.check_range(&self.span(offset, out.len())?)?;
        // SAFETY: `offset..offset+len` is inside the region (checked); volatile reads
        // through the raw pointer never create a Rust reference to the region's bytes,
        // and `out` is a distinct Rust buffer.
        unsafe { volatile::copy_out(self.buf.as_ptr().add(offset), out) };
        Ok(())
    }

    /// Copies `data` into the region at `offset` with volatile writes (see
    /// [`Self::read_at`]). A peer reading meanwhile may see a mix of old and new bytes.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.refuse_if_view("write_at")?;
        self.check_range(&self.span(offset, data.len())?)?;
        // SAFETY: in range (checked); volatile writes through the raw pointer never
        // create a Rust reference to the region's bytes; `&mut self` keeps other Rust
        // code of this program from reading or writing them meanwhile.
        unsafe { volatile::copy_in(self.buf.as_ptr().add(offset), data) };
        Ok(())
    }

    /// A copy of all the bytes, read as [`Self::read_at`] reads (volatile): works for
    /// every region, remotely writable or not.
    ///
    /// # Panics
    /// On a read view ([`Self::read_view`]), which lends no bytes (see
    /// [`Self::read_at`]).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len];
        if let Err(e) = self.read_at(0, &mut out) {
            panic!("MemoryRegion::to_vec: {e}");
        }
        out
    }

    /// `offset..offset+len`, or an error if it overflows.
    fn span(&self, offset: usize, len: usize) -> Result<Range<usize>> {
        let end = offset.checked_add(len).ok_or_else(|| {
            Error::InvalidArgument(format!("offset {offset} + length {len} overflows").into())
        })?;
        Ok(offset..end)
    }

    fn refuse_if_remotely_writable(&self, what: &str, instead: &str) -> Result<()> {
        if !self.remotely_writable() {
            return Ok(());
        }
        Err(Error::InvalidArgument(
            format!(
                "MemoryRegion::{what} refused: the region was registered with {:?}, so a \
                 peer may write into it at any time and a slice over it would be a data \
                 race; copy the bytes with MemoryRegion::{instead} (volatile), or register \
                 without remote write, atomic and MW_BIND access",
                self.access
            )
            .into(),
        ))
    }

    /// A checked sub-range as a scatter/gather entry.
    pub fn local(&self, range: Range<usize>) -> Result<LocalSlice<'_>> {
        self.check_range(&range)?;
        // At most 2 GiB - 1: mlx5 takes bit 31 of a send entry's length for its
        // inline flag, and some devices read a length as signed.
        let len = i32::try_from(range.len()).map_err(|_| {
            Error::InvalidArgument(
                "a scatter/gather entry holds at most 2 GiB - 1 bytes; split the range".into(),
            )
        })? as u32;
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

impl MemoryRegion {
    /// Deregisters, then frees the memory if it is ours; true when the device can
    /// no longer reach it. If `ibv_dereg_mr` fails (rxe refuses while a memory
    /// window is bound to the region) the device may still reach the memory, so it
    /// is leaked, never freed, and the protection domain is kept alive with it.
    /// Runs once: at the drop, or earlier for a view its region lets go of.
    fn release(&mut self) -> bool {
        if let Some(gone) = self.released {
            return gone;
        }
        let gone = self.release_once();
        self.released = Some(gone);
        gone
    }

    /// [`Self::release`]'s work, done once.
    fn release_once(&mut self) -> bool {
        // The views over this memory go first. One that something else still holds
        // (a window whose deallocation failed, a caller that broke `read_view`'s
        // contract), or whose own deregistration failed, may still reach the
        // memory, which is then leaked, never freed.
        let views_gone = self.views.release();
        // SAFETY: registered in `new`/`register_raw` and deregistered only here, once
        // (`release` runs this once).
        let ret = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if ret != 0 {
            std::mem::forget(self.pd.clone());
            return false;
        }
        if !self.owned || !views_gone {
            return views_gone;
        }
        let layout = Layout::from_size_align(self.len, REGION_ALIGN).expect("checked in new");
        // SAFETY: allocated in `new` with this layout; deregistered above, and every
        // view over it too, so no device access remains.
        unsafe { alloc::dealloc(self.buf.as_ptr(), layout) };
        true
    }
}

impl Drop for MemoryRegion {
    /// Deregisters, then frees the memory (see `release`).
    fn drop(&mut self) {
        self.release();
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

/// Volatile copies between a region and a Rust buffer: eight-byte words where the
/// region's side is aligned, single bytes at the edges.
mod volatile {
    const WORD: usize = std::mem::size_of::<u64>();

    /// Copies `out.len()` bytes from `src` into `out`.
    ///
    /// # Safety
    /// `src..src+out.len()` must be valid for reads.
    pub(super) unsafe fn copy_out(src: *const u8, out: &mut [u8]) {
        let len = out.len();
        let head = src.align_offset(WORD).min(len);
        let words = (len - head) / WORD;
        let dst = out.as_mut_ptr();
        // SAFETY: (all three loops) every offset read is below `len` (the caller's
        // valid range) and every offset written is inside `out`; the word reads are
        // aligned because `src + head` is.
        unsafe {
            for i in 0..head {
                *dst.add(i) = src.add(i).read_volatile();
            }
            for w in 0..words {
                let at = head + w * WORD;
                let v = src.add(at).cast::<u64>().read_volatile();
                dst.add(at).cast::<u64>().write_unaligned(v);
            }
            for i in head + words * WORD..len {
                *dst.add(i) = src.add(i).read_volatile();
            }
        }
    }

    /// Copies `data` to `dst`.
    ///
    /// # Safety
    /// `dst..dst+data.len()` must be valid for writes.
    pub(super) unsafe fn copy_in(dst: *mut u8, data: &[u8]) {
        let len = data.len();
        let head = dst.align_offset(WORD).min(len);
        let words = (len - head) / WORD;
        let src = data.as_ptr();
        // SAFETY: (all three loops) as in `copy_out`, with the roles swapped.
        unsafe {
            for i in 0..head {
                dst.add(i).write_volatile(*src.add(i));
            }
            for w in 0..words {
                let at = head + w * WORD;
                let v = src.add(at).cast::<u64>().read_unaligned();
                dst.add(at).cast::<u64>().write_volatile(v);
            }
            for i in head + words * WORD..len {
                dst.add(i).write_volatile(*src.add(i));
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn copies_every_alignment_and_length() {
            let region: Vec<u8> = (0..64u8).collect();
            for start in 0..12 {
                for len in 0..40 {
                    let mut out = vec![0xAA; len];
                    // SAFETY: `start + len` <= 52 < 64.
                    unsafe { copy_out(region.as_ptr().add(start), &mut out) };
                    assert_eq!(out, &region[start..start + len], "out {start}+{len}");
                    let mut back = vec![0u8; 64];
                    // SAFETY: as above.
                    unsafe { copy_in(back.as_mut_ptr().add(start), &out) };
                    assert_eq!(&back[start..start + len], &out[..], "in {start}+{len}");
                    assert!(back[..start].iter().all(|&b| b == 0), "nothing before");
                    assert!(back[start + len..].iter().all(|&b| b == 0), "nothing after");
                }
            }
        }
    }
}
