//! perftest's out-of-band TCP protocol, as pure code over byte arrays (no I/O).
//!
//! Sequence (every exchange: the client writes then reads, the server reads then
//! writes): the 16-byte version, the system data (two big-endian 32-bit numbers), the
//! MTU as a 2-byte string, then "handshakes" that each exchange one key string per QP
//! (59 bytes without a GID, 108 with), and, for the one-sided bandwidth tests, the
//! client's results as big-endian 64-bit numbers and doubles.
//!
//! With `-R`/`-z` the same exchanges ride on SEND/RECV over a queue pair that the RDMA
//! CM connected (perftest's "rdma_cm" data exchange method): the fields are the same
//! bytes, except that a handshake carries perftest's `struct pingpong_dest` in binary
//! ([`KeyData::encode_binary`], 56 bytes) instead of the key string.

use crate::wire;
use std::fmt;

/// The version we announce: 6.06, as Debian's perftest. Announcing 6.06 also keeps
/// newer peers (6.28+) away from their raw-struct parameter negotiation.
pub const VERSION: &str = "6.06";
/// Size of the version field.
pub const VERSION_SIZE: usize = 16;
/// Oldest peer version perftest accepts.
pub const MIN_VERSION: f64 = 5.70;
/// Key string without a GID, NUL included.
pub const KEY_SIZE: usize = 59;
/// Key string with a GID, NUL included.
pub const KEY_SIZE_GID: usize = 108;

/// Size of the binary `struct pingpong_dest` of an rdma_cm handshake.
pub const KEY_SIZE_BINARY: usize = 56;

/// Malformed or incompatible data from the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "perftest protocol: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn err<T>(text: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(text.into()))
}

/// Our version field: `6.06` padded with NULs to 16 bytes.
pub fn encode_version() -> [u8; VERSION_SIZE] {
    let mut out = [0u8; VERSION_SIZE];
    out[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    out
}

/// Parses the peer's version field (as `atof`) and refuses peers below 5.70.
pub fn decode_version(raw: &[u8; VERSION_SIZE]) -> Result<f64, ProtocolError> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let text = std::str::from_utf8(&raw[..end])
        .map_err(|_| ProtocolError("the peer's version is not text".into()))?;
    // atof reads the longest numeric prefix: "6.06", "5.70-foo", ...
    let prefix: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let v: f64 = prefix
        .parse()
        .map_err(|_| ProtocolError(format!("the peer's version {text:?} is not a number")))?;
    if v < MIN_VERSION {
        return err(format!(
            "the peer's version {text:?} is older than 5.70, which perftest refuses"
        ));
    }
    Ok(v)
}

/// A 32-bit number in network order (the system data fields).
pub fn encode_u32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// Decodes a network-order 32-bit number.
pub fn decode_u32(raw: &[u8; 4]) -> u32 {
    u32::from_be_bytes(*raw)
}

/// The largest cycle buffer a peer may announce: 1 MiB. perftest sends its page
/// size (4 KiB, 16 KiB or 64 KiB on the hosts it runs on), and the larger of the
/// two sizes every queue pair's slot, all of it registered and pinned before a
/// key is exchanged.
pub const MAX_CYCLE_BUFFER: u32 = 1 << 20;

/// Checks the peer's cycle buffer (the first system data field): a power of two
/// of at most [`MAX_CYCLE_BUFFER`]. C perftest takes any value, so a peer that
/// announced 2 GiB had it allocate and pin 4 GiB per queue pair.
pub fn check_cycle_buffer(theirs: u32) -> Result<u32, ProtocolError> {
    if theirs.is_power_of_two() && theirs <= MAX_CYCLE_BUFFER {
        return Ok(theirs);
    }
    err(format!(
        "the peer's cycle buffer of {theirs} bytes is not a page size (a power of two \
         up to {MAX_CYCLE_BUFFER}): refused, as it would size every buffer"
    ))
}

/// The MTU field: the `ibv_mtu` value (1..=5) as one decimal digit and a NUL.
pub fn encode_mtu(mtu_enum: u32) -> [u8; 2] {
    let digit = b'0' + (mtu_enum.min(9) as u8);
    [digit, 0]
}

