//! Hostile peers (malformed control messages, a dripped or silent handshake)
//! are cut off while everyone else is served.

use super::*;

/// A peer that speaks the bootstrap correctly and then sends whatever it is told.
struct Hostile {
    tcp: TcpStream,
    qp: QueuePair<rdma_safe::qp::Rts>,
    cq: Arc<CompletionQueue>,
    mr: MemoryRegion,
}

impl Hostile {
    /// Connects; `tweak` may spoil the hello. `None` if the server refused it.
    fn connect(addr: SocketAddr, tweak: impl FnOnce(&mut [u8])) -> Option<Hostile> {
        let dev = Device::open();
        let (gid, gid_index) = (dev.gid, dev.gid_index);
        let (cq, qp) = dev.rc_qp_in_init();
        let mr = MemoryRegion::new(&dev.pd, 65536, Access::ALL_REMOTE).unwrap();
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = Hello {
            qpn: qp.qp_num(),
            psn: 7,
            lid: 0,
            mtu: 3,
            gid: Some(gid.0),
            credits: 8,
            slot_size: 4200,
            max_message: 16 * MIB as u64,
            eager_threshold: 4096,
        }
        .encode();
        tweak(&mut hello);
        tcp.write_all(&hello).unwrap();
        let mut header = [0u8; HELLO_HEADER_LEN];
        tcp.read_exact(&mut header).ok()?;
        let len = Hello::decode_header(&header).unwrap();
        let mut body = vec![0u8; len];
        tcp.read_exact(&mut body).ok()?;
        let theirs = Hello::decode_body(&body).unwrap();
        let mut rtr = RtrAttr::new(theirs.endpoint(), rdma_safe::sys::ibv_mtu::IBV_MTU_1024);
        rtr.sgid_index = gid_index as u8;
        let qp = qp.to_rtr(&rtr).unwrap().to_rts(&RtsAttr::new(7)).unwrap();
        // A server that refused the hello may already have reset the connection.
        tcp.write_all(b"R").ok()?;
        let mut ready = [0u8; 1];
        tcp.read_exact(&mut ready).ok()?;
        Some(Hostile { tcp, qp, cq, mr })
    }

    /// SENDs `bytes` as a control message and waits for the local completion.
    fn send(&mut self, bytes: &[u8]) {
        self.mr.write_at(0, bytes).unwrap();
        let mut sge = [self.mr.local(0..bytes.len()).unwrap()];
        let mut wr = SendWr::send(1, &mut sge).signaled();
        // SAFETY: the region outlives the completion polled below.
        unsafe { self.qp.post_send(&mut wr) }.unwrap();
        let mut wcs = [WorkCompletion::default(); 4];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(wc) = self.cq.poll(&mut wcs).unwrap().first() {
                wc.result().unwrap();
                return;
            }
            assert!(Instant::now() < deadline);
        }
    }

    /// True once the server closed the bootstrap connection.
    fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.tcp.read(&mut b), Ok(0) | Err(_))
    }
}

fn control(kind: Kind, h: Control) -> Vec<u8> {
    let mut v = vec![0u8; CONTROL_HEADER_LEN];
    h.write_header(kind, &mut v);
    v
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_peers_are_cut_off_and_everyone_else_is_served() {
    let (server, addr, delivered) = checksum_server(Config::default());
    let (logged, log) = logged_server(Config {
        max_message: MIB as u64,
        ..Config::default()
    });
    logged
        .register_callback(|_, _, _| panic!("a hostile message was delivered"))
        .unwrap();
    let hostile_addr = logged.bind((server_ip().as_str(), 0)).unwrap();
    for (what, bytes, reason) in hostile_messages() {
        hostile_is_cut_off(hostile_addr, &log, what, &bytes, reason);
    }
    // A protocol version the server does not speak: refused at the hello.
    assert!(Hostile::connect(hostile_addr, |b| b[5] = 9).is_none());
    wait_log(&log, "protocol version mismatch: the peer speaks version 9");
    assert!(logged.sessions().is_empty(), "hostile sessions released");

    // Meanwhile both servers go on serving honest clients.
    honest_clients_are_served(addr, hostile_addr);
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
    server.unbind().unwrap();
    logged.unbind().unwrap();
}

/// The hostile peers' messages: what each is, its bytes, and the reason the server
/// must log.
fn hostile_messages() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    vec![
        (
            "unknown type",
            {
                let mut m = control(Kind::Credit, Control::default());
                m[0] = 42;
                m
            },
            "unknown control message type 42",
        ),
        ("truncated", vec![2, 0, 0], "truncated"),
        (
            "over the limit",
            control(
                Kind::Data,
                Control {
                    msg_id: 1,
                    len: 2 * MIB as u64,
                    addr: 0x1000,
                    rkey: 1,
                    ..Default::default()
                },
            ),
            "exceeds the limit",
        ),
        (
            "out of range",
            control(
                Kind::Data,
                Control {
                    msg_id: 1,
                    len: 4096,
                    addr: u64::MAX - 100,
                    rkey: 1,
                    ..Default::default()
                },
            ),
            "wraps around",
        ),
        (
            "ack of nothing",
            control(
                Kind::Ack,
                Control {
                    msg_id: 999,
                    ..Default::default()
                },
            ),
            "acknowledgement of message 999, which is not in flight",
        ),
        (
            "message id not above the last one",
            control(Kind::Eager, Control::default()),
            "message id 0 repeats or goes backwards",
        ),
        (
            "bad descriptor key",
            control(
                Kind::Data,
                Control {
                    msg_id: 5,
                    len: 4096,
                    addr: 0x10_0000,
                    rkey: 0xdead,
                    ..Default::default()
                },
            ),
            "RDMA failed",
        ),
    ]
}

