//! The KIARA InfiniBand wire protocol, version 5: pure encoding and decoding, no I/O.
//! `docs/kiara-protocol.md` is the prose version of this file.
//!
//! Two messages exist:
//! - [`Hello`]: sent once each way over the bootstrap TCP connection (the client
//!   writes first; the server reads and checks it before it creates anything, then
//!   answers), carrying what connects the RC queue pairs and the limits.
//! - [`Control`]: the payload of every RDMA SEND: a data descriptor (the receiver then
//!   RDMA-READs the bytes), an eager message (bytes inline), an acknowledgement (the
//!   sender may reuse its buffer), a credit return, or a goodbye.
//!
//! Every integer is big-endian. Decoding checks every length and range and returns a
//! [`ProtocolError`] that names what is wrong; it never panics.

use std::fmt;

/// First bytes of a hello.
pub const HELLO_MAGIC: [u8; 4] = *b"KIAR";
/// Protocol version written by this crate.
pub const VERSION: u16 = 5;
/// Header of a hello: magic, version, body length.
pub const HELLO_HEADER_LEN: usize = 8;
/// Body of a version 5 hello (the same fields as versions 1 to 4).
pub const HELLO_BODY_LEN: usize = 52;
/// Largest hello body accepted (room for later versions, bounded against hostile peers).
pub const HELLO_MAX_BODY_LEN: usize = 512;
/// Fixed header of a control message.
pub const CONTROL_HEADER_LEN: usize = 40;
/// Fewest receive slots a side may offer: messages keep 3 credits in reserve for
/// acknowledgements and credit returns.
pub const MIN_CREDITS: u32 = 8;
/// Most receive slots a side may offer (each costs the peer nothing, but the number
/// sizes the peer's bookkeeping): a hello offering more is refused.
pub const MAX_CREDITS: u32 = 4096;
/// Largest receive slot a hello may announce (header, metadata and eager payload).
pub const MAX_SLOT_SIZE: usize = 1 << 20;
/// Largest message a hello may announce as accepted (1 GiB).
pub const MAX_MESSAGE: u64 = 1 << 30;
/// Largest metadata carried with a message.
pub const MAX_META_LEN: usize = 64;
/// Bytes of a receive slot that are not eager payload: the control header and the
/// largest metadata.
pub const SLOT_OVERHEAD: usize = CONTROL_HEADER_LEN + MAX_META_LEN;

/// A decoding failure: the peer broke the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn err<T>(text: String) -> Result<T, ProtocolError> {
    Err(ProtocolError(text))
}

/// What each side tells the other over TCP before the queue pairs connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First send PSN (24 bits).
    pub psn: u32,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU as `ibv_mtu` (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// GID, required on RoCE.
    pub gid: Option<[u8; 16]>,
    /// Receive slots the sender of this hello posted: the peer's initial send credits.
    pub credits: u32,
    /// Size of each receive slot: the largest control message the peer may send.
    pub slot_size: u32,
    /// Largest message the sender of this hello accepts.
    pub max_message: u64,
    /// Largest payload the sender of this hello sends inside a control message.
    pub eager_threshold: u32,
}

impl Hello {
    /// The queue pair this hello describes, as the remote end to move a queue pair
    /// to RTR towards (its QPN, PSN, LID and GID).
    pub fn endpoint(&self) -> rdma_safe::RemoteEndpoint {
        rdma_safe::RemoteEndpoint {
            qpn: self.qpn,
            psn: self.psn,
            lid: self.lid,
            gid: self.gid.map(rdma_safe::Gid),
        }
    }

