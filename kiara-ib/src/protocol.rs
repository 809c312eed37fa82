//! The KIARA InfiniBand wire protocol, version 6: pure encoding and decoding, no I/O.
//! `docs/kiara-protocol.md` is the prose version of this file.
//!
//! Two messages exist:
//! - [`Hello`]: sent once each way over the bootstrap TCP connection (the client
//!   writes first; the server reads and checks it before it creates anything, then
//!   answers), carrying what connects the RC queue pairs and the limits.
//! - [`Control`]: the payload of every RDMA SEND: a data descriptor (the receiver then
//!   RDMA-READs the bytes), an eager message (bytes inline), an acknowledgement (the
//!   sender may reuse its buffer), a credit return (which may withdraw a message),
//!   or a goodbye.
//!
//! Every integer is big-endian. Decoding checks every length and range and returns a
//! [`ProtocolError`] that names what is wrong; it never panics.

use std::fmt;

/// First bytes of a hello.
pub const HELLO_MAGIC: [u8; 4] = *b"KIAR";
/// Protocol version written by this crate.
pub const VERSION: u16 = 6;
/// Header of a hello: magic, version, body length.
pub const HELLO_HEADER_LEN: usize = 8;
/// Body of a version 6 hello (the same fields as versions 1 to 5).
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
    /// Returns credits; a `msg_id` other than 0 withdraws that message, whose
    /// window its sender could not bind (version 6).
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
mod tests;
