//! `rdma-file-transfer`: a file of any size through one registered 10 MiB buffer
//! (The Geek in the Corner, 03), with one credit of flow control.
//!
//! ```text
//! rdma-file-transfer server [-p port] [-o dir [--overwrite] | --discard]
//! rdma-file-transfer client <server> <file> [-p port]
//! rdma-file-transfer client <server> --generate <bytes> [--name n] [-p port]
//! ```
//!
//! Both take `--timeout <secs>` (the limit of any single wait, default 60) and
//! `--retry-count <0-7>` (the connection's RC retry count, default 7 as the C
//! programs; rxe retransmits forever at 7, so a dead peer is then found only by
//! the timeout).
//!
//! The wire format is the C sample's (see `examples::file_transfer`): the server
//! registers the buffer and SENDs `MSG_MR` (24 bytes: `i32 id` = 1, `u64 addr` at 8,
//! `u32 rkey` at 16, host order). The client RDMA-WRITEs the file name and its
//! terminating NUL WITH IMMEDIATE (imm = `strlen(name) + 1`); every chunk of up to
//! 10 MiB is one RDMA WRITE WITH IMMEDIATE (imm = its length) answered by `MSG_READY`
//! (id 2): the one credit the client needs for the next chunk. A zero-length write
//! with imm 0 ends the file; the server answers `MSG_DONE` (id 3). Both sides print
//! the byte count and a 64-bit checksum of the stream: `sent <name>: <n> bytes,
//! checksum <x>` and `received <name>: <n> bytes, checksum <x>`.
//!
//! The server stores the file under the name the client sent, which must be a plain
//! file name (no `/`, not `.` or `..`, no NUL, control or bidirectional formatting
//! character), in its output directory. It never follows a symbolic link there and
//! never replaces an existing file unless `--overwrite` is given: a transfer to an
//! existing name is refused (`refusing to store ...: the file exists`) before the
//! first chunk is accepted. The bytes go to a hidden file in that directory, which
//! takes the name, synced to disk, only once the whole file is there and before
//! `MSG_DONE`: a transfer that fails (the client dies, a chunk is malformed, the disk
//! fills) leaves no partial file and, with `--overwrite`, the old file whole. (The C
//! sample truncates the file when the name arrives.) A server killed during a
//! transfer leaves its hidden file, `.rdma-file-transfer.<pid>.<n>.part`.
//!
//! `--generate` sends deterministic pseudo-random content instead of a file, and
//! `--discard` keeps only the checksum, so that transfers larger than the disk or
//! the memory need neither.

