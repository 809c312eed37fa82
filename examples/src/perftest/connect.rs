//! The out-of-band side of perftest: connection, the ordered exchanges and
//! handshakes, over a TCP socket (the default) or, with `-R`, over a queue pair the
//! RDMA CM connected ([`super::rdma_cm::CmLink`]).

use super::protocol::{self, BwReport, KeyData, ProtocolError};
use super::rdma_cm::CmLink;
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
    /// An RDMA CM or verbs call of the `-R` link failed.
    Cm(String, rdma_safe::Error),
}

impl std::fmt::Display for CommError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommError::Io(what, e) => write!(f, "{what}: {e}"),
            CommError::Protocol(e) => e.fmt(f),
            CommError::Cm(what, e) => write!(f, "{what}: {e}"),
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

/// The channel under the exchanges.
enum Link {
    /// perftest's default: a TCP socket ("Data ex. method : Ethernet").
    Tcp(TcpStream),
    /// `-R`: SEND/RECV on a CM-connected queue pair ("Data ex. method : rdma_cm").
    Cm(Box<CmLink>),
}

/// The connected channel and our role. In every exchange the client writes first.
pub struct Comm {
    link: Link,
    client: bool,
    /// Read timeout of the CM link (the socket keeps its own).
    timeout: Option<Duration>,
    /// The GID index written into binary handshakes (perftest's `gid_index`).
    gid_index: i32,
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

    /// Server with `-R`: accepts one client's RDMA CM connection on `port`.
    pub fn accept_cm(port: u16) -> Result<Comm, CommError> {
        Ok(Comm::with_link(
            Link::Cm(Box::new(CmLink::accept(port)?)),
            false,
        ))
    }

    /// Client with `-R`: connects to `host:port` with the RDMA CM, retrying for
    /// `retry` while nobody listens.
    pub fn connect_cm(host: &str, port: u16, retry: Duration) -> Result<Comm, CommError> {
        let link = CmLink::connect(host, port, retry)?;
        Ok(Comm::with_link(Link::Cm(Box::new(link)), true))
    }

    fn new(sock: TcpStream, client: bool) -> Comm {
        let _ = sock.set_nodelay(true);
        let _ = sock.set_read_timeout(Some(SETUP_TIMEOUT));
        Comm::with_link(Link::Tcp(sock), client)
    }

    fn with_link(link: Link, client: bool) -> Comm {
        Comm {
            link,
            client,
            timeout: Some(SETUP_TIMEOUT),
            gid_index: -1,
        }
    }

    /// True when the exchanges ride on the RDMA CM (`-R`).
    pub fn is_cm(&self) -> bool {
        matches!(self.link, Link::Cm(_))
    }

    /// Sets the GID index that binary (rdma_cm) handshakes carry; -1 for none.
    pub fn set_gid_index(&mut self, gid_index: i32) {
        self.gid_index = gid_index;
    }

    /// Limits (or with `None` lifts) how long a read may wait.
    pub fn set_timeout(&mut self, t: Option<Duration>) {
        self.timeout = t;
        if let Link::Tcp(sock) = &self.link {
            let _ = sock.set_read_timeout(t);
        }
    }

    /// One exchange: the client writes `mine` then reads, the server reads then writes.
    pub fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), CommError> {
        self.xchg_checked(mine, theirs, 0, &|_| Ok(()))
    }

    /// [`Comm::xchg`], reading the peer's first `split` bytes apart and handing
    /// them to `check` before waiting for the rest (over TCP): a peer whose message
    /// is of another length than ours is told apart from a slow one at once.
    fn xchg_checked(
        &mut self,
        mine: &[u8],
        theirs: &mut [u8],
        split: usize,
        check: &dyn Fn(&[u8]) -> Result<(), protocol::ProtocolError>,
    ) -> Result<(), CommError> {
        let sock = match &mut self.link {
            Link::Tcp(sock) => sock,
            Link::Cm(link) => return link.xchg(self.client, mine, theirs, self.timeout),
        };
        // One deadline for the whole exchange (a peer that drips its bytes cannot hold
        // the connection longer); none while a run waits for its peer to finish.
        let deadline = self
            .timeout
            .map(|t| rdma_safe::Deadline::after(t, "the perftest exchange"));
        let read = |s: &mut TcpStream, buf: &mut [u8]| match &deadline {
            Some(d) => d
                .read_exact(s, buf, "message")
                .map_err(|e| CommError::Cm("Couldn't read from the peer".into(), e)),
            // A deadline of an earlier exchange left its timeout on the socket.
            None => s
                .set_read_timeout(None)
                .and_then(|()| s.read_exact(buf))
                .map_err(|e| {
                    let what = if e.kind() == io::ErrorKind::UnexpectedEof {
                        format!(
                            "the peer closed the connection before sending {} bytes",
                            buf.len()
                        )
                    } else {
                        format!("Couldn't read {} bytes from the peer", buf.len())
                    };
                    CommError::Io(what, e)
                }),
        };
        let write = |s: &mut TcpStream, buf: &[u8]| match &deadline {
            Some(d) => d
                .write_all(s, buf, "message")
                .map_err(|e| CommError::Cm("Couldn't write to the peer".into(), e)),
            None => s
                .set_write_timeout(None)
                .and_then(|()| s.write_all(buf))
                .map_err(|e| CommError::Io("Couldn't write to the peer".into(), e)),
        };
        let read_checked = |s: &mut TcpStream, buf: &mut [u8]| {
            if split == 0 {
                return read(s, buf);
            }
            let (head, tail) = buf.split_at_mut(split.min(buf.len()));
            read(s, head)?;
            check(head)?;
            read(s, tail)
        };
        if self.client {
            write(sock, mine)?;
            read_checked(sock, theirs)
        } else {
            read_checked(sock, theirs)?;
            write(sock, mine)
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

    /// One handshake: our key string for the peer's (both of the same form); on the
    /// rdma_cm link, perftest's binary `struct pingpong_dest` instead.
    pub fn handshake(&mut self, mine: &KeyData) -> Result<KeyData, CommError> {
        if self.is_cm() {
            let raw = mine.encode_binary(self.gid_index);
            let mut rem = [0u8; protocol::KEY_SIZE_BINARY];
            self.xchg(&raw, &mut rem)?;
            return Ok(KeyData::decode_binary(&rem, mine.gid.is_some())?);
        }
        let raw = mine.encode();
        let mut rem = vec![0u8; raw.len()];
        let with_gid = mine.gid.is_some();
        let check = |head: &[u8]| protocol::check_key_form(head, with_gid);
        self.xchg_checked(&raw, &mut rem, protocol::KEY_SIZE, &check)?;
        Ok(KeyData::decode(&rem, with_gid)?)
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

    /// `ctx_close_connection`: a last handshake, then `done` and close (on the
    /// rdma_cm link only the handshake).
    pub fn close(mut self, mine: &KeyData) -> Result<(), CommError> {
        self.handshake(mine)?;
        if let Link::Tcp(sock) = &mut self.link {
            sock.write_all(b"done\0")
                .map_err(|e| CommError::Io("Couldn't write to socket".into(), e))?;
        }
        Ok(())
    }
}
