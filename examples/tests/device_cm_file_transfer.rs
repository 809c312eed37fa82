//! `rdma-file-transfer` in the Soft-RoCE guest: a real file of an odd size stored
//! byte for byte, and a stream larger than 2 GiB (and, when the guest has less
//! memory than that, larger than its memory) whose checksums must match on both
//! sides. Nothing huge lands on disk: the client generates the content, the server
//! checksums it.
//!
//!
//! And the C sample's wire format and the server's defences, with a peer in this
//! process speaking the protocol verb by verb: a C-framed name (NUL included) is
//! accepted, the Rust client frames its name as the C client does, a stray SEND is an
//! error naming it (not silently dropped), an existing file is never replaced.
//!
//! Run by `cargo xtask test`; they fail without a device.

use examples::cm::child::{port, run_client, spawn, Finished, Running};
use examples::cm::leased::{post_recv, Lent};
use examples::cm::Conn;
use examples::file_transfer::{Msg, MSG_LEN};
use rdma_safe::cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::qp::{Init, Rts};
use rdma_safe::sys::ibv_wc_opcode as Op;
use rdma_safe::{Access, Lease, LeasedQp, MemoryRegion, RemoteSlice, SendOp, WorkCompletion};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-file-transfer");

fn ip() -> String {
    std::env::var("RDMA_IP").expect(
        "RDMA_IP is not set: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    )
}

/// The `<n> bytes, checksum <x>` part of a `sent`/`received` line.
fn summary(out: &Finished, word: &str) -> String {
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(word))
        .and_then(|l| l.split_once(": ").map(|(_, s)| s.to_owned()))
        .unwrap_or_else(|| panic!("no `{word}` line:\n{out}"))
}

fn transfer(
    slot: u16,
    server_args: &[&str],
    client_args: &[&str],
    timeout: Duration,
) -> (Finished, Finished) {
    let p = port(7900, slot).to_string();
    let mut sargs = vec!["server", "-p", &p];
    sargs.extend_from_slice(server_args);
    let server = spawn(BIN, &sargs);
    let ip = ip();
    let mut cargs = vec!["client", &ip];
    cargs.extend_from_slice(client_args);
    cargs.extend_from_slice(&["-p", &p]);
    // Retried while the server does not listen yet.
    let client = run_client(BIN, &cargs, timeout, Duration::from_secs(30));
    let server = server.wait(Duration::from_secs(60));
    assert!(client.success(), "client:\n{client}\nserver:\n{server}");
    assert!(server.success(), "server:\n{server}");
    (client, server)
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn real_file_arrives_byte_for_byte() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ft-{}", std::process::id()));
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let src = dir.join("odd-size.bin");
    // 25 MiB + 3 bytes: three chunks, the last one short.
    let mut data = vec![0u8; 25 * 1024 * 1024 + 3];
    let mut x = 0x1234_5678_9abc_def0u64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&src, &data).unwrap();
    let (client, server) = transfer(
        1,
        &["-o", out_dir.to_str().unwrap()],
        &[src.to_str().unwrap()],
        Duration::from_secs(300),
    );
    assert_eq!(summary(&client, "sent "), summary(&server, "received "));
    let got = std::fs::read(out_dir.join("odd-size.bin")).unwrap();
    assert!(got == data, "the stored file differs from the sent one");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn stream_larger_than_2_gib_and_than_guest_memory_checksums_match() {
    // More than 2 GiB and more than the guest's memory (4 GiB by default): the
    // stream goes through one 10 MiB buffer, so memory does not limit it.
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    assert!(mem > 0, "no MemTotal in /proc/meminfo");
    let size = ((2u64 << 30) + (37 << 20))
        .max(mem + (64 << 20))
        .min(6 << 30)
        + 12345;
    assert!(size > 2 << 30 && size > mem);
    let size_s = size.to_string();
    let (client, server) = transfer(
        2,
        &["--discard"],
        &["--generate", &size_s, "--name", "big.bin"],
        Duration::from_secs(1500),
    );
    let sent = summary(&client, "sent ");
    assert!(
        sent.starts_with(&format!("{size} bytes, checksum ")),
        "{client}"
    );
    assert_eq!(sent, summary(&server, "received "));
    eprintln!("{} bytes (guest memory {mem} bytes): {sent}", size);
}

const T: Duration = Duration::from_secs(60);