    /// The bytes on the wire.
    pub fn encode(&self) -> [u8; HELLO_HEADER_LEN + HELLO_BODY_LEN] {
        let mut b = [0u8; HELLO_HEADER_LEN + HELLO_BODY_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[6..8].copy_from_slice(&(HELLO_BODY_LEN as u16).to_be_bytes());
        let body = &mut b[HELLO_HEADER_LEN..];
        body[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        body[4..8].copy_from_slice(&self.psn.to_be_bytes());
        body[8..10].copy_from_slice(&self.lid.to_be_bytes());
        body[10] = self.mtu;
        body[11] = u8::from(self.gid.is_some());
        body[12..28].copy_from_slice(&self.gid.unwrap_or_default());
        body[28..32].copy_from_slice(&self.credits.to_be_bytes());
        body[32..36].copy_from_slice(&self.slot_size.to_be_bytes());
        body[36..44].copy_from_slice(&self.max_message.to_be_bytes());
        body[44..48].copy_from_slice(&self.eager_threshold.to_be_bytes());
        b
    }

    /// Checks a hello header; returns the body length to read next.
    pub fn decode_header(h: &[u8; HELLO_HEADER_LEN]) -> Result<usize, ProtocolError> {
        if h[0..4] != HELLO_MAGIC {
            return err(format!(
                "not a KIARA peer: hello starts with {:02x?}, expected \"KIAR\"",
                &h[0..4]
            ));
        }
        let version = u16::from_be_bytes([h[4], h[5]]);
        if version != VERSION {
            return err(format!(
                "protocol version mismatch: the peer speaks version {version}, this side \
                 version {VERSION}"
            ));
        }
        let len = u16::from_be_bytes([h[6], h[7]]) as usize;
        if !(HELLO_BODY_LEN..=HELLO_MAX_BODY_LEN).contains(&len) {
            return err(format!(
                "hello body of {len} bytes (expected {HELLO_BODY_LEN}..={HELLO_MAX_BODY_LEN})"
            ));
        }
        Ok(len)
    }

    /// Decodes a hello body; bytes after the known fields are ignored. Every field is
    /// bounded (see the constants of this module); a rejection names the field, its
    /// value and the limit.
    pub fn decode_body(b: &[u8]) -> Result<Hello, ProtocolError> {
        if b.len() < HELLO_BODY_LEN {
            return err(format!(
                "hello truncated: {} of {HELLO_BODY_LEN} body bytes",
                b.len()
            ));
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let hello = Hello {
            qpn: u32_at(0),
            psn: u32_at(4),
            lid: u16::from_be_bytes([b[8], b[9]]),
            mtu: b[10],
            gid: (b[11] & 1 != 0).then(|| b[12..28].try_into().expect("16 bytes")),
            credits: u32_at(28),
            slot_size: u32_at(32),
            max_message: u64::from_be_bytes(b[36..44].try_into().expect("8 bytes")),
            eager_threshold: u32_at(44),
        };
        if b[11] & !1 != 0 {
            return err(format!(
                "hello flags {:#04x}: unknown bits set (only bit 0, GID present, is defined)",
                b[11]
            ));
        }
        hello.check_address()?;
        hello.check_sizes()?;
        Ok(hello)
    }

    /// The queue pair's number, first PSN and MTU: each in its range.
    fn check_address(&self) -> Result<(), ProtocolError> {
        for (name, v) in [("QPN", self.qpn), ("PSN", self.psn)] {
            if v > 0xff_ffff {
                return err(format!("hello {name} {v:#x} does not fit in 24 bits"));
            }
        }
        if !(1..=5).contains(&self.mtu) {
            return err(format!(
                "hello MTU code {} is not 1..=5 (256 to 4096 bytes)",
                self.mtu
            ));
        }
        Ok(())
    }

    /// Credits, largest message, slot size and eager threshold: each in its range,
    /// and the eager threshold within both the slot and the largest message.
    fn check_sizes(&self) -> Result<(), ProtocolError> {
        if !(MIN_CREDITS..=MAX_CREDITS).contains(&self.credits) {
            return err(format!(
                "hello credits {} out of range: at least {MIN_CREDITS} are needed, at most \
                 {MAX_CREDITS} are accepted",
                self.credits
            ));
        }
        if !(1..=MAX_MESSAGE).contains(&self.max_message) {
            return err(format!(
                "hello largest message {} bytes out of range 1..={MAX_MESSAGE}",
                self.max_message
            ));
        }
        let least = SLOT_OVERHEAD as u64;
        let slot = u64::from(self.slot_size);
        if !(least..=MAX_SLOT_SIZE as u64).contains(&slot) {
            return err(format!(
                "hello slot size {slot} bytes out of range {least}..={MAX_SLOT_SIZE} (a \
                 control message's header and metadata take {least})"
            ));
        }
        let eager = u64::from(self.eager_threshold);
        if eager > slot - least {
            return err(format!(
                "hello eager threshold {eager} bytes exceeds what its receive slots of \
                 {slot} bytes hold ({} after the header and metadata)",
                slot - least
            ));
        }
        if eager > self.max_message {
            return err(format!(
                "hello eager threshold {eager} bytes exceeds its largest message ({})",
                self.max_message
            ));
        }
        Ok(())
    }
}

/// The kind of a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A descriptor: the receiver fetches `len` bytes at `addr` with `rkey` by RDMA READ.
    Data,
    /// The payload follows the header and metadata.
    Eager,
    /// The receiver has the message `msg_id`; `len` is 0 (delivered) or an error code.
    Ack,
    /// Only returns credits.
    Credit,
    /// The sender closes the session.
    Bye,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Data => 1,
            Kind::Eager => 2,
            Kind::Ack => 3,
            Kind::Credit => 4,
            Kind::Bye => 5,
        }
    }

