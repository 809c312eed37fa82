//! Registered buffers by size class, reused across messages: registration is paid
//! once per buffer, not per message. Each buffer also keeps the region over exactly
//! the bytes of its last message that the message's window was bound to, and reuses
//! it for the next message of the same length: a steady stream registers nothing.
//!
//! Buffers grant no remote access of their own: they are registered for local writes
//! and for memory windows that may grant RDMA READ only (see [`registered`]). A peer
//! reads a message through a window bound over exactly that message's bytes, on its
//! session's queue pair, until the message is acknowledged (`docs/kiara-protocol.md`,
//! Security).

use crate::error::Result;
use parking_lot::Mutex;
use rdma_safe::{Access, MemoryRegion, ProtectionDomain};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a failed registration may let the free buffers go, for the peers'
/// messages and for ours apart: a peer that keeps announcing messages too large
/// to register (each refused as busy) must not empty every session's cache each
/// time, nor use up the evictions our own sends may need.
const EVICT_EVERY: Duration = Duration::from_secs(1);

/// Whose message a buffer is for: a peer's (a READ target, an eager copy) or
/// ours. Each has its own allowance of evictions ([`EVICT_EVERY`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum For {
    /// A message a peer sent.
    Peer,
    /// A message of ours.
    Us,
}

/// Registers `len` bytes as kiara registers everything a peer may read: local write
/// access, and windows (bound per message) that may grant RDMA READ and nothing more.
/// No remote access through the region's own key; not remotely writable, so its bytes
/// are plain slices.
pub fn registered(pd: &Arc<ProtectionDomain>, len: usize) -> Result<MemoryRegion> {
    let mut mr = MemoryRegion::new(pd, len, Access::LOCAL_WRITE | Access::MW_BIND)?;
    mr.set_window_rights(Access::REMOTE_READ);
    Ok(mr)
}

/// Smallest class: 4 KiB.
const MIN_CLASS: u32 = 12;

/// Bytes of the buffer [`BufferPool::get`] pins for a message of `len` bytes: `len`
/// rounded up to a power of two, at least 4 KiB (saturating). What the budgets for
/// the peers' messages charge, so that they count what is pinned.
pub(crate) fn buffer_len(len: u64) -> u64 {
    len.checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .max(1 << MIN_CLASS)
}

/// A pooled buffer and the exact view of its last message (`(length, view)`). The
/// view comes first: dropped before the buffer it covers.
struct Buffer {
    view: Option<(usize, Arc<MemoryRegion>)>,
    mr: Arc<MemoryRegion>,
}

impl Buffer {
    /// Whether nothing but this buffer holds its region and its view: no window is
    /// bound to either, so the buffer may be reused (or freed).
    fn unshared(&self) -> bool {
        Arc::strong_count(&self.mr) == 1
            && self
                .view
                .as_ref()
                .is_none_or(|(_, v)| Arc::strong_count(v) == 1)
    }
}

/// The free buffers, by class, and their bytes in all.
struct Free {
    classes: Vec<Vec<Buffer>>,
    bytes: usize,
}

impl Free {
    /// The class other than `class` whose free buffers hold the most bytes, if any
    /// holds some.
    fn largest_other(&self, class: u32) -> Option<usize> {
        (0..self.classes.len())
            .filter(|&c| c != class as usize && !self.classes[c].is_empty())
            .max_by_key(|&c| self.classes[c].len() << c)
    }
}

/// A pool of registered buffers, classes of powers of two.
pub struct BufferPool {
    pd: Arc<ProtectionDomain>,
    free: Mutex<Free>,
    keep_bytes: usize,
    /// Memory registrations made so far: buffers, and views over message bytes.
    registrations: AtomicU64,
    /// The process's memlock limit, when bounded (read once).
    memlock: Option<u64>,
    /// When the pool was made, and the last eviction after it (milliseconds),
    /// for the peers' messages and for ours.
    born: Instant,
    last_evict_ms: [AtomicU64; 2],
}