use clap::{Parser, Subcommand};
use examples::cm::leased::{post_recv, Lent, Side};
use examples::cm::{exit_with, socket_addr, Conn};
use examples::file_transfer::{
    chunk_len, create_output, decode_name, encode_name, name_len, Msg, BUFFER_SIZE, MSG_LEN,
};
use rdma_safe::cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::sys::ibv_wc_opcode as Op;
use rdma_safe::{Access, Error, LeasedQp, MemoryRegion, RemoteSlice, Result, SendFlags, SendOp};
use std::fs::File;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// RC transport retries of the connection (0-7; rxe retries forever at 7)
    #[arg(long = "retry-count", global = true, default_value_t = 7,
          value_parser = clap::value_parser!(u8).range(0..=7))]
    retry_count: u8,
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
        /// replace an existing file of the received name (a symbolic link is still
        /// never followed); without it such a transfer is refused
        #[arg(long = "overwrite", conflicts_with = "discard")]
        overwrite: bool,
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
    let param = ConnParam {
        retry_count: args.retry_count,
        ..ConnParam::default()
    };
    let result = match &args.role {
        Role::Server {
            port,
            dir,
            discard,
            overwrite,
        } => {
            let store = match (discard, overwrite) {
                (true, _) => Store::Discard,
                (false, overwrite) => Store::Dir {
                    dir: dir.clone(),
                    overwrite: *overwrite,
                },
            };
            server(*port, &store, &param, t)
        }
        Role::Client {
            server,
            file,
            port,
            generate,
            name,
        } => client(server, *port, file.as_deref(), *generate, name, &param, t),
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

/// The `wr_id`s of the requests, one per buffer they lend: the message receive and
/// send buffers, and the client's data buffer (the RDMA WRITE WITH IMMEDIATE source).
const RECV: u64 = 1;
const SEND: u64 = 2;
const DATA: u64 = 3;

/// The message buffers both sides have.
fn message_buffers(conn: &Conn) -> Result<Lent> {
    let mut bufs = Lent::default();
    bufs.add(
        RECV,
        "receive",
        MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?,
    );
    bufs.add(
        SEND,
        "send",
        MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?,
    );
    Ok(bufs)
}

/// Posts a message (signaled; its completion is collected by a later wait), once
/// the previous message's SEND gave the buffer back.
fn post_msg(side: &mut Side, msg: Msg, t: Duration) -> Result<()> {
    side.reclaim(SEND, Op::IBV_WC_SEND, t)?;
    side.bufs.get(SEND)?.as_mut_slice()?[..MSG_LEN].copy_from_slice(&msg.encode());
    side.post(SEND, SendOp::Send, MSG_LEN, SendFlags::SIGNALED)
}

// ---------------------------------------------------------------------- server

/// What the server does with the stream.
enum Store {
    /// Only checksum it (`--discard`).
    Discard,
    /// Store it in `dir` (`-o`), replacing an existing file only if `overwrite`.
    Dir { dir: PathBuf, overwrite: bool },
}

fn server(port: u16, store: &Store, param: &ConnParam, t: Duration) -> Result<()> {
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
    let mut qp = LeasedQp::before_rts(conn.create_qp(4, 4)?).map_err(|e| e.error)?;
    let buffer = MemoryRegion::new(
        &conn.pd,
        BUFFER_SIZE,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )?;
    let mut bufs = message_buffers(&conn)?;
    post_recv(&mut qp, &mut bufs, RECV, MSG_LEN)?;
    conn.id.accept(param)?;
    drop(conn.wait_established(t, "rdma_accept")?);
    let qp = qp.established().map_err(|e| e.error)?;
    let mut side = Side {
        conn: &conn,
        qp,
        bufs,
    };
    let result = receive(&mut side, &buffer, store, t);
    conn.close(Duration::from_secs(2));
    let (name, len, sum) = result?;
    println!("received {name}: {len} bytes, checksum {sum:016x}");
    Ok(())
}

/// Receives the name, then every chunk, answering each with the credit.
///
/// The buffer is remotely writable: its bytes are only ever copied out with volatile
/// reads (`read_at`), never borrowed as a slice a misbehaving client could write into.
fn receive(
    side: &mut Side,
    buffer: &MemoryRegion,
    store: &Store,
    t: Duration,
) -> Result<(String, u64, u64)> {
    let mr = Msg::Mr {
        addr: buffer.addr(),
        rkey: buffer.rkey(),
    };
    post_msg(side, mr, t)?;
    // The name and its NUL, as the C client writes them.
    let wc = side.wait(Op::IBV_WC_RECV_RDMA_WITH_IMM, t, "the file name")?;
    let n = name_len(wc.imm_data(), wc.byte_len())?;
    let mut raw = vec![0u8; n];
    buffer.read_at(0, &mut raw)?;
    let name = decode_name(&raw)?;
    let mut out = match store {
        Store::Discard => None,
        Store::Dir { dir, overwrite } => Some(create_output(dir, name, *overwrite)?),
    };
    let name = name.to_string_lossy().into_owned();
    side.post_recv(RECV, MSG_LEN)?;
    post_msg(side, Msg::Ready, t)?;
    let mut sum = Checksum::new();
    let mut data = vec![0u8; BUFFER_SIZE];
    loop {
        let wc = side.wait(Op::IBV_WC_RECV_RDMA_WITH_IMM, t, "the next chunk")?;
        let len = chunk_len(wc.imm_data(), wc.byte_len())?;
        if len == 0 {
            break;
        }
        side.post_recv(RECV, MSG_LEN)?;
        let chunk = &mut data[..len];
        buffer.read_at(0, chunk)?;
        sum.update(chunk);
        if let Some(f) = out.as_mut() {
            f.file()
                .write_all(chunk)
                .map_err(|e| Error::io("write the received file", e))?;
        }
        // The one credit: the client may overwrite the buffer now.
        post_msg(side, Msg::Ready, t)?;
    }
    // Synced and named before MSG_DONE tells the client it is stored; on any
    // error before this, `out` is dropped and removes what was written.
    if let Some(f) = out {
        f.commit()?;
    }
    post_msg(side, Msg::Done, t)?;
    done_acknowledged(side, t)?;
    let len = sum.len;
    Ok((name, len, sum.finish()))
}

/// Waits for the completion of the SEND of `MSG_DONE`. The file is whole by now
/// (its end marker arrived and it was flushed), so a client that disconnects
/// first is no failure: it disconnects once it has `MSG_DONE`, and on a lossy
/// wire the RC ACK of that SEND can be lost after the client already has it
/// (its QP is then gone and never acknowledges the retransmission). Neither is
/// a wait that runs out: when the client's disconnect request is lost too, and
/// the client exits before the CM sends it again, nothing more ever comes (rxe
/// retransmits forever at retry count 7).
fn done_acknowledged(side: &mut Side, t: Duration) -> Result<()> {
    match side.wait(Op::IBV_WC_SEND, t, "the SEND of MSG_DONE") {
        Err(e) if examples::cm::is_disconnect(&e) => {
            eprintln!("note: the client disconnected before MSG_DONE was acknowledged");
            Ok(())
        }
        Err(e) if examples::cm::is_timeout(&e) => {
            eprintln!(
                "note: MSG_DONE was not acknowledged and the client's disconnect never \
                 came within {t:?}; the file is whole"
            );
            Ok(())
        }
        other => other.map(drop),
    }
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
    param: &ConnParam,
    t: Duration,
) -> Result<()> {
    let (mut source, name) = match (file, generate) {
        (Some(path), None) => {
            let f =
                File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
            let name = path
                .file_name()
                .ok_or_else(|| Error::InvalidArgument("the path has no file name".into()))?;
            (Source::File(f), name.as_bytes().to_vec())
        }
        (None, Some(bytes)) => (
            Source::Generated(Generator::new(bytes)),
            gen_name.as_bytes().to_vec(),
        ),
        _ => {
            return Err(Error::InvalidArgument(
                "give a file or --generate <bytes>, not both".into(),
            ))
        }
    };
    // The name and its NUL, as the C client sends them (checked before connecting).
    let name_msg = encode_name(&name)?;
    let name = String::from_utf8_lossy(&name).into_owned();
    let dst = socket_addr(host, port)?;
    let events = EventChannel::new()?;
    let id = CmId::new(&events, PortSpace::Tcp)?;
    id.resolve(None, dst, Duration::from_secs(2))?;
    let conn = Conn::new(id, events, 16)?;
    let mut qp = LeasedQp::before_rts(conn.create_qp(4, 4)?).map_err(|e| e.error)?;
    let mut bufs = message_buffers(&conn)?;
    let data = MemoryRegion::new(&conn.pd, BUFFER_SIZE, Access::LOCAL_WRITE)?;
    bufs.add(DATA, "data", data);
    post_recv(&mut qp, &mut bufs, RECV, MSG_LEN)?;
    conn.id.connect(param)?;
    drop(conn.wait_established(t, "rdma_connect")?);
    let qp = qp.established().map_err(|e| e.error)?;
    let mut side = Side {
        conn: &conn,
        qp,
        bufs,
    };
    let result = transfer(&mut side, &mut source, &name_msg, t);
    conn.close(Duration::from_secs(2));
    let (len, sum, secs) = result?;
    println!("sent {name}: {len} bytes, checksum {sum:016x}");
    eprintln!(
        "{:.1} MiB/s",
        len as f64 / (1024.0 * 1024.0) / secs.max(1e-9)
    );
    Ok(())
}

/// Waits for the server's next message, which must be `want`.
fn expect_msg(side: &mut Side, want: Msg, t: Duration) -> Result<Msg> {
    let what = format!("the server's {}", want.name());
    let wc = side.wait(Op::IBV_WC_RECV, t, &what)?;
    let bytes = side.bufs.get(RECV)?.as_slice()?;
    let got = Msg::decode(bytes.get(..wc.byte_len() as usize).unwrap_or(bytes))?;
    if std::mem::discriminant(&got) != std::mem::discriminant(&want) {
        return Err(Error::Protocol(
            format!("expected {}, got {}", want.name(), got.name()).into(),
        ));
    }
    Ok(got)
}

/// Posts one RDMA WRITE WITH IMMEDIATE of the data buffer's first `len` bytes (imm =
/// `len`; no scatter/gather entry at all for 0). Its completion, collected by the
/// wait for the server's answer, gives the buffer back for the next chunk.
fn post_write_imm(side: &mut Side, len: usize, remote: RemoteSlice) -> Result<()> {
    let remote = RemoteSlice {
        len: len as u64,
        ..remote
    };
    let op = SendOp::WriteWithImm(remote, len as u32);
    side.post(DATA, op, len, SendFlags::SIGNALED)
}

fn transfer(
    side: &mut Side,
    source: &mut Source,
    name_msg: &[u8],
    t: Duration,
) -> Result<(u64, u64, f64)> {
    let (addr, rkey) = match expect_msg(side, Msg::Mr { addr: 0, rkey: 0 }, t)? {
        Msg::Mr { addr, rkey } => (addr, rkey),
        other => {
            return Err(Error::Protocol(
                format!("expected MSG_MR, got {}", other.name()).into(),
            ))
        }
    };
    side.post_recv(RECV, MSG_LEN)?;
    let remote = RemoteSlice {
        addr,
        len: BUFFER_SIZE as u64,
        rkey,
    };
    side.bufs.get(DATA)?.as_mut_slice()?[..name_msg.len()].copy_from_slice(name_msg);
    post_write_imm(side, name_msg.len(), remote)?;
    let started = Instant::now();
    let mut sum = Checksum::new();
    loop {
        expect_msg(side, Msg::Ready, t)?;
        side.post_recv(RECV, MSG_LEN)?;
        side.reclaim(DATA, Op::IBV_WC_RDMA_WRITE, t)?;
        let buffer = side.bufs.get(DATA)?;
        let n = source.fill(buffer.as_mut_slice()?)?;
        sum.update(&buffer.as_slice()?[..n]);
        post_write_imm(side, n, remote)?;
        if n == 0 {
            break;
        }
    }
    expect_msg(side, Msg::Done, t)?;
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
}
