//! Registered buffers by size class, reused across messages: registration is paid
//! once per buffer, not per message.

use crate::error::Result;
use parking_lot::Mutex;
use rdma_safe::{Access, MemoryRegion, ProtectionDomain};
use std::sync::Arc;

/// Smallest class: 4 KiB.
const MIN_CLASS: u32 = 12;

/// A pool of registered buffers, classes of powers of two.
pub struct BufferPool {
    pd: Arc<ProtectionDomain>,
    free: Mutex<Vec<Vec<MemoryRegion>>>,
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

    /// A buffer of at least `len` bytes, remote-readable and locally writable.
    pub fn get(self: &Arc<Self>, len: usize) -> Result<PooledBuf> {
        let class = Self::class(len);
        let reused = self.free.lock()[class as usize].pop();
        let mr = match reused {
            Some(mr) => mr,
            None => MemoryRegion::new(
                &self.pd,
                1usize << class,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )?,
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
    mr: Option<MemoryRegion>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl PooledBuf {
    /// The region (at least `len()` bytes).
    pub fn region(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("present until drop")
    }

    /// The bytes in use.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: pooled buffers grant no remote write; the buffer is not posted.
        unsafe { &self.region().as_slice_unchecked()[..self.len] }
    }

    /// The bytes in use, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let mr = self.mr.as_mut().expect("present until drop");
        // SAFETY: pooled buffers grant no remote write; the buffer is not posted.
        unsafe { &mut mr.as_mut_slice_unchecked()[..len] }
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
        if let Some(mr) = self.mr.take() {
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
