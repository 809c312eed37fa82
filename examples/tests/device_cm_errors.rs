//! Failures of the CM ports end with a clear message and C's status (255 for
//! `rping`, which returns -1, and 1 for the others), never a hang or a panic: nobody listening, an unreachable address, a peer that rejects, a peer that
//! dies mid-transfer, a peer that sends a message of the wrong size (both ways).
//!
//! Run by `cargo xtask test`; they fail without a device.

use examples::cm::child::{port, spawn, Finished};
use examples::cm::leased::{post_recv, Lent, Side};
use examples::cm::Conn;
use rdma_safe::cm::{self, CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::qp::Rts;
use rdma_safe::sys::ibv_wc_opcode as Op;
use rdma_safe::{Access, LeasedQp, MemoryRegion, RemoteSlice, SendFlags, SendOp};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const RUST: &str = env!("CARGO_BIN_EXE_rping");
const T: Duration = Duration::from_secs(60);

fn ip() -> String {
    std::env::var("RDMA_IP").expect(
        "RDMA_IP is not set: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    )
}

fn failed_cleanly(out: &Finished, needle: &str) {
    failed_with(out, needle, 255);
}

fn failed_with(out: &Finished, needle: &str, status: i32) {
    assert!(
        out.status.is_some(),
        "hung (killed after the deadline):\n{out}"
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(status), "{out}");
    assert!(!out.stderr.contains("panicked"), "{out}");
    assert!(
        out.stderr.contains(needle),
        "expected `{needle}` in:\n{out}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn client_to_a_port_nobody_listens_on() {
    let p = port(7500, 1).to_string();
    let started = Instant::now();
    let out = spawn(RUST, &["-c", "-a", &ip(), "-p", &p, "-C", "1"]).wait(T);
    failed_cleanly(&out, "nobody listens");
    assert!(out.stderr.contains("rdma_connect failed"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // C's rping ends the same way, with the same status.
    let c = spawn("rping", &["-c", "-a", &ip(), "-p", &p, "-C", "1"]).wait(T);
    assert_eq!(c.status.and_then(|s| s.code()), Some(255), "C rping:\n{c}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn client_to_an_unreachable_address() {
    let out = spawn(RUST, &["-c", "-a", "198.51.100.7", "-p", "7174", "-C", "1"]).wait(T);
    failed_cleanly(&out, "rdma_resolve_addr failed");
}

/// A listener in this process: returns the first connect request's id.
fn listen(p: u16) -> (CmId, std::sync::Arc<EventChannel>) {
    let events = EventChannel::new().unwrap();
    let id = CmId::new(&events, PortSpace::Tcp).unwrap();
    let a: SocketAddr = format!("{}:{p}", ip()).parse().unwrap();
    id.bind_addr(a).unwrap();
    id.listen(4).unwrap();
    (id, events)
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn client_rejected_by_the_peer() {
    let p = port(7500, 2);
    let (_listener, events) = listen(p);
    let ps = p.to_string();
    let client = spawn(RUST, &["-c", "-a", &ip(), "-p", &ps, "-C", "1"]);
    let req = events
        .expect(EventKind::ConnectRequest, "rdma_listen", T)
        .unwrap();
    req.id().reject(b"no thanks").unwrap();
    drop(req);
    let out = client.wait(T);
    failed_cleanly(&out, "rejected by the peer application");
}

/// The `wr_id` of the one 64-byte buffer of this process's end of a connection.
const BUF: u64 = 1;

/// The one 64-byte buffer of this process's end of a connection.
fn buffer(conn: &Conn) -> Lent {
    let mut bufs = Lent::default();
    let mr = MemoryRegion::new(&conn.pd, 64, Access::LOCAL_WRITE).unwrap();
    bufs.add(BUF, "message", mr);
    bufs
}

/// SENDs the first `len` bytes of the buffer, signaled.
fn send(side: &mut Side<'_>, len: usize) {
    side.post(BUF, SendOp::Send, len, SendFlags::SIGNALED)
        .unwrap();
}

/// Accepts one connection in this process with a 64-byte buffer and a posted receive.
fn accept_one(events: &std::sync::Arc<EventChannel>) -> (Conn, LeasedQp<Rts>, Lent) {
    let req = events
        .expect(EventKind::ConnectRequest, "rdma_listen", T)
        .unwrap();
    let id = req.id().clone();
    drop(req);
    let own = EventChannel::new().unwrap();
    id.migrate(&own).unwrap();
    let conn = Conn::new(id, own, 16).unwrap();
    let qp = conn.create_qp(8, 4).unwrap();
    let mut qp = LeasedQp::before_rts(qp).map_err(|e| e.error).unwrap();
    let mut bufs = buffer(&conn);
    post_recv(&mut qp, &mut bufs, BUF, 64).unwrap();
    conn.id.accept(&ConnParam::default()).unwrap();
    drop(conn.wait_established(T, "rdma_accept").unwrap());
    let qp = qp.established().map_err(|e| e.error).unwrap();
    (conn, qp, bufs)
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn client_gets_a_message_of_the_wrong_size() {
    let p = port(7500, 3);
    let (_listener, events) = listen(p);
    let ps = p.to_string();
    let client = spawn(RUST, &["-c", "-a", &ip(), "-p", &ps, "-C", "1"]);
    let (conn, qp, bufs) = accept_one(&events);
    let mut side = Side {
        conn: &conn,
        qp,
        bufs,
    };
    // The client's descriptor arrives; answer with 7 bytes instead of 16.
    let wc = side.wait(Op::IBV_WC_RECV, T, "descriptor").unwrap();
    assert_eq!(wc.byte_len(), 16);
    send(&mut side, 7);
    let out = client.wait(T);
    failed_cleanly(&out, "Received bogus data, size 7");
    drop(side);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn server_gets_a_message_of_the_wrong_size() {
    let p = port(7500, 4);
    let ps = p.to_string();
    let server = spawn(RUST, &["-s", "-a", &ip(), "-p", &ps]);
    let a: SocketAddr = format!("{}:{p}", ip()).parse().unwrap();
    // Connect from this process (retrying until the server listens).
    let deadline = Instant::now() + Duration::from_secs(20);
    let (conn, qp, bufs) = loop {
        let events = EventChannel::new().unwrap();
        let id = CmId::new(&events, PortSpace::Tcp).unwrap();
        id.resolve(None, a, Duration::from_secs(2)).unwrap();
        let conn = Conn::new(id, events, 16).unwrap();
        let qp = conn.create_qp(8, 4).unwrap();
        let bufs = buffer(&conn);
        conn.id.connect(&ConnParam::default()).unwrap();
        match conn.wait_established(T, "rdma_connect") {
            Ok(ev) => {
                drop(ev);
                let qp = LeasedQp::new(cm::established(qp).unwrap())
                    .map_err(|e| e.error)
                    .unwrap();
                break (conn, qp, bufs);
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("retrying: {e}");
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => panic!("cannot connect to the rping server: {e}"),
        }
    };
    let mut side = Side {
        conn: &conn,
        qp,
        bufs,
    };
    send(&mut side, 7);
    let _ = side.next(T, "the SEND");
    let out = server.wait(T);
    failed_cleanly(&out, "Received bogus data, size 7");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn peer_dies_mid_transfer() {
    let ip = ip();
    let p = port(7500, 5).to_string();
    let server = spawn(RUST, &["-s", "-a", &ip, "-p", &p]);
    // A client that pings forever; started again while the one-shot server does
    // not listen yet (a probing client would end that server).
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        let mut client = spawn(RUST, &["-c", "-v", "-a", &ip, "-p", &p, "-C", "0"]);
        // Running and pinging (the first start of a binary can be slow), or ended.
        let pinging = Instant::now() + Duration::from_secs(20);
        while !client.exited()
            && !client.stdout_so_far().contains("ping data: ")
            && Instant::now() < pinging
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !client.exited() {
            break client;
        }
        let out = client.wait(T);
        assert!(
            out.stderr.contains("nobody listens") && Instant::now() < deadline,
            "the client ended early:\n{out}"
        );
    };
    let server_out = server.kill(); // SIGKILL mid-transfer
    let started = Instant::now();
    let out = client.wait(T);
    assert!(
        out.status.is_some(),
        "the client hung after its peer died:\n{out}"
    );
    assert!(!out.stderr.contains("panicked"), "{out}");
    assert!(
        !out.lines_after("ping data: ").is_empty(),
        "no ping before the kill:\n{out}\nserver:\n{server_out}"
    );
    assert!(
        out.stderr.contains("DISCONNECT") || out.stderr.contains("rping:"),
        "no message about the dead peer:\n{out}"
    );
    assert!(started.elapsed() < Duration::from_secs(45));
}

/// A peer's zero-length WRITE with immediate uses up `rdma-client`'s posted
/// receive: it is no message of that protocol, and the client fails at once
/// naming it. (It was taken for the completion of the client's own send, which
/// printed "send completed successfully." and left the run waiting until its
/// timeout.)
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rw_client_gets_a_write_with_immediate() {
    let p = port(7500, 6);
    let (_listener, events) = listen(p);
    let ps = p.to_string();
    let client = spawn(env!("CARGO_BIN_EXE_rdma-client"), &["write", &ip(), &ps]);
    let (conn, qp, bufs) = accept_one(&events);
    let mut side = Side {
        conn: &conn,
        qp,
        bufs,
    };
    // The client's MSG_MR arrives; answer with a WRITE with immediate instead.
    side.wait(Op::IBV_WC_RECV, T, "MSG_MR").unwrap();
    let nowhere = RemoteSlice {
        addr: 0,
        len: 0,
        rkey: 0,
    };
    let op = SendOp::WriteWithImm(nowhere, 7);
    side.post(BUF, op, 0, SendFlags::SIGNALED).unwrap();
    let out = client.wait(T);
    failed_with(&out, "unexpected IBV_WC_RECV_RDMA_WITH_IMM completion", 1);
    drop(side);
}
