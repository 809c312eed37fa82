//! `rping`'s buffer descriptor (`struct rping_rdma_info`): the 16 bytes each side
//! SENDs to tell the other where to RDMA READ from or WRITE to, in network order:
//! `u64 buf` (address), `u32 rkey`, `u32 size`.

use rdma_safe::{Error, Result};

/// Size of a descriptor.
pub const INFO_LEN: usize = 16;

/// A buffer the peer may access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Info {
    /// Its address.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its size in bytes.
    pub size: u32,
}

impl Info {
    /// The 16 bytes, big-endian, as C rping's `htobe64`/`htobe32` write them.
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut out = [0u8; INFO_LEN];
        out[0..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..16].copy_from_slice(&self.size.to_be_bytes());
        out
    }

    /// Parses a received descriptor: `buf` is the receive buffer and `byte_len` what
    /// the completion says arrived, which must be exactly [`INFO_LEN`] (C rping's
    /// `Received bogus data, size N` otherwise).
    pub fn decode(buf: &[u8], byte_len: u32) -> Result<Info> {
        let bogus = || {
            Error::Protocol(
                format!("Received bogus data, size {byte_len} (a descriptor is {INFO_LEN} bytes)")
                    .into(),
            )
        };
        if byte_len as usize != INFO_LEN {
            return Err(bogus());
        }
        let b: &[u8; INFO_LEN] = buf
            .get(..INFO_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(bogus)?;
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[0..8]);
        Ok(Info {
            addr: u64::from_be_bytes(addr),
            rkey: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            size: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn descriptor_is_big_endian() {
        let i = Info {
            addr: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            size: 64,
        };
        let raw = i.encode();
        assert_eq!(raw, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 0, 0, 0, 64]);
        assert_eq!(Info::decode(&raw, 16).unwrap(), i);
        let e = Info::decode(&raw, 7).unwrap_err().to_string();
        assert!(e.contains("Received bogus data, size 7"), "{e}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..40), len in any::<u32>()) {
            match Info::decode(&buf, len) {
                Ok(_) => prop_assert!(len == 16 && buf.len() >= 16),
                Err(e) => prop_assert!(e.to_string().contains("bogus data"), "{}", e),
            }
        }

        #[test]
        fn round_trip_and_truncations_fail(addr in any::<u64>(), rkey in any::<u32>(), size in any::<u32>()) {
            let i = Info { addr, rkey, size };
            let raw = i.encode();
            prop_assert_eq!(Info::decode(&raw, 16).ok(), Some(i));
            for cut in 0..INFO_LEN {
                prop_assert!(Info::decode(&raw[..cut], cut as u32).is_err());
                prop_assert!(Info::decode(&raw[..cut], 16).is_err());
            }
        }
    }
}
