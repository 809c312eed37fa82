//! (i), (j), (k), (m): credits, threads, pinned bytes and cached buffers: what
//! peers that take nothing or flood within their credits can make a server hold.

use super::malformed::eager;
use super::*;

/// (i) A peer that ignores its credits while the server's application takes
/// nothing. The server posts each receive slot again once it has copied the
/// message out, before the application takes it, so the device would accept
/// SEND after SEND; the credits are what bound the messages waiting. The peer is
/// cut off at the first message past them, and the application finds exactly the
/// credits' worth waiting, each intact.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_i_a_peer_past_its_credits_is_cut_off_while_nothing_is_taken() {
    const PAYLOAD: usize = 200; // over the in-place size: each takes a pool buffer
    let credits = Config::default().credits as u64;
    let log = Arc::new(Log::default());
    let server = Transport::with_logger(Config::default(), log.sink());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let dev = Device::open();
    let mut peer = RawPeer::connect(&dev, addr);
    let deadline = Instant::now() + STEP;
    let session = loop {
        if let Some(s) = server.sessions().pop() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server has no session");
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut arrived = 0;
    for _ in 0..3 * credits {
        let id = peer.take_id();
        let bytes = eager(&mut peer, id, PAYLOAD as u64, PAYLOAD);
        if peer.send_raw(&bytes) != ibv_wc_status::IBV_WC_SUCCESS {
            break;
        }
        arrived += 1;
    }
    let tag = format!("({})", peer.me());
    let line = log.wait_for("closing the attacker's session", |l| {
        l.contains(&tag) && l.contains(" closed: ")
    });
    assert!(
        line.contains("the peer sent more control messages than its credits"),
        "{line}"
    );
    assert!(peer.closed_by_server(), "the attacker's session left open");
    // The greeting took one credit, which the server owes until it sends.
    let allowed = credits - 1;
    assert!(
        arrived > allowed,
        "only {arrived} SENDs reached the server: the attack did not go past the credits"
    );
    let mut waiting = 0;
    while let Ok(Some(msg)) = server.recv(&session, Linger::NoWait) {
        assert_eq!(msg.bytes(), &[7u8; PAYLOAD][..], "message {waiting} intact");
        waiting += 1;
    }
    assert_eq!(waiting, allowed, "messages waiting for the application");
    server.unbind().unwrap();
}

