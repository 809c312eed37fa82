//! Sessions: one address's share, a session woken by its completions right
//! after `connect`, a server whose queue pair never answers, a message over
//! the peer's limit, and `max_sessions`.

use super::*;

/// With `max_sessions_per_address`, one address holds at most that many sessions
/// and handshakes: its next connection is refused with the reason, while a client
/// from another address (here the loopback one) is served, and a session that
/// ends makes room again.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn o_one_address_holds_at_most_its_share_of_sessions() {
    const CAP: usize = 2;
    let (server, log, delivered) = checksum_server(Config {
        max_sessions_per_address: CAP,
        ..Config::default()
    });
    let port = server.bind(("0.0.0.0", 0)).unwrap().port();
    let ip: std::net::IpAddr = server_ip().parse().unwrap();
    let here = SocketAddr::new(ip, port);
    let loopback = SocketAddr::from(([127, 0, 0, 1], port));
    let client = Transport::new(Config::default());
    let mut held: Vec<_> = (0..CAP).map(|_| client.connect(here).unwrap()).collect();
    // A silent connection from the same address: refused at once, not held.
    let mut third = TcpStream::connect(here).unwrap();
    let sent = closed_by_server(&mut third, Duration::from_secs(5), "over the cap");
    assert!(sent.is_empty(), "the server wrote to a refused connection");
    let line = wait_line(&log, &third.local_addr().unwrap());
    // At least CAP (a session whose handshake just ended may count twice for a
    // moment, as a session and as a handshake).
    let counted: usize = line
        .split("refused: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        counted >= CAP
            && line.contains(&format!("sessions and handshakes from {ip}"))
            && line.contains("Config::max_sessions_per_address"),
        "{line}"
    );
    assert!(
        client.connect(here).is_err(),
        "a third session from one address"
    );
    // Another address is served.
    let other = client
        .connect(loopback)
        .expect("a client from another address");
    let msg = Message::new(vec![5u8; 100]).with_meta(&[1; 8]).unwrap();
    client.send(&other, msg, Linger::Block).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.load(Ordering::SeqCst) < 1 {
        assert!(
            Instant::now() < deadline,
            "the other address was not served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A session that ends makes room for its address.
    client.disconnect(held.pop().unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match client.connect(here) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "no room after a disconnect: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for s in held.into_iter().chain([other, again]) {
        client.disconnect(s).unwrap();
    }
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// The first log line about a connection from `local`, waiting up to 5 s for it.
fn wait_line(log: &Mutex<Vec<String>>, local: &SocketAddr) -> String {
    wait_lines(log, std::slice::from_ref(local), Duration::from_secs(5));
    line_about(&log.lock(), *local).unwrap()
}

/// A session that has just connected, whose waits do not spin (`busy_poll` 0),
/// is woken by its completions: round trips take about a millisecond each in the
/// guest. (The poller used to read the event of a session that joined after its
/// last look without clearing the session's mark of being armed, so its queue was
/// never armed again and only the poller's sweeps, every 50 ms, reaped it; the
/// wait for the greeting made that the case of nearly every such session.)
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn m_a_session_that_just_connected_is_woken_by_its_completions() {
    const ROUND_TRIPS: u64 = 40;
    let (server, _log, delivered) = checksum_server(Config::default());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        busy_poll: Duration::ZERO,
        ..Config::default()
    });
    let s = client.connect(addr).unwrap();
    let mut times: Vec<Duration> = (0..ROUND_TRIPS)
        .map(|i| {
            let start = Instant::now();
            let msg = Message::new(vec![i as u8; 64])
                .with_meta(&i.to_be_bytes())
                .unwrap();
            client.send(&s, msg, Linger::NoWait).unwrap();
            let reply = client
                .recv(&s, Linger::Timeout(Duration::from_secs(5)))
                .unwrap()
                .expect("the echo");
            assert_eq!(reply.meta()[..8], i.to_be_bytes(), "echo {i}");
            start.elapsed()
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    eprintln!("{ROUND_TRIPS} round trips right after connect, not spinning: median {median:?}");
    // Reaped only by sweeps, nearly every one waits for one (up to 50 ms; 45 ms
    // typical in the guest): the median tells, whatever a few slow ones do.
    assert!(
        median < Duration::from_millis(10),
        "round trips took {median:?} (median): the session's completions woke no one"
    );
    assert_eq!(delivered.load(Ordering::SeqCst), ROUND_TRIPS as usize);
    client.disconnect(s).unwrap();
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// A server whose queue pair never takes anything (it posts no receive, so every
/// SEND is refused as not ready, and retried for ever): `connect` fails once
/// `timeout` has passed, with the reason, instead of returning a session whose
/// sends would wait for ever.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn l_connect_fails_when_the_servers_queue_pair_never_answers() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let listener = TcpListener::bind((server_ip().as_str(), 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut header = [0u8; HELLO_HEADER_LEN];
        tcp.read_exact(&mut header).expect("the client's hello");
        let mut body = vec![0u8; Hello::decode_header(&header).unwrap()];
        tcp.read_exact(&mut body).unwrap();
        let theirs = Hello::decode_body(&body).unwrap();
        let silent = NeverReady::queue_pair();
        tcp.write_all(&silent.hello.encode()).unwrap();
        let mut ready = [0u8; 1];
        tcp.read_exact(&mut ready).expect("the client's ready byte");
        let silent = silent.receiving_nothing(&theirs);
        tcp.write_all(b"R").unwrap();
        // Until the client gives up and closes its bootstrap connection.
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        drop(silent);
    });
    let client = Transport::new(Config {
        timeout: TIMEOUT,
        ..Config::default()
    });
    let start = Instant::now();
    match client.connect(addr) {
        Err(Error::Closed(CloseReason::Silent { after })) => assert_eq!(after, TIMEOUT),
        Err(e) => panic!("connect failed for another reason: {e}"),
        Ok(_) => panic!("connect returned a session whose server never answered"),
    }
    let took = start.elapsed();
    assert!(
        took >= TIMEOUT && took < TIMEOUT + Duration::from_secs(3),
        "connect gave up after {took:?}"
    );
    fake.join()
        .expect("the client closed its bootstrap connection");
    wait_no_sessions(&client);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_message_over_the_peers_limit_fails_locally_and_the_session_lives() {
    let (server, _log, delivered) = checksum_server(Config {
        max_message: 64 * KIB as u64,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    match client.send(&s, vec![1u8; 64 * KIB + 1], Linger::Block) {
        Err(Error::Usage(text)) => assert!(text.contains("65536"), "{text}"),
        other => panic!("a message over the server's limit: {:?}", other.map(|_| ())),
    }
    assert!(
        s.closed().is_none(),
        "the session was closed: {:?}",
        s.closed()
    );
    let bytes = vec![2u8; 64 * KIB];
    let msg = Message::new(bytes.clone())
        .with_meta(&0u64.to_be_bytes())
        .unwrap();
    client.send(&s, msg, Linger::Block).unwrap();
    let reply = client
        .recv(&s, Linger::Timeout(Duration::from_secs(10)))
        .unwrap()
        .expect("a reply");
    assert_eq!(reply.meta()[8..16], checksum(&bytes).to_be_bytes());
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn max_sessions_refuses_the_next_client_with_the_reason() {
    let (server, log, _) = checksum_server(Config {
        max_sessions: 2,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let a = client.connect(addr).unwrap();
    let b = client.connect(addr).unwrap();
    assert!(
        client.connect(addr).is_err(),
        "a third session was accepted"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log
        .lock()
        .iter()
        .any(|l| l.contains("refused: max_sessions (2) reached"))
    {
        assert!(Instant::now() < deadline, "{:?}", log.lock());
        std::thread::sleep(Duration::from_millis(20));
    }
    // A session that ends makes room.
    client.disconnect(a).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match client.connect(addr) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no room after a disconnect: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The cap holds on the connecting side too.
    let capped = Transport::new(Config {
        max_sessions: 1,
        ..Config::default()
    });
    let only = capped.connect(addr);
    assert!(only.is_err(), "the server had room for a third session");
    client.disconnect(b).unwrap();
    client.disconnect(c).unwrap();
    wait_no_sessions(&server);
    let first = capped.connect(addr).unwrap();
    match capped.connect(addr) {
        Err(Error::Usage(text)) => assert!(text.contains("max_sessions (1) reached"), "{text}"),
        other => panic!(
            "a second session past max_sessions 1: {:?}",
            other.map(|_| ())
        ),
    }
    capped.disconnect(first).unwrap();
    server.unbind().unwrap();
}
