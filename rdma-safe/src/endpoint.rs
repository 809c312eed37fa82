//! Out-of-band endpoint exchange: what two sides must tell each other before their
//! queue pairs can connect (LID, GID, QPN, PSN, MTU, and a region to access), sent over
//! a TCP connection as `ib_rdma_bw` does, but binary, versioned and length-checked.
//!
//! Wire format, version 1, big-endian, 56 bytes:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `RSEP` |
//! | 4 | 2 | version (1) |
//! | 6 | 2 | body length (48; a longer body from a newer peer is read and its tail ignored) |
//! | 8 | 2 | LID |
//! | 10 | 1 | MTU (`ibv_mtu`: 1 = 256 ... 5 = 4096) |
//! | 11 | 1 | flags: bit 0 GID present, bit 1 region present |
//! | 12 | 4 | QPN (24 bits) |
//! | 16 | 4 | PSN (24 bits) |
//! | 20 | 16 | GID (raw) |
//! | 36 | 8 | region address |
//! | 44 | 8 | region length |
//! | 52 | 4 | region rkey |
//!
//! Decoding is [`Endpoint::decode`] (pure, no I/O); [`exchange`] does the I/O.

use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::mr::RemoteSlice;
use crate::qp::RemoteEndpoint;
use rdma_sys as sys;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The first bytes of every endpoint message.
pub const MAGIC: [u8; 4] = *b"RSEP";
/// The version this crate writes.
pub const VERSION: u16 = 1;
/// Length of the header (magic, version, body length).
pub const HEADER_LEN: usize = 8;
/// Length of a version 1 body.
pub const BODY_LEN: usize = 48;
/// The longest body accepted (room for later versions, bounded against hostile peers).
pub const MAX_BODY_LEN: usize = 1024;

/// What one side tells the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First PSN this side sends (24 bits).
    pub psn: u32,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// GID, required on RoCE.
    pub gid: Option<Gid>,
    /// The largest MTU this side can use; both use the smaller.
    pub mtu: sys::ibv_mtu,
    /// A region the peer may access, if any.
    pub region: Option<RemoteSlice>,
}

impl Endpoint {
    /// How the peer's queue pair is reached, for [`crate::RtrAttr`].
    pub fn remote(&self) -> RemoteEndpoint {
        RemoteEndpoint {
            qpn: self.qpn,
            psn: self.psn,
            lid: self.lid,
            gid: self.gid,
        }
    }

    /// The message bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN + BODY_LEN] {
        let mut b = [0u8; HEADER_LEN + BODY_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[6..8].copy_from_slice(&(BODY_LEN as u16).to_be_bytes());
        b[8..10].copy_from_slice(&self.lid.to_be_bytes());
        // A code beyond a byte (no ibv_mtu has one) goes as 0, which the peer refuses.
        b[10] = u8::try_from(self.mtu.0).unwrap_or(0);
        b[11] = u8::from(self.gid.is_some()) | (u8::from(self.region.is_some()) << 1);
        b[12..16].copy_from_slice(&self.qpn.to_be_bytes());
        b[16..20].copy_from_slice(&self.psn.to_be_bytes());
        b[20..36].copy_from_slice(&self.gid.unwrap_or_default().0);
        let region = self.region.unwrap_or_default();
        b[36..44].copy_from_slice(&region.addr.to_be_bytes());
        b[44..52].copy_from_slice(&region.len.to_be_bytes());
        b[52..56].copy_from_slice(&region.rkey.to_be_bytes());
        b
    }

    /// Checks a header and returns the body length that follows.
    pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<usize> {
        if h[0..4] != MAGIC {
            return Err(protocol(format!(
                "not an endpoint message (first bytes {:02x?}, expected \"RSEP\"): is the peer \
                 running the same program?",
                &h[0..4]
            )));
        }
        let version = u16::from_be_bytes([h[4], h[5]]);
        if version != VERSION {
            return Err(protocol(format!(
                "the peer speaks endpoint version {version}, this side version {VERSION}"
            )));
        }
        let len = u16::from_be_bytes([h[6], h[7]]) as usize;
        if len < BODY_LEN {
            return Err(protocol(format!(
                "endpoint body of {len} bytes is shorter than the {BODY_LEN} of version 1"
            )));
        }
        if len > MAX_BODY_LEN {
            return Err(protocol(format!(
                "endpoint body of {len} bytes exceeds the limit of {MAX_BODY_LEN}"
            )));
        }
        Ok(len)
    }