/// Parses the peer's MTU field; `None` when it is not a valid `ibv_mtu` value
/// (perftest then keeps its own).
pub fn decode_mtu(raw: &[u8; 2]) -> Option<u32> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(2);
    let v: u32 = std::str::from_utf8(&raw[..end]).ok()?.parse().ok()?;
    (1..=5).contains(&v).then_some(v)
}

/// What one side tells the other per QP ("pingpong_dest").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KeyData {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// RDMA READs the sender accepts in flight (its `max_dest_rd_atomic`).
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// rkey of the memory the peer may access.
    pub rkey: u32,
    /// Address of that memory.
    pub vaddr: u64,
    /// The GID; present iff the sender uses a GID index (`-x`, RoCE).
    pub gid: Option<[u8; 16]>,
    /// SRQ number (XRC/DC; 0 here).
    pub srqn: u32,
}

/// Checks the first [`KEY_SIZE`] bytes of the peer's key string against the form
/// ours has: the short form ends there (a NUL), the GID form goes on (a `:`). A
/// peer of the other form would otherwise leave one side waiting for bytes that
/// never come.
pub fn check_key_form(head: &[u8], with_gid: bool) -> Result<(), ProtocolError> {
    let short = head.get(KEY_SIZE - 1) == Some(&0);
    let (theirs, ours) = match (short, with_gid) {
        (true, true) => ("no GID", "ours has one"),
        (false, false) => ("a GID", "ours has none"),
        _ => return Ok(()),
    };
    err(format!(
        "the peer's key string has {theirs} and {ours}: one side uses a GID (-x, \
         RoCE's default) and the other not; give both the same -x"
    ))
}

impl KeyData {
    /// The key string: 59 bytes without GID, 108 with, NUL-terminated.
    pub fn encode(&self) -> Vec<u8> {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        match self.gid {
            None => text.push_str(&format!("{:08x}", self.srqn)),
            Some(gid) => {
                for b in gid {
                    text.push_str(&format!("{b:02x}:"));
                }
                text.push_str(&format!("{:08x}:", self.srqn));
            }
        }
        let size = if self.gid.is_some() {
            KEY_SIZE_GID
        } else {
            KEY_SIZE
        };
        let mut out = vec![0u8; size];
        let n = text.len().min(size - 1);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out
    }

    /// Parses a key string of the form both sides agreed on (`with_gid`).
    pub fn decode(raw: &[u8], with_gid: bool) -> Result<KeyData, ProtocolError> {
        let want = if with_gid { KEY_SIZE_GID } else { KEY_SIZE };
        if raw.len() != want {
            return err(format!(
                "key string of {} bytes, expected {want} (do both sides use -x?)",
                raw.len()
            ));
        }
        let text = wire::c_str(raw);
        let fields = wire::colon_fields(text);
        let need = if with_gid { 23 } else { 7 };
        if fields.len() < need {
            return err(format!(
                "key string {} has {} fields, expected {need} (do both sides use -x?)",
                wire::show(text),
                fields.len()
            ));
        }
        let hex = |i: usize, name: &str, max: u64| -> Result<u64, ProtocolError> {
            wire::hex_field(name, fields[i], max)
                .map_err(|e| ProtocolError(format!("{e} in key string {}", wire::show(text))))
        };
        let mut key = KeyData {
            lid: hex(0, "LID", 0xffff)? as u16,
            out_reads: hex(1, "out_reads", 0xffff_ffff)? as u32,
            qpn: hex(2, "QPN", 0xff_ffff)? as u32,
            psn: hex(3, "PSN", 0xff_ffff)? as u32,
            rkey: hex(4, "rkey", 0xffff_ffff)? as u32,
            vaddr: hex(5, "vaddr", u64::MAX)?,
            gid: None,
            srqn: 0,
        };
        if with_gid {
            let mut gid = [0u8; 16];
            for (i, b) in gid.iter_mut().enumerate() {
                *b = hex(6 + i, &format!("GID byte {i}"), 0xff)? as u8;
            }
            key.gid = Some(gid);
            key.srqn = hex(22, "SRQN", 0xffff_ffff)? as u32;
        } else {
            key.srqn = hex(6, "SRQN", 0xffff_ffff)? as u32;
        }
        Ok(key)
    }
}

