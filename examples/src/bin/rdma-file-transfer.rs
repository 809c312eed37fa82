//! `rdma-file-transfer`: a file of any size through one registered 10 MiB buffer
//! (The Geek in the Corner, 03), with one credit of flow control.
//!
//! ```text
//! rdma-file-transfer server [-p port] [-o dir | --discard]
//! rdma-file-transfer client <server> <file> [-p port]
//! rdma-file-transfer client <server> --generate <bytes> [--name n] [-p port]
//! ```
//!
//! The server registers the buffer and SENDs `MSG_MR` (24 bytes: `i32 id` = 1,
//! `u64 addr` at 8, `u32 rkey` at 16, host order). The client RDMA-WRITEs the file
//! name WITH IMMEDIATE (imm = its length); every chunk of up to 10 MiB is one RDMA
//! WRITE WITH IMMEDIATE (imm = its length) answered by `MSG_READY` (id 2): the one
//! credit the client needs for the next chunk. A zero-length write with imm 0 ends
//! the file; the server answers `MSG_DONE` (id 3). Both sides print the byte count and
//! a 64-bit checksum of the stream: `sent <name>: <n> bytes, checksum <x>` and
//! `received <name>: <n> bytes, checksum <x>`.
//!
//! `--generate` sends deterministic pseudo-random content instead of a file, and
//! `--discard` keeps only the checksum, so that transfers larger than the disk or
//! the memory need neither.

use clap::{Parser, Subcommand};
use examples::cm::{exit_with, socket_addr, Conn};
use rdma_safe::cm::{self, CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::qp::Rts;
use rdma_safe::sys::ibv_wc_opcode as Op;
use rdma_safe::{Access, Error, MemoryRegion, QueuePair, RecvWr, RemoteSlice, Result, SendWr};
use std::fs::File;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BUFFER_SIZE: usize = 10 * 1024 * 1024;
const MSG_LEN: usize = 24;
const MSG_MR: i32 = 1;
const MSG_READY: i32 = 2;
const MSG_DONE: i32 = 3;
const MAX_NAME: usize = 4096;

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "rdma-file-transfer",
    about = "file transfer over RDMA WRITE WITH IMMEDIATE"
)]
struct Args {
    #[command(subcommand)]
    role: Role,
    /// seconds any single wait may take
    #[arg(long = "timeout", global = true, default_value_t = 60)]
    timeout: u64,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Receive one file, then exit.
    Server {
        /// port
        #[arg(short = 'p', default_value_t = 12345)]
        port: u16,
        /// directory to store the file in (under its base name)
        #[arg(short = 'o', default_value = ".")]
        dir: PathBuf,
        /// only checksum the stream, store nothing
        #[arg(long = "discard")]
        discard: bool,
    },
    /// Send a file (or generated content).
    Client {
        /// server address
        server: String,
        /// file to send
        file: Option<PathBuf>,
        /// port
        #[arg(short = 'p', default_value_t = 12345)]
        port: u16,
        /// send this many bytes of deterministic pseudo-random content instead
        #[arg(long = "generate")]
        generate: Option<u64>,
        /// the name to send with --generate
        #[arg(long = "name", default_value = "generated.bin")]
        name: String,
    },
}

fn main() {
    let args = Args::parse();
    let t = Duration::from_secs(args.timeout.max(1));
    let result = match &args.role {
        Role::Server { port, dir, discard } => server(*port, dir, *discard, t),
        Role::Client {
            server,
            file,
            port,
            generate,
            name,
        } => client(server, *port, file.as_deref(), *generate, name, t),
    };
    if let Err(e) = result {
        exit_with("rdma-file-transfer", &e);
    }
}

/// The checksum both sides print: `kiara_ib::message::checksum` of every chunk (which
/// the workspace builds optimised even in test builds: the guest is emulated),
/// folded with the chunk's length. Both sides see the very same chunks (the protocol
/// sends one chunk per credit), so equal checksums mean equal streams.
#[derive(Default)]
struct Checksum {
    hash: u64,
    len: u64,
}

impl Checksum {
    fn new() -> Self {
        Checksum {
            hash: 0xcbf2_9ce4_8422_2325,
            len: 0,
        }
    }

    fn update(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        let h = kiara_ib::message::checksum(chunk);
        self.hash = (self.hash ^ h).wrapping_mul(0x0000_0100_0000_01b3) ^ chunk.len() as u64;
        self.len += chunk.len() as u64;
    }

