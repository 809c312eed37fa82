//! (g), (l), (n): peers that never acknowledge, messages that cannot be read,
//! queue pairs that never speak; and a handshake finished after `unbind`.

use super::*;

/// (l) A peer that announces a read message and then stops answering READs: its
/// queue pair is destroyed while its bootstrap connection stays open, so its host
/// looks alive, and Soft-RoCE retries the server's READ for ever (retry count 7).
/// The message holds 1 MiB of the transport's budget meanwhile. The session closes
/// once the READ has taken `ack_timeout`, naming the message, and the budget comes
/// back.
///
/// The peer destroys its queue pair right after posting the descriptor, without
/// waiting for the SEND's completion. Soft-RoCE sends a user queue pair's SEND
/// inside `ibv_post_send` (Debian's 6.1 kernel), so the descriptor is in the
/// server's receive queue before the queue pair goes, and the server's READ nearly
/// always comes after it. When the READ wins all the same, the message is delivered
/// instead: the attempt checks that its bytes arrived intact, says so, and a fresh
/// peer tries again, three times at most.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_l_a_message_that_cannot_be_read_times_out() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    const ATTEMPTS: u64 = 3;
    let log = Arc::new(Log::default());
    let server = Transport::with_logger(
        Config {
            ack_timeout: TIMEOUT,
            ..Config::default()
        },
        log.sink(),
    );
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let dev = Device::open();
    for attempt in 1..=ATTEMPTS {
        let Unread::Closed(line, after) = announce_and_vanish(&server, &log, &dev, addr, attempt)
        else {
            eprintln!("attempt {attempt}: the READ finished first; the message arrived intact");
            continue;
        };
        eprintln!("attempt {attempt}, after {after:?}: {line}");
        assert!(
            line.contains("message 1 could not be read within 3s"),
            "{line}"
        );
        // Timed from the post, which the server's charge can only follow; its clock
        // starts at its first sweep after the charge (50 ms apart at most).
        assert!(
            after + Duration::from_millis(100) >= TIMEOUT,
            "closed before the timeout: {after:?}"
        );
        assert_eq!(server.receiving_bytes(), 0, "the budget came back");
        server.unbind().unwrap();
        return;
    }
    panic!("the server read the message before the queue pair went in all {ATTEMPTS} attempts");
}

/// What became of a message whose peer destroyed its queue pair as it announced it.
enum Unread {
    /// The session closed: the server's log line, and the time since the post.
    Closed(String, Duration),
    /// The server's READ finished first; the message arrived intact and was taken.
    Delivered,
}

