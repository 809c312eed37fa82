//! The wire format of `ibv_rc_pingpong` (rdma-core's libibverbs examples), pure code.
//!
//! Each side sends one 52-byte message over TCP: `"%04x:%06x:%06x:%s"` with the LID,
//! the QP number, the PSN and the 16 raw GID bytes as 32 hex digits, then a NUL.

use crate::wire;
use std::fmt;

/// Size of the address message, NUL included.
pub const MSG_SIZE: usize = 52;

/// What `ibv_rc_pingpong` exchanges: LID, QPN, PSN and GID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Packet sequence number (24 bits).
    pub psn: u32,
    /// The raw GID (all zero without `-g`).
    pub gid: [u8; 16],
}

/// A malformed address message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed ibv_rc_pingpong address message: {}", self.0)
    }
}

impl std::error::Error for WireError {}

impl Dest {
    /// The 52 bytes sent to the peer.
    pub fn encode(&self) -> [u8; MSG_SIZE] {
        let mut text = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        for b in self.gid {
            text.push_str(&format!("{b:02x}"));
        }
        let mut out = [0u8; MSG_SIZE];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses a peer's message (as `sscanf("%x:%x:%x:%s")` and the GID's 32 hex
    /// digits), byte by byte: whatever the bytes, the result is a value or an error
    /// naming the field and what was wrong with it, never a panic.
    pub fn decode(msg: &[u8]) -> Result<Dest, WireError> {
        let text = wire::c_str(msg);
        let mut fields = text.splitn(4, |&b| b == b':');
        let mut next = |name: &str| {
            fields.next().ok_or_else(|| {
                WireError(format!(
                    "{name} missing in {} (expected LID:QPN:PSN:GID)",
                    wire::show(text)
                ))
            })
        };
        let lid = wire::hex_field("LID", next("LID")?, 0xffff).map_err(WireError)? as u16;
        let qpn = wire::hex_field("QPN", next("QPN")?, 0xff_ffff).map_err(WireError)? as u32;
        let psn = wire::hex_field("PSN", next("PSN")?, 0xff_ffff).map_err(WireError)? as u32;
        let gid = wire::hex_gid("GID", next("GID")?).map_err(WireError)?;
        Ok(Dest { lid, qpn, psn, gid })
    }
}

/// `ibv_rc_pingpong`'s MTU option (bytes) as the verbs enum value (1..=5).
pub fn mtu_to_enum(bytes: u32) -> Option<u32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// The system's page size, as `sysconf(_SC_PAGESIZE)` reports it, read from the
/// kernel's auxiliary vector (`AT_PAGESZ` in `/proc/self/auxv`) without `unsafe`;
/// 4096 if that cannot be read.
pub fn page_size() -> usize {
    const AT_PAGESZ: u64 = 6;
    let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    auxv.chunks_exact(16)
        .map(|pair| {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            (word(&pair[..8]), word(&pair[8..]))
        })
        .find(|&(key, _)| key == AT_PAGESZ)
        .map_or(4096, |(_, size)| size as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encodes_like_the_c_program() {
        let gid = std::net::Ipv4Addr::new(198, 18, 0, 1)
            .to_ipv6_mapped()
            .octets();
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid,
        };
        let m = d.encode();
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffffc6120001"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
    }

    #[test]
    fn rejects_malformed_messages() {
        assert!(Dest::decode(b"").is_err());
        assert!(Dest::decode(b"zz00:000011:abcdef:00").is_err());
        assert!(Dest::decode(b"0000:000011:abcdef:0000").is_err());
        assert!(Dest::decode(b"0000:000011:abcdef:0000000000000000000000000000000g").is_err());
        assert!(Dest::decode(b"0000:1000000:abcdef:00000000000000000000000000000000").is_err());
        assert!(Dest::decode(&[0xff; 52]).is_err());
    }

    #[test]
    fn non_ascii_gid_is_an_error_not_a_panic() {
        // The 52-byte message that killed the server: a two-byte character where the
        // GID's first hex pair starts.
        let mut m = Dest::default().encode();
        m[19] = b'0';
        m[20..22].copy_from_slice("é".as_bytes());
        let e = Dest::decode(&m).unwrap_err().to_string();
        assert!(e.contains("GID") && e.contains("not a hex digit"), "{e}");
        let mut m = Dest::default().encode();
        m[0..2].copy_from_slice("é".as_bytes());
        let e = Dest::decode(&m).unwrap_err().to_string();
        assert!(e.contains("LID") && e.contains("\\xc3"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = |m: &[u8]| Dest::decode(m).unwrap_err().0;
        assert!(e(b"0000:000011").contains("PSN missing"));
        assert!(e(b"0000:1000000:abcdef:00").contains("QPN"));
        assert!(e(b"0000:000011:abcdef:0000").contains("GID"));
    }

    fn arb_dest() -> impl Strategy<Value = Dest> {
        (
            any::<u16>(),
            0..=0xff_ffffu32,
            0..=0xff_ffffu32,
            any::<[u8; 16]>(),
        )
            .prop_map(|(lid, qpn, psn, gid)| Dest { lid, qpn, psn, gid })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Err(e) = Dest::decode(&bytes) {
                prop_assert!(
                    ["LID", "QPN", "PSN", "GID"].iter().any(|f| e.0.contains(f)),
                    "{}", e
                );
            }
        }

        #[test]
        fn valid_messages_round_trip(d in arb_dest()) {
            prop_assert_eq!(Dest::decode(&d.encode()), Ok(d));
        }

        #[test]
        fn every_truncation_is_an_error(d in arb_dest()) {
            let m = d.encode();
            // Every cut before the GID's last digit loses something.
            for cut in 0..51 {
                let e = Dest::decode(&m[..cut]);
                prop_assert!(e.is_err(), "cut at {}: {:?}", cut, e);
            }
        }

        #[test]
        fn one_corrupt_byte_never_panics(d in arb_dest(), at in 0..52usize, b in any::<u8>()) {
            let mut m = d.encode();
            m[at] = b;
            let _ = Dest::decode(&m);
        }
    }

    #[test]
    fn page_size_is_read_from_the_kernel() {
        let page = page_size();
        assert!(page >= 4096 && page.is_power_of_two(), "{page}");
    }

    #[test]
    fn mtu_values() {
        assert_eq!(mtu_to_enum(1024), Some(3));
        assert_eq!(mtu_to_enum(1000), None);
    }
}
