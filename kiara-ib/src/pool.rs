//! Registered buffers by size class, reused across messages: registration is paid
//! once per buffer, not per message.
//!
//! Buffers grant no remote access of their own: they are registered for local writes
//! and for memory windows that may grant RDMA READ only (see [`registered`]). A peer
//! reads a message through a window bound over exactly that message's bytes, on its
//! session's queue pair, until the message is acknowledged (`docs/kiara-protocol.md`,
//! Security).

use crate::error::Result;
use parking_lot::Mutex;
use rdma_safe::{Access, MemoryRegion, ProtectionDomain};
use std::sync::Arc;

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

/// A pool of registered buffers, classes of powers of two.
pub struct BufferPool {
    pd: Arc<ProtectionDomain>,
    free: Mutex<Vec<Vec<Arc<MemoryRegion>>>>,
    keep_bytes: usize,
}

impl BufferPool {
    /// A pool registering in `pd`, keeping up to `keep_bytes` of free buffers per
    /// class (at least 2 and at most 256 buffers).
    pub fn new(pd: &Arc<ProtectionDomain>, keep_bytes: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            pd: pd.clone(),
            free: Mutex::new((0..=40).map(|_| Vec::new()).collect()),
            keep_bytes,
        })
    }

    /// Free buffers kept for a class.
    fn keep(&self, class: u32) -> usize {
        (self.keep_bytes >> class).clamp(2, 256)
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
        let class = Self::class(len);
        let reused = self.free.lock()[class as usize].pop();
        let mr = match reused {
            Some(mr) => mr,
            None => Arc::new(registered(&self.pd, 1usize << class)?),
        };
        Ok(PooledBuf {
            mr: Some(mr),
            len,
            pool: self.clone(),
        })
    }

    /// Free buffers held now, over all classes.
    pub fn cached(&self) -> usize {
        self.free.lock().iter().map(Vec::len).sum()
    }
}

/// A buffer of the pool; it goes back on drop.
pub struct PooledBuf {
    mr: Option<Arc<MemoryRegion>>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl PooledBuf {
    /// The region (at least `len()` bytes).
    pub fn region(&self) -> &Arc<MemoryRegion> {
        self.mr.as_ref().expect("present until drop")
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
        let mr = Arc::get_mut(self.mr.as_mut()?)?;
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
        // A buffer a window still holds (its session closed before the window was
        // invalidated) is not reused: it goes when the window goes.
        if let Some(mr) = self.mr.take().filter(|mr| Arc::strong_count(mr) == 1) {
            let class = BufferPool::class(mr.len());
            let keep = self.pool.keep(class);
            let mut free = self.pool.free.lock();
            if free[class as usize].len() < keep {
                free[class as usize].push(mr);
            }
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
    use super::BufferPool;

    #[test]
    fn classes_are_powers_of_two_from_4_kib() {
        assert_eq!(BufferPool::class(0), 12);
        assert_eq!(BufferPool::class(4096), 12);
        assert_eq!(BufferPool::class(4097), 13);
        assert_eq!(BufferPool::class(8 << 20), 23);
    }
}
