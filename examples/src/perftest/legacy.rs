//! The address message of the old `ib_rdma_bw` (perftest before 2012) and of
//! simpleIBverbs: `"%04x:%06x:%06x:%08x:%016Lx"` = LID:QPN:PSN:rkey:vaddr plus a NUL,
//! 45 bytes.
//!
//! **RoCE extension.** Those programs address the peer by LID only, which RoCE does
//! not have. When a GID is in use, this port appends `":"` and the 16 GID bytes as 32
//! hex digits: 78 bytes. The 45th byte tells the forms apart (NUL in the classic
//! form, `:` in the extended one), so a reader takes 45 bytes and, on a `:`, the 33
//! that follow. Without a GID the message is the classic 45 bytes, unchanged.

use crate::wire;
use std::io::Read;

/// Size of the classic message, NUL included.
pub const CLASSIC_SIZE: usize = 45;
/// Size of the message with a GID, NUL included.
pub const GID_SIZE: usize = 78;

/// A malformed address message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyError(pub String);

impl std::fmt::Display for LegacyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed address message: {}", self.0)
    }
}

impl std::error::Error for LegacyError {}

/// LID, QPN, PSN, rkey, address and (RoCE) GID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LegacyDest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// rkey of the buffer the peer may write.
    pub rkey: u32,
    /// Its address.
    pub vaddr: u64,
    /// The GID, when one is used (the extension).
    pub gid: Option<[u8; 16]>,
}

impl LegacyDest {
    /// The message: 45 bytes, or 78 with a GID.
    pub fn encode(&self) -> Vec<u8> {
        let mut text = format!(
            "{:04x}:{:06x}:{:06x}:{:08x}:{:016x}",
            self.lid, self.qpn, self.psn, self.rkey, self.vaddr
        );
        let size = match self.gid {
            Some(g) => {
                text.push(':');
                for b in g {
                    text.push_str(&format!("{b:02x}"));
                }
                GID_SIZE
            }
            None => CLASSIC_SIZE,
        };
        let mut out = vec![0u8; size];
        let n = text.len().min(size - 1);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out
    }

    /// Parses a message of either form, byte by byte: whatever the bytes, the result
    /// is a value or an error naming the field and what was wrong, never a panic.
    pub fn decode(raw: &[u8]) -> Result<LegacyDest, LegacyError> {
        if raw.len() != CLASSIC_SIZE && raw.len() != GID_SIZE {
            return Err(LegacyError(format!(
                "{} bytes, expected {CLASSIC_SIZE} (or {GID_SIZE} with a GID)",
                raw.len()
            )));
        }
        let text = wire::c_str(raw);
        let f = wire::colon_fields(text);
        if f.len() != 5 && f.len() != 6 {
            return Err(LegacyError(format!(
                "{} has {} fields, expected LID:QPN:PSN:rkey:vaddr[:GID]",
                wire::show(text),
                f.len()
            )));
        }
        let hex =
            |i: usize, name: &str, max: u64| wire::hex_field(name, f[i], max).map_err(LegacyError);
        let mut d = LegacyDest {
            lid: hex(0, "LID", 0xffff)? as u16,
            qpn: hex(1, "QPN", 0xff_ffff)? as u32,
            psn: hex(2, "PSN", 0xff_ffff)? as u32,
            rkey: hex(3, "rkey", 0xffff_ffff)? as u32,
            vaddr: hex(4, "vaddr", u64::MAX)?,
            gid: None,
        };
        if let Some(g) = f.get(5) {
            d.gid = Some(wire::hex_gid("GID", g).map_err(LegacyError)?);
        }
        Ok(d)
    }
}

/// Reads one message of either form from `r`.
pub fn read_dest(r: &mut impl Read) -> Result<LegacyDest, Box<dyn std::error::Error>> {
    let mut buf = vec![0u8; GID_SIZE];
    r.read_exact(&mut buf[..CLASSIC_SIZE])
        .map_err(|e| format!("Couldn't read remote address: {e}"))?;
    if buf[CLASSIC_SIZE - 1] == b':' {
        r.read_exact(&mut buf[CLASSIC_SIZE..])
            .map_err(|e| format!("Couldn't read remote address: {e}"))?;
    } else {
        buf.truncate(CLASSIC_SIZE);
    }
    Ok(LegacyDest::decode(&buf)?)
}