/// One end of a connection driven by this process: a 24-byte receive buffer (a
/// receive is always posted) and a send buffer, lent to their requests through the
/// safe layer.
struct Peer {
    conn: Conn,
    qp: LeasedQp<Rts>,
    bufs: Lent,
}

/// The `wr_id`s of the peer's buffers.
const RECV: u64 = 1;
const SEND: u64 = 2;

impl Peer {
    fn buffers(conn: &Conn) -> Lent {
        let mut bufs = Lent::default();
        let recv = MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE).unwrap();
        bufs.add(RECV, "receive", recv);
        let send = MemoryRegion::new(&conn.pd, 4096, Access::LOCAL_WRITE).unwrap();
        bufs.add(SEND, "send", send);
        bufs
    }

    /// A queue pair not connected yet, its receive posted.
    fn before_rts(conn: &Conn, bufs: &mut Lent) -> LeasedQp<Init> {
        let qp = conn.create_qp(8, 4).unwrap();
        let mut qp = LeasedQp::before_rts(qp).map_err(|e| e.error).unwrap();
        post_recv(&mut qp, bufs, RECV, MSG_LEN).unwrap();
        qp
    }

    /// Posts the receive again (once its buffer is back).
    fn repost(&mut self) {
        post_recv(&mut self.qp, &mut self.bufs, RECV, MSG_LEN).unwrap();
    }

    /// The next completion of `op`; the buffers every completion polled meanwhile
    /// releases come back.
    fn wait(&mut self, op: Op, what: &str) -> WorkCompletion {
        let bufs = &mut self.bufs;
        self.conn
            .leased_completion_of(&mut self.qp, op, T, what, &mut |id, lease| {
                bufs.put(id, lease)
            })
            .unwrap()
    }

    /// Connects to the server on `p`, retrying while it does not listen yet.
    fn connect(p: u16) -> Peer {
        let a: SocketAddr = format!("{}:{p}", ip()).parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let events = EventChannel::new().unwrap();
            let id = CmId::new(&events, PortSpace::Tcp).unwrap();
            id.resolve(None, a, Duration::from_secs(2)).unwrap();
            let conn = Conn::new(id, events, 16).unwrap();
            let mut bufs = Peer::buffers(&conn);
            let qp = Peer::before_rts(&conn, &mut bufs);
            conn.id.connect(&ConnParam::default()).unwrap();
            match conn.wait_established(T, "rdma_connect") {
                Ok(ev) => {
                    drop(ev);
                    let qp = qp.established().map_err(|e| e.error).unwrap();
                    return Peer { conn, qp, bufs };
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("retrying: {e}");
                    std::thread::sleep(Duration::from_millis(300));
                }
                Err(e) => panic!("cannot connect to the file-transfer server: {e}"),
            }
        }
    }

    /// Listens on `p` (call before starting the client).
    fn listen(p: u16) -> (CmId, Arc<EventChannel>) {
        let events = EventChannel::new().unwrap();
        let listener = CmId::new(&events, PortSpace::Tcp).unwrap();
        listener
            .bind_addr(format!("{}:{p}", ip()).parse().unwrap())
            .unwrap();
        listener.listen(1).unwrap();
        (listener, events)
    }

    /// Accepts the first client of `events`' listener; the returned buffer (remotely
    /// writable) is what the client writes into.
    fn accept(events: &Arc<EventChannel>, client: &Running) -> (Peer, MemoryRegion) {
        let req = events
            .expect(EventKind::ConnectRequest, "rdma_listen", T)
            .unwrap_or_else(|e| panic!("no client: {e}\n{}", client.stdout_so_far()));
        let id = req.id().clone();
        drop(req);
        let own = EventChannel::new().unwrap();
        id.migrate(&own).unwrap();
        let conn = Conn::new(id, own, 16).unwrap();
        let mut bufs = Peer::buffers(&conn);
        let buffer =
            MemoryRegion::new(&conn.pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        let qp = Peer::before_rts(&conn, &mut bufs);
        conn.id.accept(&ConnParam::default()).unwrap();
        drop(conn.wait_established(T, "rdma_accept").unwrap());
        let qp = qp.established().map_err(|e| e.error).unwrap();
        (Peer { conn, qp, bufs }, buffer)
    }

    /// The next message (a SEND of the peer), which must be `want`.
    fn expect(&mut self, want: Msg) -> Msg {
        let wc = self.wait(Op::IBV_WC_RECV, want.name());
        let mut bytes = vec![0; wc.byte_len() as usize];
        self.bufs.get(RECV).unwrap().read_at(0, &mut bytes).unwrap();
        let got = Msg::decode(&bytes).unwrap();
        self.repost();
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&want),
            "expected {}, got {got:?}",
            want.name()
        );
        got
    }

    /// The send buffer filled with `bytes`, once the request that held it is done
    /// (its completion may not have been polled yet).
    fn fill_send(&mut self, bytes: &[u8]) {
        while !self.bufs.is_back(SEND) {
            let bufs = &mut self.bufs;
            self.conn
                .leased_completion(&mut self.qp, T, "the send buffer back", &mut |id, lease| {
                    bufs.put(id, lease)
                })
                .unwrap();
        }
        self.bufs.get(SEND).unwrap().write_at(0, bytes).unwrap();
    }

    /// Lends the send buffer to `op` on its first `len` bytes, signaled.
    fn post(&mut self, op: SendOp, len: usize) {
        let mr = self.bufs.take(SEND).unwrap();
        let posted = self.qp.post_send(SEND, op, Lease::Owned(mr), 0..len, true);
        if let Err(e) = posted {
            panic!("posting from the peer: {}", e.error);
        }
    }

    /// SENDs `bytes` (signaled; the completion is collected by later waits).
    fn send(&mut self, bytes: &[u8]) {
        self.fill_send(bytes);
        self.post(SendOp::Send, bytes.len());
    }

    /// RDMA-WRITEs `bytes` WITH IMMEDIATE `imm` to `remote`.
    fn write_imm(&mut self, bytes: &[u8], remote: RemoteSlice, imm: u32) {
        self.fill_send(bytes);
        let remote = RemoteSlice {
            len: bytes.len() as u64,
            ..remote
        };
        self.post(SendOp::WriteWithImm(remote, imm), bytes.len());
    }
}

