//! Messages: bytes plus optional metadata.

use crate::error::{Error, Result};
use crate::pool::PooledBuf;
use crate::protocol::MAX_META_LEN;
use crate::spare::Spare;
use rdma_safe::MemoryRegion;
use std::ops::Range;
use std::sync::Arc;

/// A message's metadata: up to [`MAX_META_LEN`] bytes in a recycled array, none
/// when empty.
pub(crate) struct Meta(Spare);

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Meta").field(&self.bytes()).finish()
    }
}

impl Default for Meta {
    fn default() -> Self {
        Meta(Spare::EMPTY)
    }
}

impl Meta {
    /// `bytes` copied, or `None` if longer than [`MAX_META_LEN`].
    pub(crate) fn copy_of(bytes: &[u8]) -> Option<Meta> {
        if bytes.len() > MAX_META_LEN {
            return None;
        }
        Spare::copy_of(bytes).map(Meta)
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Where a message's bytes live.
#[derive(Debug)]
pub(crate) enum Payload {
    /// Owned bytes (copied into a registered buffer when sent).
    Bytes(Vec<u8>),
    /// At most [`SPARE_LEN`](crate::spare::SPARE_LEN) bytes, in a recycled array
    /// (copied like `Bytes`): a message made from a slice, or received eager,
    /// needs no allocation and no pool buffer (taking and giving back a pool
    /// buffer is most of a small message's work apart from the device's,
    /// docs/performance-history.md).
    Small(Spare),
    /// A registered buffer of the transport's pool (received messages of more than
    /// [`SPARE_LEN`](crate::spare::SPARE_LEN) bytes).
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
    pub(crate) meta: Meta,
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

    /// A received message: its payload and metadata.
    pub(crate) fn from_parts(payload: Payload, meta: Meta) -> Self {
        Message { payload, meta }
    }

    pub(crate) fn from_payload(payload: Payload) -> Self {
        Message {
            payload,
            meta: Meta::default(),
        }
    }

    /// Attaches metadata (at most 64 bytes).
    pub fn with_meta(mut self, meta: &[u8]) -> Result<Self> {
        self.meta = Meta::copy_of(meta).ok_or_else(|| {
            Error::Usage(format!("metadata of {} bytes exceeds {MAX_META_LEN}", meta.len()).into())
        })?;
        Ok(self)
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.payload.bytes()
    }

    /// The metadata.
    pub fn meta(&self) -> &[u8] {
        self.meta.bytes()
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
    /// A copy of `v`: up to 128 bytes in a recycled array (no allocation once a
    /// few messages went by), else in a vector.
    fn from(v: &[u8]) -> Self {
        match Spare::copy_of(v) {
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
    use super::{Message, Payload};
    use crate::spare::SPARE_LEN as SMALL;

    #[test]
    fn a_slice_up_to_small_goes_in_a_spare_array_and_longer_ones_in_a_vector() {
        let data: Vec<u8> = (0..=SMALL as u32).map(|i| (i * 13 + 1) as u8).collect();
        for len in [0, 1, 63, 64, SMALL - 1, SMALL, SMALL + 1] {
            let msg = Message::from(&data[..len]);
            assert_eq!(msg.bytes(), &data[..len], "{len} bytes come back intact");
            assert_eq!(msg.len(), len);
            let small = matches!(msg.payload, Payload::Small(_));
            assert_eq!(small, len <= SMALL, "{len} bytes in a spare array");
            assert_eq!(msg.into_vec(), &data[..len], "{len} bytes as a vector");
        }
    }

    #[test]
    fn a_message_is_a_few_words() {
        // Moved through the completion's handling, the inbox and `recv`: every move
        // copies it (docs/performance-history.md, session 28).
        let size = std::mem::size_of::<Message>();
        assert!(size <= 64, "Message is {size} bytes");
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