/// A raw peer announces 1 MiB of noise (`seed`) in a real region, so that a READ
/// that comes before the queue pair goes is answered, not refused (which would
/// close the session at once); then it destroys its queue pair and keeps its
/// socket open until the session closed or the message was delivered.
fn announce_and_vanish(
    server: &Transport,
    log: &Log,
    dev: &Arc<Device>,
    addr: SocketAddr,
    seed: u64,
) -> Unread {
    let mut peer = RawPeer::connect(dev, addr);
    let me = peer.me();
    let mut region =
        MemoryRegion::new(&dev.pd, MIB, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let bytes = noise(seed, MIB);
    region.write_at(0, &bytes).unwrap();
    let h = Control {
        msg_id: peer.take_id(),
        len: MIB as u64,
        addr: region.addr(),
        rkey: region.rkey(),
        ..Control::default()
    };
    let tcp = peer.tcp.try_clone().unwrap();
    let posted = Instant::now();
    peer.post_control(Kind::Data, h, &[]);
    drop(peer);
    let deadline = Instant::now() + STEP;
    while server.receiving_bytes() != MIB as u64 {
        assert!(
            Instant::now() < deadline,
            "the descriptor was never charged (held {} bytes); the server logged {:#?}",
            server.receiving_bytes(),
            log.lines.lock()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let session = server.sessions().into_iter().find(|s| s.peer() == me);
    let session = session.expect("the charged peer's session is listed");
    let tag = format!("({me})");
    let closed = |l: &str| l.contains(&tag) && l.contains(" closed: ");
    loop {
        match server.recv(&session, Linger::NoWait) {
            Ok(Some(msg)) => {
                assert!(
                    msg.bytes() == bytes,
                    "the message that was read arrived changed"
                );
                drop(msg);
                await_budget_back(server);
                drop(tcp);
                return Unread::Delivered;
            }
            // The session closed; the line saying why comes just after.
            Err(_) => {
                let line = log.wait_for("the stuck read's close", closed);
                return Unread::Closed(line, posted.elapsed());
            }
            Ok(None) => {}
        }
        assert!(
            posted.elapsed() < STEP,
            "the stuck read neither closed its session nor delivered within {STEP:?}; the \
             server logged {:#?}",
            log.lines.lock()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the transport holds no peer's message any more.
fn await_budget_back(server: &Transport) {
    let deadline = Instant::now() + STEP;
    while server.receiving_bytes() != 0 {
        assert!(
            Instant::now() < deadline,
            "a taken message still held {} bytes",
            server.receiving_bytes()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// (g) A peer that never acknowledges: it asks for 48 messages of 1 MiB (and
/// returns every credit, so credits are not what stops the server), reads one as
/// granted, and acknowledges none. The server may hold at most
/// `max_outstanding_bytes` of them (4 MiB here): its other sends fail with
/// `Error::Full`, the attacker is announced no more than that, and the memory this
/// process has pinned grows by far less than the 48 MiB asked for. After
/// `ack_timeout` the server closes the session, naming the message; the windows go
/// with it (a READ with a key that was live fails).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_g_a_peer_that_never_acks_is_capped_and_cut_off() {
    const ASKED: u64 = 48;
    const CAP: u64 = 4 * MIB as u64;
    const ACK_TIMEOUT: Duration = Duration::from_secs(20);
    let config = Config {
        max_outstanding_bytes: CAP,
        ack_timeout: ACK_TIMEOUT,
        ..Config::default()
    };
    with_victims(config, Plant::Keep, |server, dev| {
        let mut peer = RawPeer::connect(dev, server.addr);
        let pinned_before = pinned_bytes();
        // No descriptor can have been posted before this.
        let asked_at = Instant::now();
        // The first bait is read as granted at once (the positive control), long
        // before the ACK timeout.
        let first = peer.request_bait(Mode::Pooled, MIB, 500);
        peer.read_granted(&first, "an unacknowledged bait");
        for tag in 1..ASKED {
            peer.ask_bait(Mode::Pooled, MIB, 500 + tag);
            // Whatever arrived, its credits go back at once.
            while peer.poll_once() {}
            peer.return_credits();
        }
        let mut accepted = Vec::new();
        for tag in 0..ASKED {
            match server.give(500 + tag) {
                Ok(handle) => accepted.push((tag, handle)),
                Err(e) => assert!(
                    e.contains("full") || e.contains("did not acknowledge"),
                    "bait {tag}: {e}"
                ),
            }
        }
        eprintln!(
            "{} of {ASKED} messages taken, {:?} after the first request",
            accepted.len(),
            asked_at.elapsed()
        );
        let pinned_growth = pinned_bytes().saturating_sub(pinned_before);
        eprintln!("pinned memory grew by {pinned_growth} bytes");
        assert!(
            !accepted.is_empty() && accepted.len() as u64 * MIB as u64 <= CAP,
            "VULNERABLE: the server took {} messages of 1 MiB for a peer that acknowledges \
             none (cap {CAP} bytes)",
            accepted.len()
        );
        assert!(
            pinned_growth < 24 * MIB as u64,
            "VULNERABLE: pinned memory grew by {pinned_growth} bytes while the peer \
             acknowledged nothing (cap {CAP})"
        );
        // Every accepted message is announced (its credits returned); nothing more is.
        let mut announced = vec![first];
        for (tag, _) in &accepted[1..] {
            announced.push(peer.bait_descriptor(500 + tag));
            peer.return_credits();
        }
        let total: u64 = announced.iter().map(|d| d.len).sum();
        assert!(
            total <= CAP,
            "{total} bytes announced over the cap of {CAP}"
        );
        let line = server.closed(peer.me(), "did not acknowledge message");
        let waited = asked_at.elapsed();
        eprintln!("after {waited:?}: server log: {line}");
        assert!(
            waited >= ACK_TIMEOUT,
            "cut off {waited:?} after the first request, before the ACK timeout of \
             {ACK_TIMEOUT:?}: {line}"
        );
        for (tag, handle) in accepted {
            let r = handle.wait(Some(STEP));
            assert!(
                r.is_err(),
                "bait {tag} finished although never acknowledged"
            );
        }
        assert!(peer.closed_by_server(), "the connection was left open");
        // Nothing was announced beyond the accepted messages.
        while peer.poll_once() {}
        let extra = peer.inbox.iter().filter(|m| m.kind == Kind::Data).count();
        assert_eq!(extra, 0, "descriptors beyond the accepted messages");
        // The window died with the session.
        let got = peer.read(announced[0].remote());
        assert_ne!(
            got.status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "VULNERABLE: a window outlived its session"
        );
        eprintln!(
            "a READ through a window of the closed session: {}",
            rdma_safe::cq::status_text(got.status)
        );
    });
}

/// (p) A peer that grants credits and posts no receives for them: the server's
/// answer to its message meets an empty receive queue, and the device retries it
/// for ever (RNR, retry count 7). The server closes the session once none of its
/// SENDs completed for `ack_timeout`, naming why, and the good clients are served
/// throughout. (Before, the session stayed open with the SEND retried, for as
/// long as the peer's connection lived.)
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_p_a_peer_that_posts_no_receives_is_cut_off() {
    const TIMEOUT: Duration = Duration::from_secs(4);
    let config = Config {
        ack_timeout: TIMEOUT,
        ..Config::default()
    };
    with_victims(config, Plant::Later, |server, dev| {
        let mut peer = RawPeer::connect_without_receives(dev, server.addr);
        let id = peer.take_id();
        let h = Control {
            msg_id: id,
            ..Control::default()
        };
        peer.send_control(Kind::Eager, h, b"DROP", &[]);
        let sent = Instant::now();
        let line = server.closed(peer.me(), "did not take a control message of ours");
        let waited = sent.elapsed();
        eprintln!("after {waited:?}: server log: {line}");
        // The server stamps its SEND a little before `sent` (its post comes
        // before our return from the message's completion).
        assert!(
            waited + Duration::from_millis(100) >= TIMEOUT
                && waited < TIMEOUT + Duration::from_secs(5),
            "cut off {waited:?} after the message, with ack_timeout {TIMEOUT:?}: {line}"
        );
        assert!(line.contains(&format!("within {TIMEOUT:?}")), "{line}");
        assert!(peer.closed_by_server(), "the connection was left open");
    });
}

/// Issue 13, 5(a): a handshake that finishes after the transport shut down (`unbind`
/// does not wait for handshakes) leaves no session behind: the server refuses it
/// with the reason, closes the bootstrap connection, and its queue pair is gone
/// before the buffers its receives were posted into. A SEND to that queue pair finds
/// no one (transport retries exhausted): never a success into a session nobody
/// serves, and never a remote error from a receive into freed memory.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_handshake_finished_after_unbind_leaves_no_queue_pair_behind() {
    let dev = Device::open();
    let log = Arc::new(Log::default());
    let server = Transport::with_logger(Config::default(), log.sink());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let mut unbound = None;
    // The server has created its queue pair and posted its receives (its hello came),
    // and waits for our ready byte when it is unbound.
    let mut peer = RawPeer::handshake(&dev, addr, |_| {}, |_| unbound = Some(server.unbind()))
        .unwrap_or_else(|me| panic!("the server dropped {me} before the ready bytes"));
    unbound
        .expect("unbind ran")
        .expect("unbind with a handshake in progress");
    let me = peer.me();
    let line = log.wait_for(&format!("refusing {me}"), |l| {
        l.contains(&format!("connection from {me} refused"))
    });
    assert!(
        line.contains("shut down"),
        "the refusal names the shutdown: {line}"
    );
    assert!(
        peer.closed_by_server(),
        "the server closed the bootstrap connection"
    );
    assert!(server.sessions().is_empty(), "no session: {server:?}");
    let started = Instant::now();
    let status = peer.send_raw(&[0u8; CONTROL_HEADER_LEN]);
    assert_eq!(
        status,
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
        "a SEND to the refused session's queue pair must find no queue pair \
         (after {:?})",
        started.elapsed()
    );
}

/// Clients that finish the TCP handshake but whose queue pairs never speak (an
/// attacker holding sessions with nothing but TCP connections) are closed once the
/// handshake's `timeout` has passed without their greeting, and their session
/// places are free again; a client that greeted keeps its session.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_n_sessions_whose_queue_pairs_never_speak_are_closed() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let server = Server::start(Config {
        timeout: TIMEOUT,
        max_sessions: 3,
        ..Config::default()
    });
    let dev = Device::open();
    let mut greeted = RawPeer::connect(&dev, server.addr);
    // Made first: the refused connect below must come before the first silent
    // session's timeout.
    let client = Transport::new(Config::default());
    let start = Instant::now();
    let mut silent: Vec<RawPeer> = (0..2)
        .map(|_| RawPeer::handshake(&dev, server.addr, |_| {}, |_| {}).expect("handshake"))
        .collect();
    let handshaken = Instant::now();
    // They hold every place meanwhile.
    let refused = client.connect(server.addr);
    assert!(refused.is_err(), "a fourth session was accepted");

    for peer in &mut silent {
        let line = server.closed(peer.me(), "did not answer over RDMA within 3s");
        assert!(
            peer.closed_by_server(),
            "{line}: bootstrap connection left open"
        );
    }
    let took = start.elapsed();
    let since = handshaken.elapsed();
    // The ceiling leaves a slow guest room to see the close; without the timeout
    // these sessions would stay open for good (their sockets do).
    assert!(
        took >= TIMEOUT && since < TIMEOUT + Duration::from_secs(5),
        "closed {took:?} after the first handshake, {since:?} after the last: not at \
         the timeout"
    );

    // The places are free: a client connects and is served.
    let s = client
        .connect(server.addr)
        .expect("a client connects after them");
    let msg = Message::new(noise(1, 100))
        .with_meta(b"ECHO\0\0\0\0\0\0\0\x01")
        .unwrap();
    client.send(&s, msg, Linger::Timeout(STEP)).unwrap();
    let reply = client
        .recv(&s, Linger::Timeout(STEP))
        .unwrap()
        .expect("echo");
    assert_eq!(
        reply.bytes(),
        &noise(1, 100)[..],
        "the echo came back intact"
    );
    // The client that greeted still has its session, past the deadline.
    greeted.send_control(Kind::Credit, Control::default(), &[], &[]);
    assert!(
        !server
            .log
            .lines
            .lock()
            .iter()
            .any(|l| l.contains(&format!("({})", greeted.me()))),
        "the session that greeted was closed"
    );
    client.disconnect(s).unwrap();
    drop(greeted);
    server.finish();
}