/// The server's buffer, from its `MSG_MR`.
fn remote_of(mr: Msg) -> RemoteSlice {
    match mr {
        Msg::Mr { addr, rkey } => RemoteSlice { addr, len: 0, rkey },
        other => panic!("expected MSG_MR, got {other:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn c_framed_name_is_accepted() {
    let p = port(7900, 3);
    let server = spawn(BIN, &["server", "-p", &p.to_string(), "--discard"]);
    let mut peer = Peer::connect(p);
    let remote = remote_of(peer.expect(Msg::Mr { addr: 0, rkey: 0 }));
    // Exactly what the C client writes: strcpy + strlen(name) + 1.
    peer.write_imm(b"c-name.bin\0", remote, 11);
    peer.expect(Msg::Ready);
    peer.write_imm(b"hello", remote, 5);
    peer.expect(Msg::Ready);
    peer.write_imm(b"", remote, 0);
    peer.expect(Msg::Done);
    let out = server.wait(T);
    assert!(out.success(), "{out}");
    assert!(
        out.stdout
            .contains("received c-name.bin: 5 bytes, checksum "),
        "{out}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_client_frames_the_name_as_the_c_client() {
    let p = port(7900, 4);
    let ps = p.to_string();
    let (_listener, events) = Peer::listen(p);
    let client = spawn(
        BIN,
        &[
            "client",
            &ip(),
            "--generate",
            "100",
            "--name",
            "big.bin",
            "-p",
            &ps,
        ],
    );
    // This process is the C server: MSG_MR, then the name as it reads it.
    let (mut peer, buffer) = Peer::accept(&events, &client);
    peer.send(
        &Msg::Mr {
            addr: buffer.addr(),
            rkey: buffer.rkey(),
        }
        .encode(),
    );
    let wc = peer.wait(Op::IBV_WC_RECV_RDMA_WITH_IMM, "the name");
    assert_eq!(wc.imm_data(), Some(8), "imm = strlen(\"big.bin\") + 1");
    assert_eq!(wc.byte_len(), 8);
    let mut name = [0u8; 8];
    buffer.read_at(0, &mut name).unwrap();
    assert_eq!(&name, b"big.bin\0", "the name and its NUL");
    // What the C server keeps: the bytes with the last one set to NUL.
    name[7] = 0;
    assert_eq!(
        std::ffi::CStr::from_bytes_until_nul(&name).unwrap(),
        c"big.bin"
    );
    peer.repost();
    peer.send(&Msg::Ready.encode());
    let wc = peer.wait(Op::IBV_WC_RECV_RDMA_WITH_IMM, "the chunk");
    assert_eq!((wc.imm_data(), wc.byte_len()), (Some(100), 100));
    peer.repost();
    peer.send(&Msg::Ready.encode());
    let wc = peer.wait(Op::IBV_WC_RECV_RDMA_WITH_IMM, "the end");
    assert_eq!((wc.imm_data(), wc.byte_len()), (Some(0), 0));
    peer.send(&Msg::Done.encode());
    let out = client.wait(T);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("sent big.bin: 100 bytes"), "{out}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn stray_send_is_an_error_not_dropped() {
    let p = port(7900, 5);
    // A long timeout: the server must fail at once, not time out.
    let server = spawn(
        BIN,
        &[
            "server",
            "-p",
            &p.to_string(),
            "--discard",
            "--timeout",
            "50",
        ],
    );
    let mut peer = Peer::connect(p);
    peer.expect(Msg::Mr { addr: 0, rkey: 0 });
    let started = Instant::now();
    // A SEND where the name's WRITE WITH IMMEDIATE belongs: it takes the server's
    // only posted receive.
    peer.send(&Msg::Ready.encode());
    let out = server.wait(T);
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(!out.stderr.contains("panicked"), "{out}");
    assert!(
        out.stderr
            .contains("unexpected IBV_WC_RECV completion (24 bytes)")
            && out.stderr.contains("the file name"),
        "the server must name the stray completion:\n{out}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the server waited instead of failing: {:?}",
        started.elapsed()
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn existing_file_is_kept_unless_overwrite() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ft-exists-{}", std::process::id()));
    let out_dir = dir.join("out");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&out_dir).unwrap();
    let src = dir.join("same.bin");
    std::fs::write(&src, b"new content").unwrap();
    std::fs::write(out_dir.join("same.bin"), b"precious").unwrap();
    let p = port(7900, 6).to_string();
    let out_s = out_dir.to_str().unwrap();
    let server = spawn(BIN, &["server", "-p", &p, "-o", out_s]);
    let client = run_client(
        BIN,
        &["client", &ip(), src.to_str().unwrap(), "-p", &p],
        T,
        Duration::from_secs(30),
    );
    let server = server.wait(T);
    assert_eq!(server.status.and_then(|s| s.code()), Some(1), "{server}");
    assert!(
        server.stderr.contains("the file exists (pass --overwrite"),
        "{server}"
    );
    assert!(
        !client.success(),
        "the client must see the refusal:\n{client}"
    );
    assert_eq!(
        std::fs::read(out_dir.join("same.bin")).unwrap(),
        b"precious"
    );
    // With --overwrite the file is replaced.
    let (client, server) = transfer(
        7,
        &["-o", out_s, "--overwrite"],
        &[src.to_str().unwrap()],
        T,
    );
    assert_eq!(summary(&client, "sent "), summary(&server, "received "));
    assert_eq!(
        std::fs::read(out_dir.join("same.bin")).unwrap(),
        b"new content"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The names in `dir`, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A client that sends a name and part of the file, then a malformed chunk: the
/// server fails naming it, and leaves the directory as it was: the file that
/// `--overwrite` would have replaced whole, no partial file under either name,
/// no hidden part.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_failed_transfer_replaces_nothing_and_leaves_nothing() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ft-failed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("same.bin"), b"precious").unwrap();
    let out_s = dir.to_str().unwrap();
    for (slot, name) in [(8, "same.bin"), (9, "new.bin")] {
        let p = port(7900, slot);
        let server = spawn(
            BIN,
            &["server", "-p", &p.to_string(), "-o", out_s, "--overwrite"],
        );
        let mut peer = Peer::connect(p);
        let remote = remote_of(peer.expect(Msg::Mr { addr: 0, rkey: 0 }));
        let framed = format!("{name}\0");
        peer.write_imm(framed.as_bytes(), remote, framed.len() as u32);
        peer.expect(Msg::Ready);
        peer.write_imm(b"the first half", remote, 14);
        peer.expect(Msg::Ready);
        // A chunk whose immediate is not the length written.
        peer.write_imm(b"the rest", remote, 99);
        let out = server.wait(T);
        assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
        assert!(out.stderr.contains("a chunk with immediate 99"), "{out}");
        assert_eq!(
            std::fs::read(dir.join("same.bin")).unwrap(),
            b"precious",
            "{name}"
        );
        assert_eq!(names(&dir), ["same.bin"], "after {name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