    /// Decodes a body (after [`Endpoint::decode_header`]); bytes past the version 1
    /// fields are ignored.
    pub fn decode_body(b: &[u8]) -> Result<Endpoint> {
        if b.len() < BODY_LEN {
            return Err(protocol(format!(
                "endpoint body truncated: {} of {BODY_LEN} bytes",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(x)
        };
        let mtu = mtu_from(b[2])?;
        let flags = b[3];
        if flags & !0b11 != 0 {
            return Err(protocol(format!("unknown endpoint flags {flags:#04x}")));
        }
        let qpn = u32_at(4);
        let psn = u32_at(8);
        for (name, value) in [("QPN", qpn), ("PSN", psn)] {
            if value > 0xff_ffff {
                return Err(protocol(format!(
                    "{name} {value:#x} does not fit in 24 bits"
                )));
            }
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[12..28]);
        let region = RemoteSlice {
            addr: u64_at(28),
            len: u64_at(36),
            rkey: u32_at(44),
        };
        if region.addr.checked_add(region.len).is_none() {
            return Err(protocol(format!(
                "region {:#x} + {} bytes wraps around the address space",
                region.addr, region.len
            )));
        }
        Ok(Endpoint {
            qpn,
            psn,
            lid: u16::from_be_bytes([b[0], b[1]]),
            gid: (flags & 1 != 0).then_some(Gid(gid)),
            mtu,
            region: (flags & 2 != 0).then_some(region),
        })
    }

    /// Decodes a whole message (header and body).
    pub fn decode(bytes: &[u8]) -> Result<Endpoint> {
        let header: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| {
                protocol(format!(
                    "endpoint message truncated: {} of {HEADER_LEN} header bytes",
                    bytes.len()
                ))
            })?;
        let len = Self::decode_header(header)?;
        let body = &bytes[HEADER_LEN..];
        if body.len() < len {
            return Err(protocol(format!(
                "endpoint message truncated: {} of {len} body bytes",
                body.len()
            )));
        }
        Self::decode_body(&body[..len])
    }
}

fn mtu_from(v: u8) -> Result<sys::ibv_mtu> {
    crate::Mtu::from_code(u32::from(v))
        .map(Into::into)
        .ok_or_else(|| protocol(format!("MTU code {v} is not 1 (256) .. 5 (4096)")))
}

fn protocol(text: String) -> Error {
    Error::Protocol(text.into())
}

/// Sends `local` and reads the peer's endpoint over `stream` (a blocking socket), all
/// of it within `timeout`: one [`Deadline`] for the whole exchange, so that a peer
/// dripping a byte at a time cannot hold the connection past it. Both sides may call
/// it at once (each writes first; 56 bytes always fit in the socket buffer).
/// Malformed, truncated or late input is an error.
pub fn exchange(stream: &mut TcpStream, local: &Endpoint, timeout: Duration) -> Result<Endpoint> {
    let deadline = Deadline::after(timeout, "endpoint exchange");
    deadline.write_all(stream, &local.encode(), "endpoint")?;
    read_endpoint_with(|buf, part| deadline.read_exact(stream, buf, part))
}

/// Reads one endpoint message from `r` (no time limit of its own: over a socket, use
/// [`exchange`], which bounds the whole exchange).
pub fn read_endpoint(r: &mut impl Read) -> Result<Endpoint> {
    read_endpoint_with(|buf, part| read_exact(r, buf, part))
}

/// Reads one endpoint message with `read`, which fills a buffer whose bytes it names
/// by `part` in errors.
fn read_endpoint_with(mut read: impl FnMut(&mut [u8], &str) -> Result<()>) -> Result<Endpoint> {
    let mut header = [0u8; HEADER_LEN];
    read(&mut header, "header")?;
    let len = Endpoint::decode_header(&header)?;
    let mut body = [0u8; MAX_BODY_LEN];
    read(&mut body[..len], "body")?;
    Endpoint::decode_body(&body[..len])
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], part: &str) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Err(closed_after(got, buf.len(), part)),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::io(
                    "endpoint exchange: reading the peer's endpoint",
                    e,
                ))
            }
        }
    }
    Ok(())
}