    fn from_code(c: u8) -> Result<Kind, ProtocolError> {
        Ok(match c {
            1 => Kind::Data,
            2 => Kind::Eager,
            3 => Kind::Ack,
            4 => Kind::Credit,
            5 => Kind::Bye,
            other => return err(format!("unknown control message type {other}")),
        })
    }
}

/// The fixed part of a control message; metadata and eager payload follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Control {
    /// What it is.
    pub kind: Option<Kind>,
    /// Length of the metadata after the header.
    pub meta_len: u8,
    /// Receive slots of the sender's peer that were consumed and reposted: the
    /// receiver of this message may send that many more.
    pub credits: u32,
    /// The message this is about.
    pub msg_id: u64,
    /// Data/Eager: payload length. Ack: 0 for delivered, else an error code.
    pub len: u64,
    /// Data: where the payload is.
    pub addr: u64,
    /// Data: the key that lets the receiver read it. Ack: the key of the message
    /// acknowledged, which the ACK invalidates if it is a SEND_WITH_INV.
    pub rkey: u32,
    /// The low 32 bits of the highest message id the sender of this control message
    /// has received from its peer (0: none yet). It completes the peer's eager sends
    /// up to that id without waiting for their SEND completions.
    pub seen: u32,
}

/// The full message id that a control message's `seen` (its low 32 bits) names,
/// given the highest id this side has sent: the id with those low bits that is not
/// above `last_sent` (0 when there is none).
pub fn widen_seen(seen: u32, last_sent: u64) -> u64 {
    let upto = (last_sent & !0xffff_ffff) | u64::from(seen);
    if upto > last_sent {
        upto.saturating_sub(1 << 32)
    } else {
        upto
    }
}

/// A decoded control message, borrowing its metadata and eager payload.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The header.
    pub header: Control,
    /// The kind (never `None` after decoding).
    pub kind: Kind,
    /// Metadata bytes.
    pub meta: &'a [u8],
    /// Eager payload bytes (empty otherwise).
    pub payload: &'a [u8],
}

/// Limits a receiver enforces on what it decodes.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest message accepted.
    pub max_message: u64,
    /// Largest eager payload accepted.
    pub eager_threshold: u32,
}

impl Control {
    /// Writes the header into `out[..CONTROL_HEADER_LEN]`.
    pub fn write_header(&self, kind: Kind, out: &mut [u8]) {
        out[0] = kind.code();
        out[1] = self.meta_len;
        out[2..4].fill(0);
        out[4..8].copy_from_slice(&self.credits.to_be_bytes());
        out[8..16].copy_from_slice(&self.msg_id.to_be_bytes());
        out[16..24].copy_from_slice(&self.len.to_be_bytes());
        out[24..32].copy_from_slice(&self.addr.to_be_bytes());
        out[32..36].copy_from_slice(&self.rkey.to_be_bytes());
        out[36..40].copy_from_slice(&self.seen.to_be_bytes());
    }

