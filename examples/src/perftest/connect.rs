//! The TCP side of perftest: connection, the ordered exchanges and handshakes.

use super::protocol::{self, BwReport, KeyData, ProtocolError};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Errors of the out-of-band channel.
#[derive(Debug)]
pub enum CommError {
    /// The socket failed or the peer closed it.
    Io(String, io::Error),
    /// The peer sent something malformed or incompatible.
    Protocol(ProtocolError),
}

impl std::fmt::Display for CommError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommError::Io(what, e) => write!(f, "{what}: {e}"),
            CommError::Protocol(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CommError {}

impl From<ProtocolError> for CommError {
    fn from(e: ProtocolError) -> Self {
        CommError::Protocol(e)
    }
}

/// How long a setup exchange may wait for the peer.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The connected socket and our role. In every exchange the client writes first.
pub struct Comm {
    sock: TcpStream,
    client: bool,
}

impl Comm {
    /// Server: listens on `port` (all addresses) and accepts one client.
    pub fn accept(port: u16) -> Result<Comm, CommError> {
        let listener = TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| CommError::Io(format!("Couldn't listen to port {port}"), e))?;
        let (sock, _) = listener
            .accept()
            .map_err(|e| CommError::Io("accept() failed".into(), e))?;
        Ok(Comm::new(sock, false))
    }

    /// Client: connects to `host:port`, retrying for `retry` while the server starts.
    pub fn connect(host: &str, port: u16, retry: Duration) -> Result<Comm, CommError> {
        let deadline = Instant::now() + retry;
        loop {
            match TcpStream::connect((host, port)) {
                Ok(s) => return Ok(Comm::new(s, true)),
                Err(e) if Instant::now() >= deadline => {
                    return Err(CommError::Io(
                        format!("Couldn't connect to {host}:{port}"),
                        e,
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn new(sock: TcpStream, client: bool) -> Comm {
        let _ = sock.set_nodelay(true);
        let _ = sock.set_read_timeout(Some(SETUP_TIMEOUT));
        Comm { sock, client }
    }

    /// Limits (or with `None` lifts) how long a read may wait.
    pub fn set_timeout(&self, t: Option<Duration>) {
        let _ = self.sock.set_read_timeout(t);
    }

    /// One exchange: the client writes `mine` then reads, the server reads then writes.
    pub fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), CommError> {
        let read = |s: &mut TcpStream, buf: &mut [u8]| {
            s.read_exact(buf).map_err(|e| {
                let what = if e.kind() == io::ErrorKind::UnexpectedEof {
                    format!(
                        "the peer closed the connection before sending {} bytes",
                        buf.len()
                    )
                } else {
                    format!("Couldn't read {} bytes from the peer", buf.len())
                };
                CommError::Io(what, e)
            })
        };
        let write = |s: &mut TcpStream, buf: &[u8]| {
            s.write_all(buf)
                .map_err(|e| CommError::Io("Couldn't write to the peer".into(), e))
        };
        if self.client {
            write(&mut self.sock, mine)?;
            read(&mut self.sock, theirs)
        } else {
            read(&mut self.sock, theirs)?;
            write(&mut self.sock, mine)
        }
    }

    /// Version exchange; returns the peer's version (at least 5.70).
    pub fn versions(&mut self) -> Result<f64, CommError> {
        let mut rem = [0u8; protocol::VERSION_SIZE];
        self.xchg(&protocol::encode_version(), &mut rem)?;
        Ok(protocol::decode_version(&rem)?)
    }

    /// Exchanges a 32-bit number (system data).
    pub fn xchg_u32(&mut self, v: u32) -> Result<u32, CommError> {
        let mut rem = [0u8; 4];
        self.xchg(&protocol::encode_u32(v), &mut rem)?;
        Ok(protocol::decode_u32(&rem))
    }

    /// MTU exchange; returns the one to use (the smaller valid one).
    pub fn mtu(&mut self, mine: u32) -> Result<u32, CommError> {
        let mut rem = [0u8; 2];
        self.xchg(&protocol::encode_mtu(mine), &mut rem)?;
        Ok(match protocol::decode_mtu(&rem) {
            Some(r) if r < mine => r,
            _ => mine,
        })
    }

    /// One handshake: our key string for the peer's (both of the same form).
    pub fn handshake(&mut self, mine: &KeyData) -> Result<KeyData, CommError> {
        let raw = mine.encode();
        let mut rem = vec![0u8; raw.len()];
        self.xchg(&raw, &mut rem)?;
        Ok(KeyData::decode(&rem, mine.gid.is_some())?)
    }

    /// The results exchange (`xchg_bw_reports`); returns the peer's.
    pub fn reports(&mut self, mine: &BwReport) -> Result<BwReport, CommError> {
        let fields = mine.encode();
        let mut rem = [[0u8; 8]; 5];
        for (m, r) in fields.iter().zip(rem.iter_mut()) {
            self.xchg(m, r)?;
        }
        Ok(BwReport::decode(&rem)?)
    }

    /// `ctx_close_connection`: a last handshake, then `done` and close.
    pub fn close(mut self, mine: &KeyData) -> Result<(), CommError> {
        self.handshake(mine)?;
        self.sock
            .write_all(b"done\0")
            .map_err(|e| CommError::Io("Couldn't write to socket".into(), e))?;
        Ok(())
    }
}