/// A hostile peer sends `bytes`: the server logs `reason` and closes the connection.
fn hostile_is_cut_off(
    hostile_addr: SocketAddr,
    log: &Mutex<Vec<String>>,
    what: &str,
    bytes: &[u8],
    reason: &str,
) {
    let mut h = Hostile::connect(hostile_addr, |_| {}).expect("handshake");
    h.send(bytes);
    let line = wait_log(log, reason);
    assert!(line.contains("closed"), "{what}: {line}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.closed_by_server() {
        assert!(Instant::now() < deadline, "{what}: connection left open");
    }
}

/// An honest client of each server is served (the checksum server answers).
fn honest_clients_are_served(addr: SocketAddr, hostile_addr: SocketAddr) {
    for target in [addr, hostile_addr] {
        let client = Transport::new(Config::default());
        let s = client.connect(target).unwrap();
        if target == addr {
            let msg = Message::new(vec![9u8; 300_000])
                .with_meta(&0u64.to_be_bytes())
                .unwrap();
            client.send(&s, msg, Linger::Block).unwrap();
            let reply = client_recv(&client, &s);
            assert_eq!(reply.meta()[8..16], checksum(&[9u8; 300_000]).to_be_bytes());
        }
        client.disconnect(s).unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_dripping_or_silent_client_is_cut_off_at_the_handshake_deadline() {
    // The whole handshake gets `timeout`, however the client paces its bytes.
    const TIMEOUT: Duration = Duration::from_secs(1);
    const SLACK: Duration = Duration::from_secs(3);
    let (server, log) = logged_server(Config {
        timeout: TIMEOUT,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    // A valid hello: sent a byte every 100 ms, it would take 6 s.
    let hello = some_hello();
    for (what, drip) in [("dripping", true), ("silent", false)] {
        let start = Instant::now();
        let mut tcp = TcpStream::connect(addr).unwrap();
        let me = tcp.local_addr().unwrap();
        let mut writer = tcp.try_clone().unwrap();
        let client = std::thread::spawn(move || {
            for byte in hello.iter().take(if drip { hello.len() } else { 0 }) {
                // Once the server gave up, writes fail: stop there.
                if writer.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let line = wait_log(&log, &format!("connection from {me} refused"));
        let took = start.elapsed();
        assert!(line.contains("the peer was too slow"), "{what}: {line}");
        assert!(line.contains("1s allowed"), "{what}: {line}");
        assert!(took < TIMEOUT + SLACK, "{what}: cut off after {took:?}");
        // The server closed the connection (after its own hello).
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        let closed = tcp.read_to_end(&mut rest);
        assert!(
            closed.is_ok()
                || closed
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{what}: connection left open: {closed:?}"
        );
        client.join().unwrap();
    }
    assert!(server.sessions().is_empty());
    // An honest client is still served.
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}

/// A logger that panics (as `eprintln!` does where standard error is a closed
/// pipe) loses its lines and nothing else, though a peer chooses when lines
/// come: garbage makes a handshake log its refusal, and a peer that leaves
/// without a word makes the poller log its session's close once it sees the
/// connection gone. With `max_sessions` 1, two such peers in turn are each seen
/// gone only if the poller, having logged the first close, is still there; then
/// an honest client is served.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_logger_that_panics_stops_neither_the_handshakes_nor_the_poller() {
    let lines = Arc::new(AtomicUsize::new(0));
    let counted = lines.clone();
    let server = Transport::with_logger(
        Config {
            max_sessions: 1,
            ..Config::default()
        },
        Arc::new(move |_: &str| {
            counted.fetch_add(1, Ordering::SeqCst);
            panic!("the test's logger cannot write");
        }),
    );
    server.register_callback(echo).unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(&[0xee; 64]).unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = Vec::new();
    let _ = garbage.read_to_end(&mut sink);
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for i in 0..2 {
        let before = lines.load(Ordering::SeqCst);
        let peer = Hostile::connect(addr, |_| {}).expect("the server's one place");
        wait("a session was not accepted", &|| {
            server.sessions().len() == 1
        });
        drop(peer);
        wait(
            &format!(
                "peer {i} left 10 s ago, and the server has not closed and logged its session"
            ),
            &|| server.sessions().is_empty() && lines.load(Ordering::SeqCst) > before,
        );
    }
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    let bytes = vec![7u8; 5000];
    client
        .send(&s, Message::new(bytes.clone()), Linger::Block)
        .unwrap();
    assert_eq!(client_recv(&client, &s).bytes(), &bytes[..]);
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}
