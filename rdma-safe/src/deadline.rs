//! One deadline for a whole exchange over TCP: what two sides tell each other before
//! their queue pairs connect (each program in its own format, or its C original's)
//! must not let a slow or hostile peer hold the connection past it.

use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One absolute deadline for a whole exchange over a TCP connection (a bootstrap
/// handshake such as kiara-ib's hello, or a port's key exchange).
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

/// The instant `d` from now, or a century from now when `d` is longer than the
/// clock can count (`Duration::MAX`, for "no limit").
pub(crate) fn instant_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 60 * 60))
}

impl Deadline {
    /// A deadline `allowed` from now for the exchange that `what` names in errors
    /// (e.g. `"KIARA handshake"`). An `allowed` too long for the clock (such as
    /// `Duration::MAX`, for "no deadline") ends a century from now.
    pub fn after(allowed: Duration, what: &'static str) -> Deadline {
        Deadline {
            end: instant_after(allowed),
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
                    "{}: the peer was too slow: {done} of {len} {part} bytes had moved when \
                     the {:?} allowed for the whole exchange ran out (is the peer stalled, \
                     or not the same program? a peer on a slow link may need a longer \
                     timeout)",
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

/// The error for a peer that closed the connection in the middle of a message.
fn closed_after(got: usize, len: usize, part: &str) -> Error {
    Error::Protocol(
        format!("the peer closed the connection after {got} of {len} {part} bytes").into(),
    )
}