impl KeyData {
    /// perftest's `struct pingpong_dest` as `rdma_write_keys` sends it (built with
    /// `HAVE_ENDIAN`): LID, out_reads, QPN, PSN and rkey as big-endian 32-bit numbers
    /// at 0, 4, 8, 12 and 16, 4 bytes of padding, the address as a big-endian 64-bit
    /// number at 24, the 16 GID bytes at 32, SRQN at 48 and the GID index at 52
    /// (both big-endian), 56 bytes in all.
    pub fn encode_binary(&self, gid_index: i32) -> [u8; KEY_SIZE_BINARY] {
        let mut out = [0u8; KEY_SIZE_BINARY];
        out[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        out[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        out[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        out[12..16].copy_from_slice(&self.psn.to_be_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        out[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        out[32..48].copy_from_slice(&self.gid.unwrap_or_default());
        out[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        out[52..56].copy_from_slice(&gid_index.to_be_bytes());
        out
    }

    /// Parses a binary `struct pingpong_dest` as `rdma_read_keys` does: the SRQN and
    /// GID index are not read (perftest keeps its own); the GID is kept when
    /// `with_gid` (the text form's rule: both sides use a GID index).
    pub fn decode_binary(raw: &[u8], with_gid: bool) -> Result<KeyData, ProtocolError> {
        if raw.len() < KEY_SIZE_BINARY {
            return err(format!(
                "binary key data of {} bytes, expected {KEY_SIZE_BINARY}",
                raw.len()
            ));
        }
        let u32_at = |i: usize| u32::from_be_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
        let lid = u32_at(0);
        if lid > 0xffff {
            return err(format!("LID {lid:#x} out of range in binary key data"));
        }
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&raw[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&raw[32..48]);
        Ok(KeyData {
            lid: lid as u16,
            out_reads: u32_at(4),
            qpn: u32_at(8) & 0xff_ffff,
            psn: u32_at(12) & 0xff_ffff,
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid: with_gid.then_some(gid),
            srqn: 0,
        })
    }
}

/// The client's bandwidth results, sent to a one-sided server after the test.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations (times QPs).
    pub iters: u64,
    /// Peak bandwidth (MiB/s or Gb/s, as reported).
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Message rate in Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five 8-byte fields, each exchanged on its own, in order: size, iterations
    /// (big-endian 64-bit, peers >= 5.33), peak, average and message rate (big-endian
    /// IEEE doubles).
    pub fn encode(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// Decodes the five fields; non-finite or negative numbers are refused.
    pub fn decode(raw: &[[u8; 8]; 5]) -> Result<BwReport, ProtocolError> {
        let f = |b: &[u8; 8]| f64::from_bits(u64::from_be_bytes(*b));
        let rep = BwReport {
            size: u64::from_be_bytes(raw[0]),
            iters: u64::from_be_bytes(raw[1]),
            bw_peak: f(&raw[2]),
            bw_avg: f(&raw[3]),
            msg_rate: f(&raw[4]),
        };
        for (name, v) in [
            ("peak bandwidth", rep.bw_peak),
            ("average bandwidth", rep.bw_avg),
            ("message rate", rep.msg_rate),
        ] {
            if !v.is_finite() || v < 0.0 {
                return err(format!("the peer's {name} {v} is not a valid result"));
            }
        }
        Ok(rep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn version_field() {
        let v = encode_version();
        assert_eq!(&v[..5], b"6.06\0");
        assert_eq!(v.len(), 16);
        assert!(v[4..].iter().all(|&b| b == 0));
        assert_eq!(decode_version(&v).unwrap(), 6.06);
        let mut old = [0u8; 16];
        old[..4].copy_from_slice(b"5.60");
        assert!(decode_version(&old).unwrap_err().0.contains("5.70"));
        assert!(decode_version(&[0u8; 16]).is_err());
        assert!(decode_version(&[b'x'; 16]).is_err());
        let mut newer = [0u8; 16];
        newer[..5].copy_from_slice(b"25.10");
        assert_eq!(decode_version(&newer).unwrap(), 25.10);
    }

    #[test]
    fn system_data_is_big_endian() {
        assert_eq!(encode_u32(4096), [0, 0, 0x10, 0]);
        assert_eq!(encode_u32(64), [0, 0, 0, 64]);
        assert_eq!(decode_u32(&[0, 0, 0x10, 0]), 4096);
    }

    #[test]
    fn a_key_string_of_the_other_form_is_told_at_its_first_bytes() {
        let plain = KeyData::default().encode();
        let with = KeyData {
            gid: Some([7; 16]),
            ..Default::default()
        }
        .encode();
        assert_eq!(check_key_form(&plain[..KEY_SIZE], false), Ok(()));
        assert_eq!(check_key_form(&with[..KEY_SIZE], true), Ok(()));
        for (head, ours) in [(&with[..KEY_SIZE], false), (&plain[..KEY_SIZE], true)] {
            let why = check_key_form(head, ours).unwrap_err().0;
            assert!(why.contains("-x"), "{why}");
        }
    }

    #[test]
    fn a_cycle_buffer_is_a_page_size() {
        for ok in [4096, 16384, 65536, MAX_CYCLE_BUFFER] {
            assert_eq!(check_cycle_buffer(ok), Ok(ok));
        }
        for bad in [0, 3000, 0x8000_0000, u32::MAX, MAX_CYCLE_BUFFER * 2] {
            let why = check_cycle_buffer(bad).unwrap_err().0;
            assert!(
                why.contains("cycle buffer") && why.contains(&bad.to_string()),
                "{why}"
            );
        }
    }

    #[test]
    fn mtu_field() {
        assert_eq!(encode_mtu(3), *b"3\0");
        assert_eq!(encode_mtu(5), *b"5\0");
        assert_eq!(decode_mtu(b"3\0"), Some(3));
        assert_eq!(decode_mtu(b"9\0"), None);
        assert_eq!(decode_mtu(b"x\0"), None);
        assert_eq!(decode_mtu(&[0, 0]), None);
    }

    #[test]
    fn key_string_without_gid_is_59_bytes() {
        let k = KeyData {
            lid: 0x12,
            out_reads: 1,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x313,
            vaddr: 0x558df4a23000,
            gid: None,
            srqn: 0,
        };
        let raw = k.encode();
        assert_eq!(raw.len(), 59);
        assert_eq!(
            &raw[..58],
            b"0012:0001:000011:abcdef:00000313:0000558df4a23000:00000000"
        );
        assert_eq!(raw[58], 0);
        assert_eq!(KeyData::decode(&raw, false).unwrap(), k);
    }

    #[test]
    fn key_string_with_gid_is_108_bytes() {
        let gid = std::net::Ipv4Addr::new(198, 18, 0, 1)
            .to_ipv6_mapped()
            .octets();
        let k = KeyData {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x12,
            psn: 0x38c7,
            rkey: 0x227,
            vaddr: 0x55829c734000,
            gid: Some(gid),
            srqn: 0,
        };
        let raw = k.encode();
        assert_eq!(raw.len(), 108);
        let text = std::str::from_utf8(&raw[..107]).unwrap();
        assert_eq!(
            text,
            "0000:0010:000012:0038c7:00000227:000055829c734000:\
             00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:01:00000000:"
        );
        assert_eq!(raw[107], 0);
        assert_eq!(KeyData::decode(&raw, true).unwrap(), k);
    }

    #[test]
    fn binary_key_is_perftests_struct() {
        let gid = std::net::Ipv4Addr::new(198, 18, 0, 1)
            .to_ipv6_mapped()
            .octets();
        let k = KeyData {
            lid: 0x12,
            out_reads: 16,
            qpn: 0x13,
            psn: 0xdb6921,
            rkey: 0x227,
            vaddr: 0x55829c734000,
            gid: Some(gid),
            srqn: 0,
        };
        let raw = k.encode_binary(1);
        assert_eq!(raw.len(), 56);
        assert_eq!(&raw[0..4], &[0, 0, 0, 0x12]);
        assert_eq!(&raw[4..8], &[0, 0, 0, 16]);
        assert_eq!(&raw[8..12], &[0, 0, 0, 0x13]);
        assert_eq!(&raw[12..16], &[0, 0xdb, 0x69, 0x21]);
        assert_eq!(&raw[16..20], &[0, 0, 0x02, 0x27]);
        assert_eq!(&raw[20..24], &[0; 4], "padding");
        assert_eq!(&raw[24..32], &[0, 0, 0x55, 0x82, 0x9c, 0x73, 0x40, 0]);
        assert_eq!(&raw[32..48], &gid);
        assert_eq!(&raw[52..56], &[0, 0, 0, 1], "GID index");
        assert_eq!(KeyData::decode_binary(&raw, true).unwrap(), k);
        let no_gid = KeyData::decode_binary(&raw, false).unwrap();
        assert_eq!(no_gid.gid, None);
        assert!(KeyData::decode_binary(&raw[..40], true).is_err(), "short");
        let mut bad = raw;
        bad[0] = 1;
        assert!(
            KeyData::decode_binary(&bad, true).is_err(),
            "LID above 16 bits"
        );
    }

    #[test]
    fn malformed_keys_are_errors() {
        let k = KeyData::default().encode();
        assert!(KeyData::decode(&k, true).is_err(), "wrong form");
        assert!(KeyData::decode(&k[..40], false).is_err(), "short");
        let mut bad = k.clone();
        bad[0] = b'g';
        assert!(KeyData::decode(&bad, false).unwrap_err().0.contains("hex"));
        let mut cut = k.clone();
        cut[10] = 0;
        assert!(KeyData::decode(&cut, false).is_err(), "truncated text");
        assert!(KeyData::decode(&[0xffu8; 59], false).is_err());
        assert!(KeyData::decode(&[b':'; 108], true).is_err());
    }

    #[test]
    fn non_ascii_key_string_is_an_error() {
        let mut raw = KeyData::default().encode();
        raw[0..2].copy_from_slice("é".as_bytes());
        let e = KeyData::decode(&raw, false).unwrap_err().0;
        assert!(e.contains("LID") && e.contains("not a hex digit"), "{e}");
        let mut raw = KeyData {
            gid: Some([0; 16]),
            ..Default::default()
        }
        .encode();
        raw[51..53].copy_from_slice("é".as_bytes());
        let e = KeyData::decode(&raw, true).unwrap_err().0;
        assert!(e.contains("GID byte 0"), "{e}");
    }

    fn arb_key(gid: bool) -> impl Strategy<Value = KeyData> {
        (
            any::<u16>(),
            // perftest prints out_reads with "%04x" into a fixed-size message: a valid
            // key string has at most four digits there.
            0..=0xffffu32,
            0..=0xff_ffffu32,
            0..=0xff_ffffu32,
            any::<u32>(),
            any::<u64>(),
            any::<[u8; 16]>(),
            any::<u32>(),
        )
            .prop_map(
                move |(lid, out_reads, qpn, psn, rkey, vaddr, g, srqn)| KeyData {
                    lid,
                    out_reads,
                    qpn,
                    psn,
                    rkey,
                    vaddr,
                    gid: gid.then_some(g),
                    srqn,
                },
            )
    }

    /// Every rejection names its cause.
    fn named(e: &ProtocolError) -> bool {
        [
            "bytes",
            "fields",
            "LID",
            "out_reads",
            "QPN",
            "PSN",
            "rkey",
            "vaddr",
            "GID",
            "SRQN",
            "version",
            "result",
            "bandwidth",
            "rate",
        ]
        .iter()
        .any(|w| e.0.contains(w))
    }

    proptest! {
        #[test]
        fn key_strings_of_arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..120),
            with_gid in any::<bool>(),
        ) {
            if let Err(e) = KeyData::decode(&bytes, with_gid) {
                prop_assert!(named(&e), "{}", e);
            }
            if let Err(e) = KeyData::decode_binary(&bytes, with_gid) {
                prop_assert!(named(&e), "{}", e);
            }
        }

        #[test]
        fn key_string_shaped_bytes_never_panic(
            text in proptest::collection::vec(prop_oneof![
                Just(b':'), Just(b'0'), Just(b'a'), Just(0u8), any::<u8>()
            ], 108..=108),
        ) {
            for (raw, gid) in [(&text[..], true), (&text[..59], false)] {
                if let Err(e) = KeyData::decode(raw, gid) {
                    prop_assert!(named(&e), "{}", e);
                }
            }
        }

        #[test]
        fn key_strings_round_trip(k in arb_key(false), kg in arb_key(true)) {
            prop_assert_eq!(KeyData::decode(&k.encode(), false), Ok(k));
            prop_assert_eq!(KeyData::decode(&kg.encode(), true), Ok(kg));
        }

        #[test]
        fn truncated_key_strings_are_errors(k in arb_key(true)) {
            let raw = k.encode();
            // Where the last field (SRQN) starts: a cut before it loses a field.
            let last = raw.iter().enumerate().filter(|(_, &b)| b == b':').nth(21).unwrap().0 + 1;
            for cut in 0..raw.len() {
                let e = KeyData::decode(&raw[..cut], true);
                prop_assert!(e.as_ref().is_err_and(named), "cut at {}", cut);
                // The same bytes NUL-padded to the full size (as a C peer's short
                // sprintf leaves them): refused while a field is missing, and never a
                // panic (sscanf, too, takes a shortened last number).
                let mut padded = raw[..cut].to_vec();
                padded.resize(raw.len(), 0);
                let e = KeyData::decode(&padded, true);
                if cut <= last {
                    prop_assert!(e.as_ref().is_err_and(named), "cut at {}: {:?}", cut, e);
                }
            }
        }

        #[test]
        fn binary_keys_round_trip_and_truncations_fail(k in arb_key(true), idx in any::<i32>()) {
            let raw = k.encode_binary(idx);
            let back = KeyData::decode_binary(&raw, true);
            prop_assert_eq!(back, Ok(KeyData { srqn: 0, ..k }));
            for cut in 0..raw.len() {
                let e = KeyData::decode_binary(&raw[..cut], true);
                prop_assert!(e.as_ref().is_err_and(named), "cut at {}", cut);
            }
        }

        #[test]
        fn version_and_mtu_never_panic(v in any::<[u8; 16]>(), m in any::<[u8; 2]>()) {
            if let Err(e) = decode_version(&v) {
                prop_assert!(named(&e), "{}", e);
            }
            if let Some(mtu) = decode_mtu(&m) {
                prop_assert!((1..=5).contains(&mtu));
            }
        }

        #[test]
        fn reports_never_panic_and_round_trip(raw in any::<[[u8; 8]; 5]>(), peak in 0.0..1e9f64) {
            match BwReport::decode(&raw) {
                Ok(r) => prop_assert!(r.bw_peak.is_finite() && r.bw_avg >= 0.0),
                Err(e) => prop_assert!(named(&e), "{}", e),
            }
            let r = BwReport { size: 1, iters: 2, bw_peak: peak, bw_avg: peak / 2.0, msg_rate: 0.5 };
            prop_assert_eq!(BwReport::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn results_are_big_endian() {
        let r = BwReport {
            size: 65536,
            iters: 200,
            bw_peak: 58.85,
            bw_avg: 55.40,
            msg_rate: 0.000886,
        };
        let raw = r.encode();
        assert_eq!(raw[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(raw[1], [0, 0, 0, 0, 0, 0, 0, 200]);
        assert_eq!(raw[2], 58.85f64.to_bits().to_be_bytes());
        assert_eq!(raw[3][0], 0x40); // 55.4 = 0x404BB33333333333
        assert_eq!(BwReport::decode(&raw).unwrap(), r);
        let mut nan = raw;
        nan[3] = f64::NAN.to_bits().to_be_bytes();
        assert!(BwReport::decode(&nan).is_err());
    }
}