    /// Decodes a received control message of exactly `bytes.len()` bytes.
    pub fn decode<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Decoded<'a>, ProtocolError> {
        let (kind, header) = Self::read_header(bytes)?;
        let meta_len = header.meta_len as usize;
        if meta_len > MAX_META_LEN {
            return err(format!(
                "metadata of {meta_len} bytes exceeds {MAX_META_LEN}"
            ));
        }
        let rest = &bytes[CONTROL_HEADER_LEN..];
        if rest.len() < meta_len {
            return err(format!(
                "control message truncated: {} of {meta_len} metadata bytes",
                rest.len()
            ));
        }
        let (meta, tail) = rest.split_at(meta_len);
        match kind {
            Kind::Eager => header.check_eager(tail.len(), limits)?,
            Kind::Data => header.check_data(tail.len(), limits)?,
            Kind::Ack | Kind::Credit | Kind::Bye => {
                if !rest.is_empty() {
                    return err(format!(
                        "{kind:?} message carries {} unexpected bytes",
                        rest.len()
                    ));
                }
            }
        }
        Ok(Decoded {
            header,
            kind,
            meta,
            payload: tail,
        })
    }

    /// The kind and the fixed header at the start of `bytes`.
    fn read_header(bytes: &[u8]) -> Result<(Kind, Control), ProtocolError> {
        // One length check; the fields' offsets are then checked at compile time.
        let Some(h) = bytes.first_chunk::<CONTROL_HEADER_LEN>() else {
            return err(format!(
                "control message truncated: {} of {CONTROL_HEADER_LEN} header bytes",
                bytes.len()
            ));
        };
        let kind = Kind::from_code(h[0])?;
        let u64_at = |i: usize| u64::from_be_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_be_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let header = Control {
            kind: Some(kind),
            meta_len: h[1],
            credits: u32_at(4),
            msg_id: u64_at(8),
            len: u64_at(16),
            addr: u64_at(24),
            rkey: u32_at(32),
            seen: u32_at(36),
        };
        Ok((kind, header))
    }

    /// An eager message's header against the `payload` bytes that follow its
    /// metadata.
    fn check_eager(&self, payload: usize, limits: &Limits) -> Result<(), ProtocolError> {
        if self.len > limits.eager_threshold as u64 {
            return err(format!(
                "eager message of {} bytes exceeds the eager threshold {}",
                self.len, limits.eager_threshold
            ));
        }
        if payload as u64 != self.len {
            return err(format!(
                "eager message announces {} bytes but carries {payload}",
                self.len
            ));
        }
        Ok(())
    }

    /// A data descriptor, followed by `stray` bytes after its metadata (none allowed).
    fn check_data(&self, stray: usize, limits: &Limits) -> Result<(), ProtocolError> {
        if self.len == 0 {
            return err("data descriptor of 0 bytes (empty messages travel eager)".into());
        }
        if self.len > limits.max_message {
            return err(format!(
                "message of {} bytes exceeds the limit of {} bytes",
                self.len, limits.max_message
            ));
        }
        if self.addr.checked_add(self.len).is_none() {
            return err(format!(
                "descriptor {:#x} + {} bytes wraps around the address space",
                self.addr, self.len
            ));
        }
        if stray != 0 {
            return err(format!("{stray} stray bytes after a data descriptor"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            qpn: 0x11,
            psn: 0x12_3456,
            lid: 0,
            mtu: 3,
            gid: Some([9; 16]),
            credits: 32,
            slot_size: 4096 + 104,
            max_message: 8 << 20,
            eager_threshold: 4096,
        }
    }

    const LIMITS: Limits = Limits {
        max_message: 1 << 20,
        eager_threshold: 64,
    };

    #[test]
    fn hello_round_trip_and_every_truncation() {
        let bytes = hello().encode();
        let len = Hello::decode_header(bytes[..8].try_into().unwrap()).unwrap();
        assert_eq!(Hello::decode_body(&bytes[8..8 + len]).unwrap(), hello());
        for n in 0..HELLO_BODY_LEN {
            assert!(Hello::decode_body(&bytes[8..8 + n]).is_err());
        }
    }

    #[test]
    fn seen_widens_to_the_nearest_id_sent() {
        assert_eq!(widen_seen(0, 0), 0);
        assert_eq!(widen_seen(7, 9), 7);
        assert_eq!(widen_seen(9, 9), 9);
        // Across a 2^32 boundary: the low bits of an id sent before it.
        let last = (1u64 << 32) + 5;
        assert_eq!(widen_seen(0xffff_fff0, last), 0xffff_fff0);
        assert_eq!(widen_seen(3, last), (1 << 32) + 3);
        // An id never sent cannot be named: it falls back below.
        assert_eq!(widen_seen(20, 10), 0);
    }

    #[test]
    fn hello_faults_are_named() {
        let good = hello().encode();
        let cases: &[(usize, &[u8], &str)] = &[
            (0, b"ZMQ!", "not a KIARA peer"),
            (4, &[0, 1], "version mismatch: the peer speaks version 1"),
            (6, &[0, 3], "hello body of 3 bytes"),
            (8, &[1, 0, 0, 0], "QPN"),
            (18, &[7], "MTU code 7"),
            (19, &[2], "hello flags 0x02: unknown bits"),
            (
                36,
                &[0, 0, 0, 1],
                "hello credits 1 out of range: at least 8",
            ),
            (36, &[0, 0, 0x10, 1], "at most 4096"),
            (
                40,
                &[0, 0, 0, 8],
                "hello slot size 8 bytes out of range 104..=",
            ),
            (40, &[0, 0x10, 0, 1], "hello slot size 1048577 bytes"),
            (
                40,
                &[0, 0, 0x10, 0x67],
                "eager threshold 4096 bytes exceeds what",
            ),
            (44, &[0; 8], "hello largest message 0 bytes out of range"),
            (44, &[0, 0, 0, 0, 0x40, 0, 0, 1], "1..=1073741824"),
            (
                44,
                &[0, 0, 0, 0, 0, 0, 0x0f, 0xff],
                "exceeds its largest message",
            ),
        ];
        for (at, patch, expect) in cases {
            let mut b = good;
            b[*at..*at + patch.len()].copy_from_slice(patch);
            let e = Hello::decode_header(b[..8].try_into().unwrap())
                .and_then(|_| Hello::decode_body(&b[8..]))
                .unwrap_err();
            assert!(e.0.contains(expect), "patch at {at}: {e}");
        }
    }

    fn message(kind: Kind, h: Control, meta: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; CONTROL_HEADER_LEN];
        Control {
            meta_len: meta.len() as u8,
            ..h
        }
        .write_header(kind, &mut v);
        v.extend_from_slice(meta);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn control_round_trips() {
        let h = Control {
            credits: 5,
            msg_id: 77,
            len: 3,
            ..Default::default()
        };
        let bytes = message(Kind::Eager, h, b"meta", b"abc");
        let d = Control::decode(&bytes, &LIMITS).unwrap();
        assert_eq!(d.kind, Kind::Eager);
        assert_eq!((d.meta, d.payload), (&b"meta"[..], &b"abc"[..]));
        assert_eq!((d.header.credits, d.header.msg_id), (5, 77));

        let h = Control {
            msg_id: 1,
            len: 1000,
            addr: 0x1000,
            rkey: 0xabcd,
            ..Default::default()
        };
        let bytes = message(Kind::Data, h, b"", b"");
        let d = Control::decode(&bytes, &LIMITS).unwrap();
        assert_eq!(
            (d.header.addr, d.header.len, d.header.rkey),
            (0x1000, 1000, 0xabcd)
        );
        let ack = message(Kind::Ack, Control::default(), b"", b"");
        assert_eq!(Control::decode(&ack, &LIMITS).unwrap().kind, Kind::Ack);
    }

    #[test]
    fn control_faults_are_named_never_panics() {
        let data = |len: u64, addr: u64| {
            message(
                Kind::Data,
                Control {
                    len,
                    addr,
                    ..Default::default()
                },
                b"",
                b"",
            )
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![1; 10], "truncated"),
            (
                {
                    let mut m = data(10, 0);
                    m[0] = 9;
                    m
                },
                "unknown control message type 9",
            ),
            (data(2 << 20, 0), "exceeds the limit"),
            (data(0, 0), "0 bytes"),
            (data(16, u64::MAX - 3), "wraps around"),
            (
                {
                    let mut m = data(10, 0);
                    m.push(1);
                    m
                },
                "stray bytes",
            ),
            (
                {
                    let mut m = data(10, 0);
                    m[1] = 200;
                    m
                },
                "metadata of 200 bytes",
            ),
            (
                {
                    let mut m = data(10, 0);
                    m[1] = 8;
                    m
                },
                "metadata bytes",
            ),
            (
                message(
                    Kind::Eager,
                    Control {
                        len: 100,
                        ..Default::default()
                    },
                    b"",
                    &[0; 100],
                ),
                "eager threshold",
            ),
            (
                message(
                    Kind::Eager,
                    Control {
                        len: 5,
                        ..Default::default()
                    },
                    b"",
                    b"abc",
                ),
                "announces 5 bytes but carries 3",
            ),
            (
                message(Kind::Ack, Control::default(), b"", b"x"),
                "unexpected bytes",
            ),
        ];
        for (bytes, expect) in cases {
            let e = Control::decode(&bytes, &LIMITS).unwrap_err();
            assert!(e.0.contains(expect), "{expect}: {e}");
        }
        // Random garbage of every length decodes to an error or a message, never a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = Control::decode(&bytes, &LIMITS);
        }
    }

    mod props {
        //! Property tests of the decoders: whatever a peer sends, decoding returns a
        //! value or an error that names what is wrong, never a panic; what the encoder
        //! writes decodes to itself.
        use super::super::*;
        use super::message;
        use proptest::prelude::*;

        /// Words every hello rejection contains one of: the field it names.
        const HELLO_REASONS: &[&str] = &[
            "not a KIARA peer",
            "protocol version mismatch",
            "hello body of",
            "hello truncated",
            "hello flags",
            "hello QPN",
            "hello PSN",
            "hello MTU code",
            "hello credits",
            "hello largest message",
            "hello slot size",
            "hello eager threshold",
        ];

        /// Words every control message rejection contains one of.
        const CONTROL_REASONS: &[&str] = &[
            "control message truncated",
            "unknown control message type",
            "metadata of",
            "eager message of",
            "eager message announces",
            "data descriptor of 0 bytes",
            "exceeds the limit",
            "wraps around",
            "stray bytes after a data descriptor",
            "unexpected bytes",
        ];

        fn named(e: &ProtocolError, reasons: &[&str]) -> bool {
            reasons.iter().any(|r| e.0.contains(r))
        }

        /// Decodes a whole hello (header, then body) as `read_hello` does.
        fn decode_hello(bytes: &[u8]) -> Result<Hello, ProtocolError> {
            let Some(header) = bytes.get(..HELLO_HEADER_LEN) else {
                return err(format!("hello truncated: {} header bytes", bytes.len()));
            };
            let len = Hello::decode_header(header.try_into().expect("8 bytes"))?;
            let body = &bytes[HELLO_HEADER_LEN..];
            Hello::decode_body(&body[..len.min(body.len())])
        }

        prop_compose! {
            /// A hello within every bound.
            fn valid_hello()(
                qpn in 0..=0xff_ffffu32,
                psn in 0..=0xff_ffffu32,
                lid in any::<u16>(),
                mtu in 1..=5u8,
                gid in proptest::option::of(any::<[u8; 16]>()),
                credits in MIN_CREDITS..=MAX_CREDITS,
                max_message in 1..=MAX_MESSAGE,
                slot_size in SLOT_OVERHEAD as u32..=MAX_SLOT_SIZE as u32,
                eager_pick in any::<u32>(),
            ) -> Hello {
                let room = u64::from(slot_size) - SLOT_OVERHEAD as u64;
                let eager_max = room.min(max_message);
                let eager_threshold = (u64::from(eager_pick) % (eager_max + 1)) as u32;
                Hello {
                    qpn, psn, lid, mtu, gid, credits, slot_size, max_message,
                    eager_threshold,
                }
            }
        }

        fn limits() -> impl Strategy<Value = Limits> {
            (1..=MAX_MESSAGE, 0..=4096u32).prop_map(|(max_message, eager_threshold)| Limits {
                max_message,
                eager_threshold,
            })
        }

        prop_compose! {
            /// A control message that `limits` accepts, with its parts.
            fn valid_control(limits: Limits)(
                kind in prop_oneof![
                    Just(Kind::Data), Just(Kind::Eager), Just(Kind::Ack),
                    Just(Kind::Credit), Just(Kind::Bye),
                ],
                credits in any::<u32>(),
                msg_id in any::<u64>(),
                pick in any::<u64>(),
                addr_pick in any::<u64>(),
                rkey in any::<u32>(),
                seen in any::<u32>(),
                meta in proptest::collection::vec(any::<u8>(), 0..=MAX_META_LEN),
                payload_seed in any::<u8>(),
            ) -> (Kind, Control, Vec<u8>, Vec<u8>) {
                let mut h = Control { credits, msg_id, rkey, seen, ..Default::default() };
                let mut payload = Vec::new();
                let mut meta = meta;
                match kind {
                    Kind::Data => {
                        h.len = 1 + pick % limits.max_message;
                        h.addr = addr_pick % (u64::MAX - h.len + 1);
                    }
                    Kind::Eager => {
                        h.len = pick % (u64::from(limits.eager_threshold) + 1);
                        payload = (0..h.len).map(|i| payload_seed ^ i as u8).collect();
                    }
                    Kind::Ack | Kind::Credit | Kind::Bye => {
                        h.len = pick;
                        h.addr = addr_pick;
                        meta.clear();
                    }
                }
                h.kind = Some(kind);
                h.meta_len = meta.len() as u8;
                (kind, h, meta, payload)
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn any_bytes_decode_to_a_hello_or_a_named_error(
                bytes in proptest::collection::vec(any::<u8>(), 0..600),
                real_magic in any::<bool>(),
            ) {
                let mut bytes = bytes;
                if real_magic && bytes.len() >= 8 {
                    // Past the magic and version, so the body checks are reached.
                    bytes[..6].copy_from_slice(b"KIAR\x00\x02");
                }
                if let Err(e) = decode_hello(&bytes) {
                    prop_assert!(named(&e, HELLO_REASONS), "unnamed rejection: {e}");
                }
            }

            #[test]
            fn valid_hellos_round_trip_and_every_truncation_is_named(h in valid_hello()) {
                let bytes = h.encode();
                prop_assert_eq!(decode_hello(&bytes)?, h);
                // A longer body from a later version: its tail is ignored.
                let mut longer = bytes.to_vec();
                longer[6..8].copy_from_slice(&(HELLO_BODY_LEN as u16 + 9).to_be_bytes());
                longer.extend_from_slice(&[0xa5; 9]);
                prop_assert_eq!(decode_hello(&longer)?, h);
                for n in 0..bytes.len() {
                    let e = decode_hello(&bytes[..n]).expect_err("a truncated hello");
                    prop_assert!(named(&e, HELLO_REASONS), "cut at {}: {}", n, e);
                }
            }

            #[test]
            fn a_hello_field_out_of_bounds_is_refused_by_name(
                h in valid_hello(),
                field in 0..6usize,
                big in any::<u64>(),
            ) {
                let mut bad = h;
                let expect = match field {
                    0 => { bad.credits = MAX_CREDITS + 1 + (big as u32 % 1000); "hello credits" }
                    1 => { bad.credits = big as u32 % MIN_CREDITS; "hello credits" }
                    2 => {
                        bad.max_message = MAX_MESSAGE + 1 + big % (u64::MAX - MAX_MESSAGE);
                        "hello largest message"
                    }
                    3 => {
                        bad.slot_size = MAX_SLOT_SIZE as u32 + 1 + (big as u32 % 1000);
                        "hello slot size"
                    }
                    4 => { bad.mtu = 6 + (big as u8 % 250); "hello MTU code" }
                    _ => {
                        bad.eager_threshold = bad.slot_size - SLOT_OVERHEAD as u32 + 1;
                        "hello eager threshold"
                    }
                };
                let e = decode_hello(&bad.encode()).expect_err("out of bounds");
                prop_assert!(e.0.contains(expect), "{expect}: {e}");
            }

            #[test]
            fn any_bytes_decode_to_a_control_message_or_a_named_error(
                bytes in proptest::collection::vec(any::<u8>(), 0..300),
                kind in 0..8u8,
                limits in limits(),
            ) {
                let mut bytes = bytes;
                if let Some(b) = bytes.first_mut() {
                    *b = kind;
                }
                if let Err(e) = Control::decode(&bytes, &limits) {
                    prop_assert!(named(&e, CONTROL_REASONS), "unnamed rejection: {e}");
                }
            }

            #[test]
            fn valid_control_messages_round_trip_and_truncations_are_named(
                (limits, (kind, h, meta, payload)) in limits()
                    .prop_flat_map(|l| (Just(l), valid_control(l))),
            ) {
                let bytes = message(kind, h, &meta, &payload);
                let d = Control::decode(&bytes, &limits)?;
                prop_assert_eq!(d.kind, kind);
                prop_assert_eq!(d.header, h);
                prop_assert_eq!(d.meta, &meta[..]);
                prop_assert_eq!(d.payload, &payload[..]);
                for n in 0..bytes.len() {
                    match Control::decode(&bytes[..n], &limits) {
                        Err(e) => prop_assert!(named(&e, CONTROL_REASONS), "cut at {}: {}", n, e),
                        // A cut message is always short of a part it announced.
                        Ok(d) => prop_assert!(false, "cut at {} decoded: {:?}", n, d),
                    }
                }
            }
        }
    }
}