impl BufferPool {
    /// A pool registering in `pd`, keeping up to `keep_bytes` of free buffers in
    /// all classes together (at most 256 buffers a class).
    pub fn new(pd: &Arc<ProtectionDomain>, keep_bytes: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            pd: pd.clone(),
            free: Mutex::new(Free {
                classes: (0..=40).map(|_| Vec::new()).collect(),
                bytes: 0,
            }),
            keep_bytes,
            registrations: AtomicU64::new(0),
            memlock: crate::memlock::limit(),
            born: Instant::now(),
            last_evict_ms: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    /// The protection domain the pool registers in: the transport's.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Memory registrations the pool (and the sessions, for the views of messages
    /// sent from user regions) made so far: a steady stream of messages of one size
    /// adds none.
    pub fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::Relaxed)
    }

    /// Counts a registration made for the pool's users (a view over a user region).
    pub(crate) fn count_registration(&self) {
        self.registrations.fetch_add(1, Ordering::Relaxed);
    }

    /// Free buffers kept for a class at most: as many as `keep_bytes` holds, at
    /// most 256 (none of a class larger than `keep_bytes`).
    fn keep(&self, class: u32) -> usize {
        (self.keep_bytes >> class).min(256)
    }

    fn class(len: usize) -> u32 {
        len.max(1)
            .next_power_of_two()
            .trailing_zeros()
            .max(MIN_CLASS)
    }

    /// A buffer of at least `len` bytes, locally writable, readable by a peer only
    /// through a window bound to it.
    pub fn get(self: &Arc<Self>, len: usize) -> Result<PooledBuf> {
        self.get_for(len, For::Us)
    }

    /// [`BufferPool::get`] of a buffer for `whose` message.
    pub(crate) fn get_for(self: &Arc<Self>, len: usize, whose: For) -> Result<PooledBuf> {
        if let Some(buf) = self.cached_for(len) {
            return Ok(buf);
        }
        self.new_for(len, whose)
    }

    /// A newly registered buffer of at least `len` bytes, the cache left alone: for
    /// a caller whose [`BufferPool::cached_for`] just missed, so that the pool grows
    /// to what a stream keeps in use at once (a buffer given back meanwhile would
    /// make it miss again at the next message).
    pub(crate) fn new_for(self: &Arc<Self>, len: usize, whose: For) -> Result<PooledBuf> {
        let class = Self::class(len);
        let buf = Buffer {
            view: None,
            mr: Arc::new(self.register(1usize << class, whose)?),
        };
        Ok(PooledBuf {
            buf: Some(buf),
            len,
            pool: self.clone(),
        })
    }

    /// A buffer of at least `len` bytes from the cache, or `None` (nothing is
    /// registered, nothing evicted): for callers that hold a lock others wait on.
    pub(crate) fn cached_for(self: &Arc<Self>, len: usize) -> Option<PooledBuf> {
        let class = Self::class(len);
        let buf = {
            let mut free = self.free.lock();
            let buf = free.classes[class as usize].pop()?;
            free.bytes -= 1 << class;
            buf
        };
        Some(PooledBuf {
            buf: Some(buf),
            len,
            pool: self.clone(),
        })
    }

    /// Registers a new buffer of `len` bytes. When that fails (the memlock limit,
    /// or the device's), the free buffers' pinned pages may be what is in the way:
    /// they are let go ([`BufferPool::make_room`]), and the registration tried
    /// once more.
    fn register(&self, len: usize, whose: For) -> Result<MemoryRegion> {
        let mr = match registered(&self.pd, len) {
            Ok(mr) => mr,
            Err(first) if !self.make_room(len, whose) => return Err(first),
            Err(_) => registered(&self.pd, len)?,
        };
        self.count_registration();
        Ok(mr)
    }

    /// A registration of `len` bytes for `whose` message failed: lets go of every
    /// free buffer, unless none is kept, `len` alone is over the memlock limit (no
    /// eviction can make it fit), or `whose` last eviction was less than
    /// [`EVICT_EVERY`] ago. Returns whether it did, so that trying again may
    /// succeed.
    pub(crate) fn make_room(&self, len: usize, whose: For) -> bool {
        if self.cached_bytes() == 0 || self.memlock.is_some_and(|limit| len as u64 > limit) {
            return false;
        }
        let every = EVICT_EVERY.as_millis() as u64;
        let now = self.born.elapsed().as_millis() as u64 + every;
        let last_evict = &self.last_evict_ms[whose as usize];
        let last = last_evict.load(Ordering::Relaxed);
        if now < last + every
            || last_evict
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        self.evict_all() > 0
    }

    /// Lets go of every free buffer (deregistered and freed outside the lock);
    /// returns how many.
    fn evict_all(&self) -> usize {
        let evicted: Vec<Vec<Buffer>> = {
            let mut free = self.free.lock();
            free.bytes = 0;
            free.classes.iter_mut().map(std::mem::take).collect()
        };
        evicted.iter().map(Vec::len).sum()
    }

    /// Free buffers held now, over all classes.
    pub fn cached(&self) -> usize {
        self.free.lock().classes.iter().map(Vec::len).sum()
    }

    /// Bytes of the free buffers held now, over all classes: at most `keep_bytes`.
    pub fn cached_bytes(&self) -> usize {
        self.free.lock().bytes
    }
}