/// The error for a peer that closed the connection in the middle of a message.
fn closed_after(got: usize, len: usize, part: &str) -> Error {
    protocol(format!(
        "the peer closed the connection after {got} of {len} {part} bytes"
    ))
}

/// One absolute deadline for a whole exchange over a TCP connection (the endpoint
/// exchange, or another bootstrap handshake such as kiara-ib's hello).
///
/// It is computed once; every read and write gets only the time left, and once it
/// is gone the exchange fails with an error that says the peer was too slow and how
/// long was allowed. A timeout per read would let a peer that sends one byte per
/// timeout hold the connection (and whatever waits on it) for hours.
///
/// The stream must be in blocking mode; its read and write timeouts are changed.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    end: Instant,
    allowed: Duration,
    what: &'static str,
}

impl Deadline {
    /// A deadline `allowed` from now for the exchange that `what` names in errors
    /// (e.g. `"endpoint exchange"`).
    pub fn after(allowed: Duration, what: &'static str) -> Deadline {
        Deadline {
            end: Instant::now() + allowed,
            allowed,
            what,
        }
    }

    /// The time left, or `None` once the deadline has passed.
    pub fn remaining(&self) -> Option<Duration> {
        self.end
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }

    /// The time allowed for the whole exchange.
    pub fn allowed(&self) -> Duration {
        self.allowed
    }

    /// Reads exactly `buf.len()` bytes from `stream` before the deadline; `part`
    /// names them in errors (e.g. `"header"`). A peer that closes the connection
    /// first is a protocol error; one that is too slow, a timed-out I/O error.
    pub fn read_exact(&self, stream: &mut TcpStream, buf: &mut [u8], part: &str) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let left = self.time_for(got, buf.len(), part)?;
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.socket_error("setting the read timeout", e))?;
            match stream.read(&mut buf[got..]) {
                Ok(0) => return Err(closed_after(got, buf.len(), part)),
                Ok(n) => got += n,
                // Timed out: the next round finds the deadline gone (or a moment left,
                // if the socket timed out early) and says so.
                Err(e) if is_retry(&e) => {}
                Err(e) => return Err(self.socket_error(&format!("reading the peer's {part}"), e)),
            }
        }
        Ok(())
    }

    /// Writes all of `data` to `stream` before the deadline; `part` names it in errors.
    pub fn write_all(&self, stream: &mut TcpStream, data: &[u8], part: &str) -> Result<()> {
        let mut sent = 0;
        while sent < data.len() {
            let left = self.time_for(sent, data.len(), part)?;
            stream
                .set_write_timeout(Some(left))
                .map_err(|e| self.socket_error("setting the write timeout", e))?;
            match stream.write(&data[sent..]) {
                Ok(0) => {
                    let e = std::io::Error::from(ErrorKind::WriteZero);
                    return Err(self.socket_error(&format!("sending our {part}"), e));
                }
                Ok(n) => sent += n,
                Err(e) if is_retry(&e) => {}
                Err(e) => return Err(self.socket_error(&format!("sending our {part}"), e)),
            }
        }
        Ok(())
    }

    /// The time left for the next step of moving `len` bytes of `part`, `done` of
    /// which have moved; the "too slow" error once there is none.
    fn time_for(&self, done: usize, len: usize, part: &str) -> Result<Duration> {
        self.remaining().ok_or_else(|| {
            Error::io(
                format!(
                    "{}: the peer was too slow: {done} of {len} {part} bytes had moved when                      the {:?} allowed for the whole exchange ran out (is the peer stalled,                      or not the same program? a peer on a slow link may need a longer                      timeout)",
                    self.what, self.allowed
                ),
                std::io::Error::from(ErrorKind::TimedOut),
            )
        })
    }

    fn socket_error(&self, doing: &str, e: std::io::Error) -> Error {
        Error::io(format!("{}: {doing}", self.what), e)
    }
}

