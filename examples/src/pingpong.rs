//! The wire format of `ibv_rc_pingpong` (rdma-core's libibverbs examples), pure code.
//!
//! Each side sends one 52-byte message over TCP: `"%04x:%06x:%06x:%s"` with the LID,
//! the QP number, the PSN and the 16 raw GID bytes as 32 hex digits, then a NUL.

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

    /// Parses a peer's message (as `sscanf("%x:%x:%x:%s")` and the GID's 32 hex digits).
    pub fn decode(msg: &[u8]) -> Result<Dest, WireError> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| WireError("not ASCII".into()))?;
        let mut fields = text.splitn(4, ':');
        let mut hex = |name: &str, max: u64| -> Result<u64, WireError> {
            let f = fields
                .next()
                .ok_or_else(|| WireError(format!("{name} missing in {text:?}")))?;
            let v = u64::from_str_radix(f, 16)
                .map_err(|_| WireError(format!("{name} {f:?} is not hex")))?;
            if v > max {
                return Err(WireError(format!("{name} {f:?} out of range")));
            }
            Ok(v)
        };
        let lid = hex("LID", 0xffff)? as u16;
        let qpn = hex("QPN", 0xff_ffff)? as u32;
        let psn = hex("PSN", 0xff_ffff)? as u32;
        let g = fields
            .next()
            .ok_or_else(|| WireError(format!("GID missing in {text:?}")))?;
        if g.len() != 32 {
            return Err(WireError(format!("GID {g:?} is not 32 hex digits")));
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&g[2 * i..2 * i + 2], 16)
                .map_err(|_| WireError(format!("GID {g:?} is not hex")))?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn mtu_values() {
        assert_eq!(mtu_to_enum(1024), Some(3));
        assert_eq!(mtu_to_enum(1000), None);
    }
}