    fn finish(self) -> u64 {
        self.hash
    }
}

/// Deterministic pseudo-random content: a 1 MiB xorshift block, copied into each
/// chunk rotated by a different amount (copies are fast even unoptimised).
struct Generator {
    block: Vec<u8>,
    offset: usize,
    turns: usize,
    left: u64,
}

impl Generator {
    fn new(bytes: u64) -> Self {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut block = vec![0u8; 1 << 20];
        for chunk in block.chunks_mut(8) {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let w = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
        Generator {
            block,
            offset: 0,
            turns: 0,
            left: bytes,
        }
    }

    fn fill(&mut self, buf: &mut [u8]) -> usize {
        let n = (buf.len() as u64).min(self.left) as usize;
        let mut done = 0;
        while done < n {
            let from = &self.block[self.offset..];
            let k = from.len().min(n - done);
            buf[done..done + k].copy_from_slice(&from[..k]);
            done += k;
            self.offset += k;
            if self.offset == self.block.len() {
                // Every pass over the block starts at a different place.
                self.turns += 1;
                self.offset = (self.turns * 7919) % self.block.len();
            }
        }
        self.left -= n as u64;
        n
    }
}

fn encode(mr: &mut MemoryRegion, id: i32, addr: u64, rkey: u32) -> Result<()> {
    let b = mr.as_mut_slice()?;
    b[..MSG_LEN].fill(0);
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    b[8..16].copy_from_slice(&addr.to_ne_bytes());
    b[16..20].copy_from_slice(&rkey.to_ne_bytes());
    Ok(())
}

fn decode(b: &[u8], byte_len: u32) -> Result<(i32, u64, u32)> {
    if byte_len as usize != MSG_LEN {
        return Err(Error::Protocol(
            format!("received a message of {byte_len} bytes, expected {MSG_LEN}").into(),
        ));
    }
    let id = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    let addr = u64::from_ne_bytes(b[8..16].try_into().unwrap_or_default());
    let rkey = u32::from_ne_bytes(b[16..20].try_into().unwrap_or_default());
    Ok((id, addr, rkey))
}

fn post_recv<S: rdma_safe::qp::CanRecv>(qp: &QueuePair<S>, mr: &MemoryRegion) -> Result<()> {
    let mut sge = [mr.local(0..MSG_LEN)?];
    let mut wr = RecvWr::new(1, &mut sge);
    // SAFETY: the message region lives as long as the connection and is read only
    // after the receive's completion.
    unsafe { qp.post_recv(&mut wr) }
}

/// Posts a message (signaled; its completion is checked when it is skipped by a later
/// wait). The buffer is rewritten only after the peer answered it, so after the SEND
/// reached the peer.
fn post_msg(
    qp: &QueuePair<Rts>,
    mr: &mut MemoryRegion,
    id: i32,
    addr: u64,
    rkey: u32,
) -> Result<()> {
    encode(mr, id, addr, rkey)?;
    let mut sge = [mr.local(0..MSG_LEN)?];
    let mut wr = SendWr::send(2, &mut sge).signaled();
    // SAFETY: the region lives as long as the connection and is rewritten only after
    // the peer answered this message (see above).
    unsafe { qp.post_send(&mut wr) }
}

// ---------------------------------------------------------------------- server

fn server(port: u16, dir: &Path, discard: bool, t: Duration) -> Result<()> {
    let events = EventChannel::new()?;
    let listener = CmId::new(&events, PortSpace::Tcp)?;
    listener.bind_addr(SocketAddr::from(([0, 0, 0, 0], port)))?;
    listener.listen(1)?;
    println!("listening on port {port}.");
    let req = loop {
        match events.get_event(Some(t))? {
            Some(ev) if ev.kind() == EventKind::ConnectRequest => break ev,
            Some(_) => continue,
            None => return Err(examples::cm::timed_out("a client", t)),
        }
    };
    let id = req.id().clone();
    drop(req);
    let own = EventChannel::new()?;
    id.migrate(&own)?;
    let conn = Conn::new(id, own, 16)?;
    let qp = conn.create_qp(4, 4)?;
    let buffer = MemoryRegion::new(
        &conn.pd,
        BUFFER_SIZE,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )?;
    let recv = MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?;
    let mut send = MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?;
    post_recv(&qp, &recv)?;
    conn.id.accept(&ConnParam::default())?;
    drop(conn.wait_established(t, "rdma_accept")?);
    let qp = cm::established(qp)?;
    let result = receive(&conn, &qp, &buffer, &recv, &mut send, dir, discard, t);
    conn.close(Duration::from_secs(2));
    let (name, len, sum) = result?;
    println!("received {name}: {len} bytes, checksum {sum:016x}");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn receive(
    conn: &Conn,
    qp: &QueuePair<Rts>,
    buffer: &MemoryRegion,
    recv: &MemoryRegion,
    send: &mut MemoryRegion,
    dir: &Path,
    discard: bool,
    t: Duration,
) -> Result<(String, u64, u64)> {
    post_msg(qp, send, MSG_MR, buffer.addr(), buffer.rkey())?;
    // The name.
    let wc = conn.completion_of(Op::IBV_WC_RECV_RDMA_WITH_IMM, t, "the file name")?;
    post_recv(qp, recv)?;
    let n = wc.imm_data().unwrap_or(0) as usize;
    if n == 0 || n > MAX_NAME || n > wc.byte_len() as usize {
        return Err(Error::Protocol(format!("bad file name length {n}").into()));
    }
    let name = String::from_utf8_lossy(&buffer.to_vec()[..n]).into_owned();
    let base = Path::new(&name)
        .file_name()
        .ok_or_else(|| Error::Protocol(format!("`{name}` is not a file name").into()))?
        .to_owned();
    let mut out = if discard {
        None
    } else {
        let path = dir.join(&base);
        Some(File::create(&path).map_err(|e| Error::io(format!("create {}", path.display()), e))?)
    };
    post_msg(qp, send, MSG_READY, 0, 0)?;
    let mut sum = Checksum::new();
    loop {
        let wc = conn.completion_of(Op::IBV_WC_RECV_RDMA_WITH_IMM, t, "the next chunk")?;
        post_recv(qp, recv)?;
        let len = wc.imm_data().unwrap_or(0) as usize;
        if len == 0 {
            break;
        }
        if len > BUFFER_SIZE || len != wc.byte_len() as usize {
            return Err(Error::Protocol(
                format!(
                    "chunk of {len} bytes (wrote {}) does not fit the buffer",
                    wc.byte_len()
                )
                .into(),
            ));
        }
        let data = &buffer.to_vec()[..len];
        sum.update(data);
        if let Some(f) = out.as_mut() {
            f.write_all(data)
                .map_err(|e| Error::io("write the received file", e))?;
        }
        // The one credit: the client may overwrite the buffer now.
        post_msg(qp, send, MSG_READY, 0, 0)?;
    }
    if let Some(f) = out.as_mut() {
        f.flush()
            .map_err(|e| Error::io("write the received file", e))?;
    }
    post_msg(qp, send, MSG_DONE, 0, 0)?;
    conn.completion_of(Op::IBV_WC_SEND, t, "the SEND of MSG_DONE")?;
    let len = sum.len;
    Ok((base.to_string_lossy().into_owned(), len, sum.finish()))
}

// ---------------------------------------------------------------------- client

enum Source {
    File(File),
    Generated(Generator),
}

impl Source {
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize> {
        match self {
            Source::Generated(g) => Ok(g.fill(buf)),
            Source::File(f) => {
                let mut n = 0;
                while n < buf.len() {
                    match f.read(&mut buf[n..]) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(Error::io("read the file", e)),
                    }
                }
                Ok(n)
            }
        }
    }
}

fn client(
    host: &str,
    port: u16,
    file: Option<&Path>,
    generate: Option<u64>,
    gen_name: &str,
    t: Duration,
) -> Result<()> {
    let (mut source, name) = match (file, generate) {
        (Some(path), None) => {
            let f =
                File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| Error::InvalidArgument("the path has no file name".into()))?;
            (Source::File(f), name)
        }
        (None, Some(bytes)) => (
            Source::Generated(Generator::new(bytes)),
            gen_name.to_owned(),
        ),
        _ => {
            return Err(Error::InvalidArgument(
                "give a file or --generate <bytes>, not both".into(),
            ))
        }
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(Error::InvalidArgument("bad file name".into()));
    }
    let dst = socket_addr(host, port)?;
    let events = EventChannel::new()?;
    let id = CmId::new(&events, PortSpace::Tcp)?;
    id.resolve(None, dst, Duration::from_secs(2))?;
    let conn = Conn::new(id, events, 16)?;
    let qp = conn.create_qp(4, 4)?;
    let mut buffer = MemoryRegion::new(&conn.pd, BUFFER_SIZE, Access::LOCAL_WRITE)?;
    let recv = MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?;
    post_recv(&qp, &recv)?;
    conn.id.connect(&ConnParam::default())?;
    drop(conn.wait_established(t, "rdma_connect")?);
    let qp = cm::established(qp)?;
    let result = transfer(&conn, &qp, &mut buffer, &recv, &mut source, &name, t);
    conn.close(Duration::from_secs(2));
    let (len, sum, secs) = result?;
    println!("sent {name}: {len} bytes, checksum {sum:016x}");
    eprintln!(
        "{:.1} MiB/s",
        len as f64 / (1024.0 * 1024.0) / secs.max(1e-9)
    );
    Ok(())
}

