//! Nothing lost, duplicated, reordered or corrupted: 16 clients and sizes from 0
//! to 8 MiB, 64 sessions at once, a slow receiver, registered regions sent
//! without a copy, and a steady stream that registers nothing.

use super::*;

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn sixteen_clients_lose_duplicate_reorder_and_corrupt_nothing() {
    clients_lose_nothing(16, 100, Config::default());
}

/// The same with a server whose acknowledgements invalidate the clients' windows
/// (SEND_WITH_INV; on Soft-RoCE the default is a plain SEND): the clients take
/// each acknowledgement's invalidation as their window's, and nothing is lost.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn invalidating_acknowledgements_lose_nothing_either() {
    let config = Config {
        invalidating_acks: Some(true),
        ..Config::default()
    };
    clients_lose_nothing(4, 100, config);
}

/// `CLIENTS` clients each send `MESSAGES` messages of every size class to a
/// checksum server built with `server_config`, and check every reply.
fn clients_lose_nothing(clients: usize, messages: usize, server_config: Config) {
    const WINDOW: usize = 8;
    let (server, addr, delivered) = checksum_server(server_config);
    // One pseudo-random source buffer; messages are slices of it at varying offsets.
    let source: Arc<Vec<u8>> = Arc::new(
        (0..9 * MIB as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
    );
    let client = Transport::new(Config::default());
    std::thread::scope(|s| {
        for c in 0..clients {
            let (client, source) = (&client, source.clone());
            s.spawn(move || {
                let session = client.connect(addr).expect("connect");
                let plan = sizes(c as u64 + 1, messages);
                let sums: Vec<u64> = plan
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| checksum(&source[i * 997 % MIB..][..len]))
                    .collect();
                // Replies are read on another thread while sends are pipelined.
                std::thread::scope(|inner| {
                    let receiver = inner.spawn(|| {
                        for (i, want) in sums.iter().enumerate() {
                            let reply = client_recv(client, &session);
                            let seq = u64::from_be_bytes(reply.meta()[..8].try_into().unwrap());
                            let sum = u64::from_be_bytes(reply.meta()[8..16].try_into().unwrap());
                            assert_eq!(seq, i as u64, "client {c}: reply out of order");
                            assert_eq!(sum, *want, "client {c} message {i}: corrupted");
                        }
                    });
                    let mut handles = std::collections::VecDeque::new();
                    for (i, &len) in plan.iter().enumerate() {
                        if handles.len() == WINDOW {
                            let h: kiara_ib::SendHandle = handles.pop_front().unwrap();
                            h.wait(Some(Duration::from_secs(120)))
                                .expect("send completes");
                        }
                        let msg = Message::new(source[i * 997 % MIB..][..len].to_vec())
                            .with_meta(&(i as u64).to_be_bytes())
                            .unwrap();
                        handles
                            .push_back(client.send(&session, msg, Linger::NoWait).expect("send"));
                    }
                    for h in handles {
                        h.wait(Some(Duration::from_secs(120)))
                            .expect("send completes");
                    }
                    receiver.join().expect("all replies verified");
                });
                client.disconnect(session).unwrap();
            });
        }
    });
    assert_eq!(delivered.load(Ordering::SeqCst), clients * messages);
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn one_server_serves_64_sessions_at_once() {
    let (server, addr, delivered) = checksum_server(Config::default());
    let client = Transport::new(Config::default());
    let sessions: Vec<Session> = (0..64)
        .map(|_| client.connect(addr).expect("connect"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.sessions().len() < 64 {
        assert!(
            Instant::now() < deadline,
            "server has {} sessions",
            server.sessions().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every session at once: two messages each, one eager, one read.
    let mut handles = Vec::new();
    for s in &sessions {
        for (seq, len) in [(0u64, 100usize), (1, 100_000)] {
            let msg = Message::new(vec![seq as u8 + 1; len])
                .with_meta(&seq.to_be_bytes())
                .unwrap();
            handles.push(client.send(s, msg, Linger::NoWait).unwrap());
        }
    }
    for h in handles {
        h.wait(Some(Duration::from_secs(60))).unwrap();
    }
    for s in &sessions {
        for (seq, len) in [(0u64, 100usize), (1, 100_000)] {
            let reply = client_recv(&client, s);
            assert_eq!(reply.meta()[..8], seq.to_be_bytes());
            assert_eq!(
                reply.meta()[8..16],
                checksum(&vec![seq as u8 + 1; len]).to_be_bytes()
            );
        }
    }
    assert_eq!(delivered.load(Ordering::SeqCst), 128);
    client.set_session("first", &sessions[0]);
    assert_eq!(client.session("first").as_ref(), Some(&sessions[0]));
    for s in sessions {
        client.disconnect(s).unwrap();
    }
    server.unbind().unwrap();
    assert!(server.sessions().is_empty());
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_slow_receiver_slows_the_sender_and_loses_nothing() {
    // The callback takes 20 ms per message; 200 messages are sent without waiting.
    // Credits (8 here) hold the sender back; every message still arrives, in order.
    let server = Transport::new(Config {
        credits: 8,
        ..Config::default()
    });
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    server
        .register_callback(move |msg, _, _| {
            std::thread::sleep(Duration::from_millis(20));
            sink.lock()
                .push(u64::from_be_bytes(msg.meta()[..8].try_into().unwrap()));
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let rnr_before = rnr_naks();
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();
    let handles: Vec<_> = (0..200u64)
        .map(|i| {
            let size = if i % 3 == 0 { 20_000 } else { 100 };
            let msg = Message::new(vec![i as u8; size])
                .with_meta(&i.to_be_bytes())
                .unwrap();
            client.send(&s, msg, Linger::NoWait).unwrap()
        })
        .collect();
    // Soon after, the sender is still held back: most sends are not done yet.
    std::thread::sleep(Duration::from_millis(200));
    let done_early = handles.iter().filter(|h| h.is_done()).count();
    assert!(
        done_early < 100,
        "{done_early} of 200 done while the receiver is slow"
    );
    for h in &handles {
        h.wait(Some(Duration::from_secs(60))).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.lock().len() < 200 {
        assert!(
            Instant::now() < deadline,
            "only {} delivered",
            got.lock().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(*got.lock(), (0..200).collect::<Vec<u64>>());
    assert_eq!(
        rnr_naks(),
        rnr_before,
        "a SEND found no posted receive: a credit went back too early"
    );
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_registered_region_is_sent_without_copying_and_configuration_round_trips() {
    let (server, addr, delivered) = checksum_server(Config::default());
    let client = Transport::new(Config::default());
    let mut config = client.configuration();
    config.eager_threshold = 1024;
    client.set_configuration(config.clone()).unwrap();
    assert_eq!(client.configuration(), config);
    client.set_context(Arc::new(String::from("user data")));
    let ctx = client.context().unwrap();
    assert_eq!(ctx.downcast_ref::<String>().unwrap(), "user data");

    let session = client.connect(addr).unwrap();
    assert!(
        client.set_configuration(Config::default()).is_err(),
        "configuration is fixed once connected"
    );
    let mut region = client.register(3 * MIB).unwrap();
    for (i, b) in region.as_mut_slice().unwrap().iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let region = Arc::new(region);
    let msg = Message::from_region(region.clone(), MIB..3 * MIB)
        .unwrap()
        .with_meta(&0u64.to_be_bytes())
        .unwrap();
    client.send(&session, msg, Linger::Block).unwrap();
    let reply = client_recv(&client, &session);
    assert_eq!(
        reply.meta()[8..16],
        checksum(&region.as_slice().unwrap()[MIB..3 * MIB]).to_be_bytes()
    );
    assert_eq!(
        Arc::strong_count(&region),
        1,
        "the region was released after the ack"
    );
    assert!(Message::from_region(region, 0..4 * MIB).is_err());
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_zero_length_message_of_a_registered_region_is_delivered_both_ways() {
    // Issue 13, 5(b): an empty slice of a registered region travels (eager: a read
    // needs at least one byte) and is delivered; the session goes on.
    let server = Transport::new(Config::default());
    let region = Arc::new(server.register(4096).unwrap());
    let answer = region.clone();
    server
        .register_callback(move |msg, session, transport| {
            let reply = Message::from_region(answer.clone(), 0..msg.len())
                .expect("a slice of the region")
                .with_meta(msg.meta())
                .unwrap();
            transport.send(session, reply, Linger::NoWait).unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let mut mine = client.register(4096).unwrap();
    mine.as_mut_slice().unwrap().fill(7);
    let mine = Arc::new(mine);
    let session = client.connect(addr).unwrap();
    for (i, range) in [0..0, 0..100, 4096..4096, 10..10].into_iter().enumerate() {
        let len = range.len();
        let msg = Message::from_region(mine.clone(), range)
            .unwrap()
            .with_meta(&[i as u8])
            .unwrap();
        client.send(&session, msg, Linger::Block).unwrap();
        let reply = client_recv(&client, &session);
        assert_eq!((reply.meta(), reply.len()), (&[i as u8][..], len));
    }
    assert!(session.closed().is_none(), "the session lives");
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_steady_stream_of_one_size_registers_no_memory() {
    // Read messages (64 KiB, over the eager threshold) both ways, 220 of them: the
    // pool buffers, the READ targets and the exact views the windows are bound to
    // are reused, so what each side registers is bounded by what it can hold at
    // once, not by the number of messages.
    //
    // A registration is a pool buffer or a buffer's exact view (a message sent
    // from a buffer gets one, kept for the next message of that length). The
    // client is strictly sequential (each round waits until its message's buffer
    // is free again and drops the echo), so it holds at most two buffers at once
    // (message, echo's READ target): at most 4 registrations. Whether it needs one
    // buffer or two, and which of them carry views, is timing (the invalidation
    // may finish before or after the echo arrives), so fewer are fine. The server
    // may hold round i's reply and message while round i + 1's message arrives:
    // four buffers, at most 8. A leak per message would pass these bounds within
    // the first few dozen messages.
    let server = Transport::new(Config::default());
    server
        .register_callback(|msg, session, transport| {
            let reply = Message::new(msg.bytes().to_vec());
            transport.send(session, reply, Linger::NoWait).unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let session = client.connect(addr).unwrap();
    let mut most = (0, 0);
    for i in 0..220usize {
        let payload: Vec<u8> = (0..64 * 1024).map(|b| (b ^ i) as u8).collect();
        let sum = checksum(&payload);
        let sent = client.send(&session, payload, Linger::NoWait).unwrap();
        let echo = client_recv(&client, &session);
        assert_eq!(checksum(echo.bytes()), sum, "echo {i} intact");
        sent.wait(Some(Duration::from_secs(30))).unwrap();
        drop(echo);
        most = (
            most.0.max(client.registrations()),
            most.1.max(server.registrations()),
        );
        assert!(
            most.0 <= 4 && most.1 <= 8,
            "after {} messages: client {} (at most 4), server {} (at most 8) registrations",
            i + 1,
            most.0,
            most.1
        );
    }
    assert!(most.0 >= 2 && most.1 >= 2, "nothing registered? {most:?}");
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

/// A receiver with no spinning thread: its poller reaps every message and arms
/// the queue between bursts. Messages that land between an empty poll and the
/// arm raise no completion event; their receive slots must still be posted
/// again, or the sender (8 credits) runs out of them and both sides wait for
/// ever. Every message arrives, in order, with no receive left waiting long.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_receiver_that_never_spins_posts_every_slot_again() {
    const MESSAGES: u64 = 20_000;
    let asleep = Config {
        busy_poll: Duration::ZERO,
        ..Config::default()
    };
    let server = Transport::new(asleep.clone());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config {
        credits: 8,
        ..asleep
    });
    let s = client.connect(addr).unwrap();
    let peer = only_session(&server);
    let sender = std::thread::spawn(move || {
        for i in 0..MESSAGES {
            let msg = || {
                Message::new(vec![i as u8; 64])
                    .with_meta(&i.to_be_bytes())
                    .unwrap()
            };
            // Queued beyond the credits; refused only past the session's caps.
            loop {
                match server.send(&peer, msg(), Linger::NoWait) {
                    Ok(_) => break,
                    Err(Error::Full) => std::thread::sleep(Duration::from_millis(1)),
                    Err(e) => panic!("send {i}: {e}"),
                }
            }
        }
        server
    });
    for i in 0..MESSAGES {
        let msg = client
            .recv(&s, Linger::Timeout(Duration::from_secs(10)))
            .unwrap()
            .unwrap_or_else(|| panic!("no message {i} of {MESSAGES} within 10 s: stalled"));
        assert_eq!(msg.meta(), i.to_be_bytes(), "message {i}");
        assert_eq!(msg.bytes(), vec![i as u8; 64].as_slice(), "message {i}");
    }
    let server = sender.join().unwrap();
    client.disconnect(s).unwrap();
    server.unbind().unwrap();
}

/// The server's one session, once it has it.
fn only_session(server: &Transport) -> Session {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = server.sessions();
        if all.len() == 1 {
            return all.pop().unwrap();
        }
        assert!(Instant::now() < deadline, "{} sessions", all.len());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A session handle kept across an `unbind` and a new `bind` names that old
/// session only: its id is never given again, and disconnecting it leaves the
/// new session that would have had its id serving. A name given to the old one
/// is forgotten when the next name is set.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_stale_session_handle_never_disconnects_a_live_one() {
    let server = Transport::new(Config::default());
    server
        .register_callback(|msg, session, t| {
            let _ = t.send(session, msg, Linger::NoWait);
        })
        .unwrap();
    let client = Transport::new(Config::default());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let first = client.connect(addr).unwrap();
    client.set_session("first", &first);
    let stale = only_session(&server);
    server.unbind().unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let second = client.connect(addr).unwrap();
    // The first session closed with the unbind: naming another forgets it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.closed().is_none() {
        assert!(Instant::now() < deadline, "the unbind closed nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(client.session("first").is_some());
    client.set_session("second", &second);
    assert!(
        client.session("first").is_none(),
        "a closed session kept its name"
    );
    assert_eq!(client.session("second").as_ref(), Some(&second));
    let live = only_session(&server);
    assert_ne!(stale.id(), live.id(), "an id was given twice");
    server.disconnect(stale).unwrap();
    client
        .send(
            &second,
            Message::new(b"still here".to_vec()),
            Linger::NoWait,
        )
        .unwrap();
    let echo = client
        .recv(&second, Linger::Timeout(Duration::from_secs(10)))
        .unwrap()
        .expect("no echo: the stale handle took the live session out");
    assert_eq!(echo.bytes(), b"still here");
    assert!(live.closed().is_none(), "{:?}", live.closed());
    client.disconnect(second).unwrap();
    server.unbind().unwrap();
}
