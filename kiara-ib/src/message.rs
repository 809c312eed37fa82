//! Messages: bytes plus optional metadata.

use crate::error::{Error, Result};
use crate::pool::PooledBuf;
use crate::protocol::MAX_META_LEN;
use rdma_safe::MemoryRegion;
use std::ops::Range;
use std::sync::Arc;

/// Messages of at most this many bytes keep them inside the message itself: one
/// made from a slice, or received eager, needs no allocation and no pool buffer
/// (taking and giving back a buffer is most of a small message's work apart from
/// the device's, docs/performance.md).
pub(crate) const SMALL: usize = 128;

/// The bytes of a small message, in place.
pub(crate) struct Small {
    len: u8,
    bytes: [u8; SMALL],
}

impl Small {
    /// `bytes` copied in, if they fit.
    pub(crate) fn copy_of(bytes: &[u8]) -> Option<Small> {
        let mut small = Small {
            len: u8::try_from(bytes.len())
                .ok()
                .filter(|&n| usize::from(n) <= SMALL)?,
            bytes: [0; SMALL],
        };
        small.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(small)
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Small {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Small({} bytes)", self.len)
    }
}

/// Where a message's bytes live.
#[derive(Debug)]
pub(crate) enum Payload {
    /// Owned bytes (copied into a registered buffer when sent).
    Bytes(Vec<u8>),
    /// At most [`SMALL`] bytes, in place (copied like `Bytes`).
    Small(Small),
    /// A registered buffer of the transport's pool (received messages of more than
    /// [`SMALL`] bytes).
    Pooled(PooledBuf),
    /// A caller-registered region, sent with zero copies.
    Region(Arc<MemoryRegion>, Range<usize>),
}

impl Payload {
    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Payload::Bytes(v) => v,
            Payload::Small(s) => s.bytes(),
            Payload::Pooled(p) => p.bytes(),
            // Checked in `from_region`: no peer can write the region, `as_slice` succeeds.
            Payload::Region(r, range) => r.as_slice().map_or(&[], |b| &b[range.clone()]),
        }
    }
}

/// A message: bytes plus up to 64 bytes of metadata.
#[derive(Debug)]
pub struct Message {
    pub(crate) payload: Payload,
    meta: [u8; MAX_META_LEN],
    meta_len: u8,
}

impl Message {
    /// A message of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self::from_payload(Payload::Bytes(bytes.into()))
    }

    /// A message whose bytes are `range` of a region registered with
    /// [`crate::Transport::register`]: sent without copying. The region must stay
    /// unchanged until the send completes (the `Arc` is held until then). A region
    /// registered otherwise is refused unless its windows may grant RDMA READ and no
    /// peer can write into it (`MW_BIND` with `set_window_rights(REMOTE_READ)`).
    pub fn from_region(region: Arc<MemoryRegion>, range: Range<usize>) -> Result<Self> {
        if region.remotely_writable()
            || !region
                .window_rights()
                .contains(rdma_safe::Access::REMOTE_READ)
        {
            return Err(Error::Usage(
                format!(
                    "a message's region must be registered by Transport::register (windows \
                     granting RDMA READ only); this one has {:?} and window rights {:?}",
                    region.access(),
                    region.window_rights()
                )
                .into(),
            ));
        }
        if range.start > range.end || range.end > region.len() {
            return Err(Error::Usage(
                format!(
                    "range {range:?} is outside the region of {} bytes",
                    region.len()
                )
                .into(),
            ));
        }
        Ok(Self::from_payload(Payload::Region(region, range)))
    }

    /// A received message: its payload and decoded metadata (`meta_len` was checked
    /// against `MAX_META_LEN` when decoding).
    pub(crate) fn from_parts(payload: Payload, meta: [u8; MAX_META_LEN], meta_len: u8) -> Self {
        Message {
            payload,
            meta,
            meta_len: meta_len.min(MAX_META_LEN as u8),
        }
    }

    pub(crate) fn from_payload(payload: Payload) -> Self {
        Message {
            payload,
            meta: [0; MAX_META_LEN],
            meta_len: 0,
        }
    }

    /// Attaches metadata (at most 64 bytes).
    pub fn with_meta(mut self, meta: &[u8]) -> Result<Self> {
        if meta.len() > MAX_META_LEN {
            return Err(Error::Usage(
                format!("metadata of {} bytes exceeds {MAX_META_LEN}", meta.len()).into(),
            ));
        }
        self.meta[..meta.len()].copy_from_slice(meta);
        self.meta_len = meta.len() as u8;
        Ok(self)
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.payload.bytes()
    }

    /// The metadata.
    pub fn meta(&self) -> &[u8] {
        &self.meta[..self.meta_len as usize]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes as an owned vector (copies unless the message owns a `Vec`).
    pub fn into_vec(self) -> Vec<u8> {
        match self.payload {
            Payload::Bytes(v) => v,
            _ => self.bytes().to_vec(),
        }
    }
}