fn expect_msg(
    conn: &Conn,
    recv: &MemoryRegion,
    want: i32,
    t: Duration,
    what: &str,
) -> Result<(u64, u32)> {
    let wc = conn.completion_of(Op::IBV_WC_RECV, t, what)?;
    let (id, addr, rkey) = decode(recv.as_slice()?, wc.byte_len())?;
    if id != want {
        return Err(Error::Protocol(
            format!("expected message {want}, got {id}").into(),
        ));
    }
    Ok((addr, rkey))
}

/// Posts one RDMA WRITE WITH IMMEDIATE of `buffer[..len]` (imm = `len`). Its
/// completion is skipped (and checked) by the wait for the server's answer: the
/// answer means the data arrived, so the buffer may be refilled.
fn post_write_imm(
    qp: &QueuePair<Rts>,
    buffer: &MemoryRegion,
    len: usize,
    remote: RemoteSlice,
) -> Result<()> {
    let mut sge = [buffer.local(0..len)?];
    let sges: &mut [rdma_safe::LocalSlice<'_>] = if len == 0 { &mut [] } else { &mut sge };
    let remote = RemoteSlice {
        len: len as u64,
        ..remote
    };
    let mut wr = SendWr::rdma_write_with_imm(3, sges, remote, len as u32).signaled();
    // SAFETY: the buffer is refilled only after the server's answer to this write,
    // which it sends after the data arrived.
    unsafe { qp.post_send(&mut wr) }
}

fn transfer(
    conn: &Conn,
    qp: &QueuePair<Rts>,
    buffer: &mut MemoryRegion,
    recv: &MemoryRegion,
    source: &mut Source,
    name: &str,
    t: Duration,
) -> Result<(u64, u64, f64)> {
    let (addr, rkey) = expect_msg(conn, recv, MSG_MR, t, "the server's MSG_MR")?;
    post_recv(qp, recv)?;
    let remote = RemoteSlice {
        addr,
        len: BUFFER_SIZE as u64,
        rkey,
    };
    buffer.as_mut_slice()?[..name.len()].copy_from_slice(name.as_bytes());
    post_write_imm(qp, buffer, name.len(), remote)?;
    let started = Instant::now();
    let mut sum = Checksum::new();
    loop {
        expect_msg(conn, recv, MSG_READY, t, "MSG_READY (the credit)")?;
        post_recv(qp, recv)?;
        let n = source.fill(buffer.as_mut_slice()?)?;
        sum.update(&buffer.as_slice()?[..n]);
        post_write_imm(qp, buffer, n, remote)?;
        if n == 0 {
            break;
        }
    }
    expect_msg(conn, recv, MSG_DONE, t, "MSG_DONE")?;
    let len = sum.len;
    Ok((len, sum.finish(), started.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_sees_every_byte_and_generator_is_deterministic() {
        let mut a = vec![0u8; 3 << 20];
        let mut b = vec![0u8; 3 << 20];
        assert_eq!(Generator::new(3 << 20).fill(&mut a), 3 << 20);
        Generator::new(3 << 20).fill(&mut b);
        assert!(a == b, "deterministic");
        assert!(a[..1 << 20] != a[1 << 20..2 << 20], "passes differ");
        let sum = |d: &[u8]| {
            let mut c = Checksum::new();
            c.update(d);
            c.finish()
        };
        let before = sum(&a);
        a[12345] ^= 1;
        assert_ne!(before, sum(&a));
        assert_ne!(sum(&a[..100]), sum(&a[..99]));
    }

    #[test]
    fn messages_are_24_bytes_and_checked() {
        assert!(decode(&[0u8; 24], 23).is_err());
        assert_eq!(
            decode(
                &[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                24
            )
            .unwrap()
            .0,
            2
        );
    }
}