/// True for a socket error after which the exchange goes on (until the deadline).
fn is_retry(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn sample() -> Endpoint {
        Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            gid: Some(Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])),
            mtu: sys::ibv_mtu::IBV_MTU_1024,
            region: Some(RemoteSlice {
                addr: 0x7f00_0000_1000,
                len: 1 << 33,
                rkey: 0xdead_beef,
            }),
        }
    }

    #[test]
    fn round_trip() {
        let e = sample();
        assert_eq!(Endpoint::decode(&e.encode()).unwrap(), e);
        let bare = Endpoint {
            gid: None,
            region: None,
            ..e
        };
        assert_eq!(Endpoint::decode(&bare.encode()).unwrap(), bare);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            let err = Endpoint::decode(&bytes[..n]).unwrap_err();
            assert!(err.to_string().contains("truncated"), "{n}: {err}");
        }
    }

    #[test]
    fn malformed_fields_are_named() {
        let good = sample().encode();
        let cases: &[(usize, &[u8], &str)] = &[
            (0, b"XXXX", "not an endpoint message"),
            (4, &[0, 9], "version 9"),
            (6, &[0, 10], "shorter than"),
            (6, &[0xff, 0xff], "exceeds the limit"),
            (10, &[9], "MTU code 9"),
            (11, &[0x80], "unknown endpoint flags"),
            (12, &[0x01, 0, 0, 0], "QPN"),
            (16, &[0xff, 0, 0, 0], "PSN"),
            (36, &[0xff; 8], "wraps around"),
        ];
        for (at, patch, expect) in cases {
            let mut bytes = good;
            bytes[*at..*at + patch.len()].copy_from_slice(patch);
            let err = Endpoint::decode(&bytes).unwrap_err().to_string();
            assert!(err.contains(expect), "patch at {at}: {err}");
        }
    }

    #[test]
    fn an_unlisted_mtu_goes_as_a_code_the_peer_refuses() {
        // A port may report an MTU code these headers do not list; never a wrong one.
        let e = Endpoint {
            mtu: sys::ibv_mtu(0x7777),
            ..sample()
        };
        let bytes = e.encode();
        assert_eq!(bytes[10], 0);
        let err = Endpoint::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("MTU code 0"), "{err}");
    }

    #[test]
    fn a_longer_body_from_a_newer_peer_is_accepted() {
        let mut bytes = sample().encode().to_vec();
        bytes[6..8].copy_from_slice(&((BODY_LEN + 8) as u16).to_be_bytes());
        bytes.extend_from_slice(&[0xaa; 8]);
        assert_eq!(Endpoint::decode(&bytes).unwrap(), sample());
        assert_eq!(read_endpoint(&mut &bytes[..]).unwrap(), sample());
    }

    #[test]
    fn exchange_over_tcp_both_ways() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mine = Endpoint { qpn: 1, ..sample() };
            exchange(&mut s, &mine, Duration::from_secs(5)).unwrap()
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let theirs = exchange(&mut c, &sample(), Duration::from_secs(5)).unwrap();
        assert_eq!(theirs.qpn, 1);
        assert_eq!(server.join().unwrap(), sample());
    }

    #[test]
    fn a_silent_or_dying_peer_is_an_error_not_a_hang() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // A peer that accepts, sends half a message and closes.
        let half = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut theirs = [0u8; HEADER_LEN + BODY_LEN];
            s.read_exact(&mut theirs).unwrap();
            s.write_all(&sample().encode()[..20]).unwrap();
            drop(s);
            // A peer that accepts and says nothing.
            let (s2, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(800));
            drop(s2);
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let err = exchange(&mut c, &sample(), Duration::from_secs(5)).unwrap_err();
        assert!(
            err.to_string()
                .contains("closed the connection after 12 of 48 body bytes"),
            "{err}"
        );
        let mut c2 = TcpStream::connect(addr).unwrap();
        let err = exchange(&mut c2, &sample(), Duration::from_millis(200)).unwrap_err();
        assert!(err.to_string().contains("the peer was too slow"), "{err}");
        half.join().unwrap();
    }
}