/// A buffer of the pool; it goes back on drop.
pub struct PooledBuf {
    buf: Option<Buffer>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl PooledBuf {
    /// The region (at least `len()` bytes).
    pub fn region(&self) -> &Arc<MemoryRegion> {
        &self.buf.as_ref().expect("present until drop").mr
    }

    /// A region over exactly the bytes in use, for a window: the one the buffer's
    /// last message used if it had the same length, else a new one (which the
    /// buffer keeps for its next message). The buffer is reused only once no window
    /// holds the view.
    pub(crate) fn exact_view(&mut self) -> rdma_safe::Result<Arc<MemoryRegion>> {
        let len = self.len;
        let buf = self.buf.as_mut().expect("present until drop");
        if let Some((cached, view)) = &buf.view {
            if *cached == len {
                return Ok(view.clone());
            }
        }
        // The old view goes first (no window holds it: the buffer was free).
        buf.view = None;
        // SAFETY: the view is kept in `buf` beside the buffer it covers and dropped
        // first; a buffer whose view a window still holds is leaked, never freed
        // (see `Drop`).
        let view = Arc::new(unsafe { buf.mr.new_read_view(&self.pool.pd, 0..len) }?);
        self.pool.count_registration();
        buf.view = Some((len, view.clone()));
        Ok(view)
    }

    /// The bytes in use. Empty while the device may be writing them (a READ into the
    /// buffer is posted): kiara hands a buffer out only after its READs completed.
    pub fn bytes(&self) -> &[u8] {
        // `registered` buffers are not remotely writable: `as_slice` succeeds.
        self.region().as_slice().map_or(&[], |b| &b[..self.len])
    }

    /// The bytes in use, mutably, while nothing else holds the buffer (no window is
    /// bound to it); `None` otherwise.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let len = self.len;
        let buf = self.buf.as_mut()?;
        if buf
            .view
            .as_ref()
            .is_some_and(|(_, v)| Arc::strong_count(v) > 1)
        {
            return None;
        }
        let mr = Arc::get_mut(&mut buf.mr)?;
        mr.as_mut_slice().ok().map(|b| &mut b[..len])
    }

    /// Length in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        if !buf.unshared() {
            // A window still holds the buffer or its view (kiara releases a message
            // only after its window let go, so this is a bug): leaked, never freed
            // or reused while a peer might read it.
            std::mem::forget(buf);
            return;
        }
        let class = BufferPool::class(buf.mr.len());
        let size = 1usize << class;
        if size > self.pool.keep_bytes {
            return; // never kept: deregistered and freed here
        }
        // Kept within the class's count and the pool's bytes for all classes, so
        // that messages of many sizes cannot leave every class full. Room is made
        // by freeing a buffer of the class that holds the most bytes, one at a time
        // outside the lock, so that no size keeps the others out for good.
        loop {
            let mut free = self.pool.free.lock();
            if free.classes[class as usize].len() >= self.pool.keep(class) {
                return;
            }
            if free.bytes + size <= self.pool.keep_bytes {
                free.classes[class as usize].push(buf);
                free.bytes += size;
                return;
            }
            let Some(victim) = free.largest_other(class) else {
                return;
            };
            let evicted = free.classes[victim].pop();
            free.bytes -= 1 << victim;
            drop(free);
            drop(evicted);
        }
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{buffer_len, BufferPool};

    #[test]
    fn classes_are_powers_of_two_from_4_kib() {
        assert_eq!(BufferPool::class(0), 12);
        assert_eq!(BufferPool::class(4096), 12);
        assert_eq!(BufferPool::class(4097), 13);
        assert_eq!(BufferPool::class(8 << 20), 23);
    }

    #[test]
    fn a_buffer_len_is_its_class_size() {
        for len in [
            0,
            1,
            4095,
            4096,
            4097,
            65_536,
            100_000,
            8 << 20,
            (8 << 20) + 1,
        ] {
            let class = BufferPool::class(len as usize);
            assert_eq!(buffer_len(len), 1 << class, "{len}");
        }
        assert_eq!(buffer_len(u64::MAX), u64::MAX, "saturates");
    }
}