/// Reads one message of either form from `sock` within `deadline`: one deadline for
/// the whole message, however slowly the peer drips it.
pub fn read_dest_within(
    sock: &mut std::net::TcpStream,
    deadline: &rdma_safe::Deadline,
) -> Result<LegacyDest, Box<dyn std::error::Error>> {
    let mut buf = vec![0u8; GID_SIZE];
    deadline.read_exact(sock, &mut buf[..CLASSIC_SIZE], "address")?;
    if buf[CLASSIC_SIZE - 1] == b':' {
        deadline.read_exact(sock, &mut buf[CLASSIC_SIZE..], "GID")?;
    } else {
        buf.truncate(CLASSIC_SIZE);
    }
    Ok(LegacyDest::decode(&buf)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classic_form_is_45_bytes() {
        let d = LegacyDest {
            lid: 1,
            qpn: 0x11,
            psn: 0x123456,
            rkey: 0xabc,
            vaddr: 0x7f00_0000_1000,
            gid: None,
        };
        let m = d.encode();
        assert_eq!(m.len(), 45);
        assert_eq!(&m[..44], b"0001:000011:123456:00000abc:00007f0000001000");
        assert_eq!(m[44], 0);
        assert_eq!(LegacyDest::decode(&m).unwrap(), d);
        assert_eq!(read_dest(&mut &m[..]).unwrap(), d);
    }

    #[test]
    fn gid_form_is_78_bytes() {
        let gid = std::net::Ipv4Addr::new(198, 18, 0, 1)
            .to_ipv6_mapped()
            .octets();
        let d = LegacyDest {
            gid: Some(gid),
            ..Default::default()
        };
        let m = d.encode();
        assert_eq!(m.len(), 78);
        assert_eq!(m[44], b':');
        assert!(m.ends_with(b"00000000000000000000ffffc6120001\0"));
        assert_eq!(read_dest(&mut &m[..]).unwrap(), d);
    }

    #[test]
    fn non_ascii_is_an_error_not_a_panic() {
        let gid = [0xfe; 16];
        let mut m = LegacyDest {
            gid: Some(gid),
            ..Default::default()
        }
        .encode();
        // A two-byte character where the GID's first hex pair starts.
        m[45] = b'0';
        m[46..48].copy_from_slice("é".as_bytes());
        let e = LegacyDest::decode(&m).unwrap_err().0;
        assert!(
            e.contains("GID byte 0") && e.contains("not a hex digit"),
            "{e}"
        );
        let mut m = LegacyDest::default().encode();
        m[5..7].copy_from_slice("é".as_bytes());
        let e = LegacyDest::decode(&m).unwrap_err().0;
        assert!(e.contains("QPN"), "{e}");
    }

    fn arb_dest() -> impl Strategy<Value = LegacyDest> {
        (
            any::<u16>(),
            0..=0xff_ffffu32,
            0..=0xff_ffffu32,
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(any::<[u8; 16]>()),
        )
            .prop_map(|(lid, qpn, psn, rkey, vaddr, gid)| LegacyDest {
                lid,
                qpn,
                psn,
                rkey,
                vaddr,
                gid,
            })
    }

    /// Every error names what was wrong: the size, the field count or a field.
    fn names_a_cause(e: &LegacyError) -> bool {
        [
            "bytes", "fields", "LID", "QPN", "PSN", "rkey", "vaddr", "GID",
        ]
        .iter()
        .any(|w| e.0.contains(w))
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Err(e) = LegacyDest::decode(&bytes) {
                prop_assert!(names_a_cause(&e), "{}", e);
            }
            if let Err(e) = read_dest(&mut &bytes[..]) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn arbitrary_text_of_the_right_size_never_panics(
            text in proptest::collection::vec(prop_oneof![
                Just(b':'), Just(b'0'), Just(b'f'), Just(0u8), any::<u8>()
            ], 45..=45),
        ) {
            if let Err(e) = LegacyDest::decode(&text) {
                prop_assert!(names_a_cause(&e), "{}", e);
            }
        }

        #[test]
        fn valid_messages_round_trip(d in arb_dest()) {
            let m = d.encode();
            prop_assert_eq!(LegacyDest::decode(&m), Ok(d));
            prop_assert_eq!(read_dest(&mut &m[..]).ok(), Some(d));
        }

        #[test]
        fn every_truncation_is_an_error(d in arb_dest()) {
            let m = d.encode();
            for cut in 0..m.len() {
                let e = LegacyDest::decode(&m[..cut]);
                prop_assert!(e.as_ref().is_err_and(names_a_cause), "cut at {}: {:?}", cut, e);
                prop_assert!(read_dest(&mut &m[..cut]).is_err(), "cut at {}", cut);
            }
        }
    }

    #[test]
    fn malformed_messages_are_errors() {
        assert!(LegacyDest::decode(&[b'x'; 45]).is_err());
        assert!(LegacyDest::decode(&[0; 10]).is_err());
        let mut m = LegacyDest::default().encode();
        m[3] = b'q';
        assert!(LegacyDest::decode(&m).is_err());
        assert!(read_dest(&mut &b"0000:"[..]).is_err(), "short read");
    }
}

/// C's `%g`: six significant digits, trailing zeros dropped, exponent form outside
/// 1e-4 .. 1e6.
pub fn c_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 {
                "inf".into()
            } else {
                "-inf".into()
            }
        } else {
            "0".into()
        };
    }
    let exp = v.abs().log10().floor() as i32;
    let strip = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    // Round to 6 significant digits first: that may change the exponent.
    let rounded: f64 = format!("{v:.5e}").parse().unwrap_or(v);
    let exp = if rounded != 0.0 {
        rounded.abs().log10().floor() as i32
    } else {
        exp
    };
    if !(-4..6).contains(&exp) {
        let s = format!("{rounded:.5e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        format!(
            "{}e{}{:02}",
            strip(m.to_string()),
            if e < 0 { '-' } else { '+' },
            e.abs()
        )
    } else {
        let decimals = (5 - exp).max(0) as usize;
        strip(format!("{rounded:.decimals$}"))
    }
}

#[cfg(test)]
mod g_tests {
    use super::c_g;

    #[test]
    fn percent_g() {
        assert_eq!(c_g(35.6), "35.6");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_g(0.0001234), "0.0001234");
        assert_eq!(c_g(0.00001234), "1.234e-05");
        assert_eq!(c_g(100.0), "100");
        assert_eq!(c_g(999999.7), "1e+06");
        assert_eq!(c_g(24.370001), "24.37");
    }
}