impl From<Vec<u8>> for Message {
    fn from(v: Vec<u8>) -> Self {
        Message::new(v)
    }
}

impl From<&[u8]> for Message {
    /// A copy of `v`: kept in the message itself up to 128 bytes (no allocation),
    /// else in a vector.
    fn from(v: &[u8]) -> Self {
        match Small::copy_of(v) {
            Some(small) => Message::from_payload(Payload::Small(small)),
            None => Message::new(v.to_vec()),
        }
    }
}

/// A 64-bit checksum of `bytes`: the one the echo examples and tests use (it detects
/// corruption; it is not cryptographic). It mixes eight bytes per step (an
/// FNV-style multiply, then a rotation) and finally the length, so that it costs
/// about a cycle per byte: checksumming must not dominate a latency measurement.
pub fn checksum(bytes: &[u8]) -> u64 {
    const SEED: u64 = 0xcbf2_9ce4_8422_2325;
    const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
    let step = |h: u64, w: u64| (h ^ w).wrapping_mul(MUL).rotate_left(31);
    let mut words = bytes.chunks_exact(8);
    let mut h = SEED;
    for w in &mut words {
        h = step(h, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        h = step(h, u64::from_le_bytes(last));
    }
    step(h, bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::{Message, Payload, SMALL};

    #[test]
    fn a_slice_up_to_small_stays_in_the_message_and_longer_ones_in_a_vector() {
        let data: Vec<u8> = (0..=SMALL as u32).map(|i| (i * 13 + 1) as u8).collect();
        for len in [0, 1, 63, 64, SMALL - 1, SMALL, SMALL + 1] {
            let msg = Message::from(&data[..len]);
            assert_eq!(msg.bytes(), &data[..len], "{len} bytes come back intact");
            assert_eq!(msg.len(), len);
            let small = matches!(msg.payload, Payload::Small(_));
            assert_eq!(small, len <= SMALL, "{len} bytes in place");
            assert_eq!(msg.into_vec(), &data[..len], "{len} bytes as a vector");
        }
    }

    #[test]
    fn checksum_sees_every_byte_its_position_and_the_length() {
        use super::checksum;
        let data: Vec<u8> = (0..100u32).map(|i| (i * 7) as u8).collect();
        let base = checksum(&data);
        assert_eq!(base, checksum(&data.clone()), "deterministic");
        for i in 0..data.len() {
            for bit in 0..8 {
                let mut d = data.clone();
                d[i] ^= 1 << bit;
                assert_ne!(checksum(&d), base, "a flip of bit {bit} of byte {i}");
            }
        }
        let mut swapped = data.clone();
        swapped.swap(3, 60);
        assert_ne!(checksum(&swapped), base, "order counts");
        // Trailing zeros change the length, so they change the checksum.
        assert_ne!(checksum(b"ab"), checksum(b"ab\0"));
        assert_ne!(checksum(b""), checksum(b"\0"));
    }
}