/// (j) A peer that keeps its queue busy while keeping every rule: CREDIT messages
/// back to back, as many in flight as its credits allow, each credit it gets back
/// spent at once, so that the server's completion queue is seldom empty. A thread
/// that drained a queue until it found it empty was held for as long as the peer
/// went on: no other session's callback ran, and `unbind` waited for the peer.
/// Now a good client's round trips are answered during the flood, and `unbind`
/// returns while it still goes on.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_j_a_peer_that_keeps_its_queue_busy_holds_no_thread() {
    const ROUNDS: u64 = 20;
    const WAIT: Duration = Duration::from_secs(20);
    // Many credits: the peer may keep a whole send queue in flight, and the server
    // gives credits back only after a quarter of them.
    let server = Server::start(Config {
        credits: 1024,
        // Room in each session's floor for 1,024 held eager messages of 4 KiB.
        max_receiving_bytes_total: 2 << 30,
        ..Config::default()
    });
    let dev = Device::open();
    let mut peer = RawPeer::connect(&dev, server.addr);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, sent) = (stop.clone(), sent.clone());
        let until = Instant::now() + 3 * STEP;
        std::thread::spawn(move || {
            peer.flood(&stop, &sent, until);
            peer
        })
    };
    let flowing = |from: u64, what: &str| {
        let deadline = Instant::now() + STEP;
        while sent.load(Ordering::SeqCst) < from + 500 {
            assert!(Instant::now() < deadline, "the flood stalled {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    flowing(0, "before the good client");
    let client = Transport::new(Config::default());
    let s = client.connect(server.addr).expect("a good client connects");
    for seq in 0..ROUNDS {
        let payload = noise(seq, 64);
        let mut meta = b"ECHO".to_vec();
        meta.extend_from_slice(&seq.to_be_bytes());
        let msg = Message::new(payload.clone()).with_meta(&meta).unwrap();
        client.send(&s, msg, Linger::Timeout(WAIT)).unwrap();
        let reply = client
            .recv(&s, Linger::Timeout(WAIT))
            .unwrap()
            .unwrap_or_else(|| {
                panic!(
                    "no echo of round trip {seq} within {WAIT:?} while a peer kept its \
                     queue busy ({} CREDIT messages so far)",
                    sent.load(Ordering::SeqCst)
                )
            });
        assert_eq!(reply.meta()[..12], meta[..], "echo {seq} in order");
        assert_eq!(reply.bytes(), &payload[..], "echo {seq} intact");
    }
    client.disconnect(s).unwrap();
    // The round trips were served during the flood, not after it.
    let during = sent.load(Ordering::SeqCst);
    flowing(during, "after the good client");
    let unbound = Instant::now();
    let finished = std::thread::spawn(move || {
        server.transport.unbind().unwrap();
        Instant::now()
    });
    let deadline = Instant::now() + WAIT;
    while !finished.is_finished() {
        assert!(
            Instant::now() < deadline,
            "unbind did not return within {WAIT:?} while a peer kept its queue busy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let returned = finished.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    drop(flood.join().unwrap());
    eprintln!(
        "{} CREDIT messages; unbind took {:?}",
        sent.load(Ordering::SeqCst),
        returned.duration_since(unbound)
    );
}

/// (k) Many sessions cannot pin more than the transport allows: four clients each
/// send 1 MiB messages (16 each, 64 MiB asked for) to a server whose application
/// takes nothing, with each session's own budget (64 MiB) far above the
/// transport's (`max_receiving_bytes_total`, 8 MiB). Exactly 7 messages are held
/// (each session's floor keeps 128 KiB of its 1 MiB for the eager messages it may
/// hold, 32 credits of 4 KiB, so the 8 MiB hold 7.5 MiB of read messages);
/// every other send is refused as busy, the session staying open; the memory the
/// process pinned grows by far less than what was asked for. Once the application
/// takes a message, a send fits again.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_many_sessions_pin_no_more_than_the_transport_allows() {
    const TOTAL: u64 = 8 * MIB as u64;
    const CLIENTS: usize = 4;
    const EACH: usize = 16;
    let server = Transport::new(Config {
        max_receiving_bytes_total: TOTAL,
        // Half of TOTAL is the four sessions' floors of 1 MiB, half is shared;
        // a session holds 5 MiB at most, so messages are 1 MiB at most.
        max_sessions: CLIENTS,
        max_message: MIB as u64,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let pinned_before = pinned_bytes();
    let client = Transport::new(Config::default());
    let sessions: Vec<Session> = (0..CLIENTS)
        .map(|_| client.connect(addr).expect("a client connects"))
        .collect();
    let payload = noise(11, MIB);
    let (mut held, mut busy) = (0u64, 0u64);
    for _ in 0..EACH {
        for s in &sessions {
            match client.send(s, payload.clone(), Linger::Timeout(STEP)) {
                Ok(_) => held += 1,
                Err(e) if e.is_busy() => busy += 1,
                Err(e) => panic!("a send failed other than busy: {e}"),
            }
        }
    }
    // A session's first message takes its 896 KiB of floor and 128 KiB of the
    // shared 4 MiB; three more fit in what is shared.
    const HELD: u64 = 7;
    assert_eq!(held, HELD, "messages the server holds");
    assert_eq!(busy, (CLIENTS * EACH) as u64 - held, "refused as busy");
    assert_eq!(
        server.receiving_bytes(),
        HELD * MIB as u64,
        "bytes the server counts"
    );
    let grown = pinned_bytes().saturating_sub(pinned_before);
    eprintln!(
        "{held} held, {busy} refused; pinned grew by {} MiB",
        grown / MIB as u64
    );
    assert!(
        grown < 3 * TOTAL,
        "pinned memory grew by {grown} bytes for {} MiB asked",
        CLIENTS * EACH
    );
    for s in &sessions {
        assert!(s.closed().is_none(), "a refused sender's session closed");
    }
    // The application takes one message: its bytes leave the budget, and the next
    // send fits.
    let with_one = server
        .sessions()
        .into_iter()
        .find_map(|s| server.recv(&s, Linger::NoWait).unwrap().map(|m| (s, m)))
        .expect("a held message");
    assert_eq!(
        with_one.1.bytes(),
        &payload[..],
        "the held message is intact"
    );
    drop(with_one);
    assert_eq!(server.receiving_bytes(), (HELD - 1) * MIB as u64);
    client
        .send(&sessions[0], payload.clone(), Linger::Timeout(STEP))
        .expect("a send fits once a message was taken");
    for s in sessions {
        client.disconnect(s).unwrap();
    }
    server.unbind().unwrap();
}

/// (k) A read message is charged the buffer it pins, not its length: a peer that
/// sends 1-byte read messages (its `eager_threshold` at 0) to a server allowing
/// 64 KiB for all sessions gets 16 held (4 KiB each) and every other refused as
/// busy, its session open. Counted by length, all 32 would be held.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_tiny_read_messages_are_charged_what_they_pin() {
    const TOTAL: u64 = 64 << 10;
    let server = Transport::new(Config {
        max_receiving_bytes_total: TOTAL,
        // One session: its floor (half of TOTAL) and the shared half are all its;
        // eager messages of 128 bytes pin no pool buffer, so none of the floor is
        // kept for them.
        max_sessions: 1,
        max_message: TOTAL,
        eager_threshold: 128,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        eager_threshold: 0,
        ..Config::default()
    });
    let session = client.connect(addr).expect("the client connects");
    let (mut held, mut busy) = (0u64, 0u64);
    for i in 0..32u8 {
        match client.send(&session, vec![i], Linger::Timeout(STEP)) {
            Ok(_) => held += 1,
            Err(e) if e.is_busy() => busy += 1,
            Err(e) => panic!("a send failed other than busy: {e}"),
        }
    }
    assert_eq!((held, busy), (16, 16), "4 KiB charged per 1-byte message");
    assert_eq!(server.receiving_bytes(), TOTAL, "bytes the server counts");
    assert!(
        session.closed().is_none(),
        "a refused sender's session closed"
    );
    let s = server.sessions().pop().expect("the server's session");
    let first = server
        .recv(&s, Linger::NoWait)
        .unwrap()
        .expect("a held message");
    assert_eq!(first.bytes(), &[0u8][..], "the first message, intact");
    drop(first);
    assert_eq!(server.receiving_bytes(), TOTAL - 4096);
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

/// (k) A peer that holds all it may of the transport's shared receiving budget
/// does not keep another session from its floor: with 8 MiB for four sessions,
/// each session's floor is 1 MiB and 4 MiB are shared. The attacker's session,
/// whose application takes nothing, gets its floor and all that is shared (5
/// messages of 1 MiB), then is refused as busy; an honest session's message still
/// fits in its own floor.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_a_session_that_holds_the_shared_budget_leaves_others_their_floor() {
    const TOTAL: u64 = 8 * MIB as u64;
    let server = Transport::new(Config {
        max_receiving_bytes_total: TOTAL,
        max_sessions: 4,
        max_message: MIB as u64,
        // Eager messages of 128 bytes pin no pool buffer: the floors are all for
        // read messages.
        eager_threshold: 128,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let attacker = client.connect(addr).expect("the attacker connects");
    let payload = noise(17, MIB);
    let send = |s: &Session| client.send(s, payload.clone(), Linger::Timeout(STEP));
    let mut held = 0;
    loop {
        match send(&attacker) {
            Ok(_) => held += 1,
            Err(e) if e.is_busy() => break,
            Err(e) => panic!("a send failed other than busy: {e}"),
        }
        assert!(held <= 8, "the attacker was never refused");
    }
    assert_eq!(held, 5, "its floor and all that is shared");
    assert_eq!(server.receiving_bytes(), 5 * MIB as u64);
    let honest = client.connect(addr).expect("an honest client connects");
    send(&honest).expect("the honest message fits in its session's floor");
    let e = send(&honest)
        .err()
        .expect("beyond its floor, nothing is shared left");
    assert!(e.is_busy(), "{e}");
    assert!(attacker.closed().is_none() && honest.closed().is_none());
    client.disconnect(attacker).unwrap();
    client.disconnect(honest).unwrap();
    server.unbind().unwrap();
}

/// `n` sessions of `client` to `server` at `addr`, once the server has them all:
/// the client's handles and the server's.
fn connected(
    server: &Transport,
    client: &Transport,
    addr: SocketAddr,
    n: usize,
) -> (Vec<Session>, Vec<Session>) {
    let ours: Vec<Session> = (0..n)
        .map(|_| client.connect(addr).expect("a client connects"))
        .collect();
    let deadline = Instant::now() + STEP;
    while server.sessions().len() < n {
        assert!(
            Instant::now() < deadline,
            "the server never saw {n} sessions"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (ours, server.sessions())
}

/// (k) Peers that take nothing cannot make a transport hold more of its own read
/// messages than it allows for all sessions (`max_outstanding_bytes_total`, 8 MiB
/// here, against 64 MiB per session): four clients (8 credits each) never take
/// what the server sends them, so their credits stop coming back and the server's
/// 1 MiB messages queue. Sends beyond the 8 MiB fail with `Full`, the count never
/// passes it, and the sessions stay open. A send that waits for room gets it once
/// another session's client takes its messages, and the close gives every byte back.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_peers_that_take_nothing_hold_no_more_than_the_transport_sends() {
    const TOTAL: u64 = 8 * MIB as u64;
    let server = Transport::new(Config {
        max_outstanding_bytes_total: TOTAL,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        credits: 8,
        ..Config::default()
    });
    let (sessions, theirs) = connected(&server, &client, addr, 4);
    let deadline = Instant::now() + STEP;
    let payload = noise(13, MIB);
    // Send until every session has been refused for a while in a row: the clients'
    // credits are gone and the server holds what it may.
    let (mut sent, mut full, mut quiet_since) = (0u64, 0u64, None::<Instant>);
    while quiet_since.is_none_or(|t| t.elapsed() < Duration::from_secs(2)) {
        assert!(Instant::now() < deadline, "sent {sent}, refused {full}");
        let mut any = false;
        for s in &theirs {
            match server.send(s, payload.clone(), Linger::NoWait) {
                Ok(_) => (sent, any) = (sent + 1, true),
                Err(kiara_ib::Error::Full) => full += 1,
                Err(e) => panic!("a send failed other than full: {e}"),
            }
            let held = server.sending_bytes();
            assert!(held <= TOTAL, "the server holds {held} bytes of its own");
        }
        if any {
            quiet_since = None;
        } else {
            quiet_since.get_or_insert_with(Instant::now);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("{sent} sent, {full} refused as full");
    assert!(full > 0 && sent >= 8, "{sent} sent, {full} refused");
    assert!(
        server.sending_bytes() > TOTAL / 2,
        "the stuck messages count"
    );
    for s in &theirs {
        assert!(s.closed().is_none(), "a session closed");
    }
    std::thread::scope(|scope| {
        // Waits for room on the transport: the last session's own traffic is stuck,
        // so only the first's can free it.
        let waiter = scope.spawn(|| {
            server.send(
                &theirs[3],
                payload.clone(),
                Linger::Timeout(Duration::from_secs(10)),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiter.is_finished(), "the send waits for room");
        // The first client takes what it got: its credits come back, the server's
        // queued messages to it go out and complete, and their bytes come back.
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            while let Some(m) = client.recv(&sessions[0], Linger::NoWait).unwrap() {
                assert_eq!(m.bytes(), &payload[..], "intact");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Room came: the message went, or waits for the last client's credits.
        match waiter.join().unwrap() {
            Ok(_) | Err(kiara_ib::Error::Timeout(..)) => {}
            Err(e) => panic!("expected room on the transport: {e}"),
        }
    });
    for s in sessions {
        client.disconnect(s).unwrap();
    }
    let until = Instant::now() + STEP;
    while server.sending_bytes() > 0 {
        assert!(
            Instant::now() < until,
            "{} bytes still held",
            server.sending_bytes()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.unbind().unwrap();
}

/// (k) A peer that accepts no eager messages (its hello offers an eager limit of
/// 0) makes every message to it a read message: a 1-byte message sent from a
/// slice is copied into a 4 KiB pool buffer, and is charged those 4 KiB, not its
/// one byte, against `max_outstanding_bytes_total` (64 KiB here). The client
/// takes nothing, so after its 8 credits the server's messages queue: the count
/// stays a whole number of buffers within the total, and sends beyond it fail
/// with `Full` (charged a byte each, 256 would have queued per session).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_k_tiny_messages_to_a_peer_without_eager_are_charged_their_buffers() {
    const TOTAL: u64 = 64 * 1024;
    const BUFFER: u64 = 4096;
    let server = Transport::new(Config {
        max_outstanding_bytes_total: TOTAL,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        credits: 8,
        eager_threshold: 0,
        ..Config::default()
    });
    let (mut ours, mut theirs) = connected(&server, &client, addr, 1);
    let (session, theirs) = (ours.remove(0), theirs.remove(0));
    let deadline = Instant::now() + STEP;
    let (mut sent, mut quiet_since) = (0u64, None::<Instant>);
    while quiet_since.is_none_or(|t| t.elapsed() < Duration::from_secs(1)) {
        assert!(Instant::now() < deadline, "sent {sent}");
        match server.send(&theirs, &[sent as u8][..], Linger::NoWait) {
            Ok(_) => (sent, quiet_since) = (sent + 1, None),
            Err(kiara_ib::Error::Full) => {
                quiet_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("a send failed other than full: {e}"),
        }
        let held = server.sending_bytes();
        assert!(held <= TOTAL, "{held} bytes held after {sent} sends");
    }
    let held = server.sending_bytes();
    eprintln!("{sent} sent, {held} bytes held");
    assert_eq!(held % BUFFER, 0, "charged whole buffers: {held}");
    assert!(held > TOTAL / 2, "the queued messages count: {held}");
    assert!(
        sent <= 8 + TOTAL / BUFFER,
        "{sent} one-byte messages went: more than the credits and the total's buffers"
    );
    // The client takes them all, in order and intact; every byte comes back.
    let mut got = 0u64;
    while got < sent {
        assert!(Instant::now() < deadline, "took {got} of {sent}");
        match client.recv(&session, Linger::Timeout(Duration::from_secs(5))) {
            Ok(Some(m)) => {
                assert_eq!(m.bytes(), &[got as u8][..], "message {got}");
                got += 1;
            }
            Ok(None) => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    while server.sending_bytes() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still held",
            server.sending_bytes()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

/// (m) A peer that sends messages of every size class, one class after another,
/// leaves the server's registration cache no larger than `pool_keep_bytes` (4 MiB
/// here) for all classes together. It was a limit per class, at least two buffers
/// each, so sizes up to 16 MiB kept about 32 MiB registered for good, and with a
/// larger `max_message` gigabytes. Every message still arrives intact, those too
/// large to keep registered anew each time; the client's cache is bounded alike.
/// A cache that one size filled makes room for another: a steady stream of it
/// registers nothing after its first message.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_m_messages_of_every_size_keep_no_more_cached_than_the_pool_may() {
    const KEEP: usize = 4 * MIB;
    let config = Config {
        pool_keep_bytes: KEEP,
        ..Config::default()
    };
    let server = Transport::new(config.clone());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(config);
    let (mut ours, mut theirs) = connected(&server, &client, addr, 1);
    let (session, theirs) = (ours.remove(0), theirs.remove(0));
    // One message a class from 8 KiB to 16 MiB (each just over a power of two,
    // so that it takes the next class), twice over.
    let sizes: Vec<usize> = (12..24).map(|c| (1usize << c) + 1).collect();
    for round in 0..2u64 {
        for (i, &len) in sizes.iter().enumerate() {
            let payload = noise(round * 100 + i as u64, len);
            client
                .send(&session, payload.clone(), Linger::Block)
                .unwrap_or_else(|e| panic!("sending {len} bytes: {e}"));
            let got = server
                .recv(&theirs, Linger::Timeout(STEP))
                .unwrap_or_else(|e| panic!("receiving {len} bytes: {e}"))
                .unwrap_or_else(|| panic!("no message of {len} bytes"));
            assert_eq!(got.bytes(), &payload[..], "{len} bytes intact");
        }
    }
    // The buffers went back to the pools as the messages were taken and released.
    let settled = || {
        let until = Instant::now() + Duration::from_secs(5);
        while client.sending_bytes() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    settled();
    for (side, t) in [("server", &server), ("client", &client)] {
        let cached = t.pooled_bytes();
        eprintln!(
            "{side}: {cached} bytes in {} buffers cached",
            t.pooled_buffers()
        );
        assert!(cached <= KEEP, "the {side} caches {cached} bytes");
        assert!(
            cached > 0,
            "the {side} caches nothing: a steady size would register anew"
        );
    }
    // Two messages of 2 MiB buffers in flight at once fill both caches; a steady
    // stream of another size still registers nothing after its first message:
    // its buffer takes the room of one that the cache held.
    let big: Vec<Vec<u8>> = (0..2).map(|i| noise(300 + i, MIB + 1)).collect();
    for b in &big {
        client.send(&session, b.clone(), Linger::NoWait).unwrap();
    }
    // Both held at once, so that the second cannot reuse the first's buffer.
    let got: Vec<Message> = big
        .iter()
        .map(|b| {
            let got = server
                .recv(&theirs, Linger::Timeout(STEP))
                .unwrap()
                .unwrap();
            assert_eq!(got.bytes(), &b[..], "2 MiB buffer intact");
            got
        })
        .collect();
    drop(got);
    settled();
    assert_eq!(
        server.pooled_bytes(),
        KEEP,
        "the big buffers fill the cache"
    );
    let mut registered = (0, 0);
    for i in 0..20u64 {
        let payload = noise(400 + i, 5000);
        client
            .send(&session, payload.clone(), Linger::Block)
            .unwrap();
        let got = server
            .recv(&theirs, Linger::Timeout(STEP))
            .unwrap()
            .unwrap();
        assert_eq!(got.bytes(), &payload[..], "message {i} intact");
        drop(got);
        settled();
        let now = (server.registrations(), client.registrations());
        if i > 0 {
            assert_eq!(
                now, registered,
                "message {i} of a steady size registered memory"
            );
        }
        registered = now;
    }
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}
