//! Handshakes that never finish: connections that never send their hello, a
//! hello dripped a byte at a time, and a silent connection that gives its place
//! to a client that speaks.

use super::*;
use std::os::fd::{AsRawFd, RawFd};

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn f_unfinished_handshakes_pin_nothing_until_the_hello_and_are_cut() {
    // Long enough for the four queue pairs of step 2 to be set up (a device opened
    // for each) before the first one's handshake is cut.
    const TIMEOUT: Duration = Duration::from_secs(4);
    const SLACK: Duration = Duration::from_secs(3);
    const SILENT: usize = 10;
    const HALF: usize = 10;
    const NEVER_READY: usize = 4;
    // Every refusal logged: the 24 handshakes are cut within a second, and each
    // one's line is checked.
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        max_handshakes: 32,
        log_lines_per_second: 0,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let pinned_before = pinned_kib();
    let threads_before = status("Threads");

    // 1. Connections that say nothing, or half a hello: a thread each, no device
    //    resource (before the server heard the hello first, each pinned ~270 KiB).
    let quiet_opened = Instant::now();
    let mut quiet = quiet_connections(addr, SILENT, HALF);
    std::thread::sleep(Duration::from_millis(300));
    let pinned_quiet = pinned_kib();
    let threads_quiet = status("Threads");
    assert!(
        pinned_quiet <= pinned_before + 64,
        "{} idle connections pinned {} KiB",
        SILENT + HALF,
        pinned_quiet - pinned_before
    );
    assert!(
        threads_quiet <= threads_before + (SILENT + HALF) as u64,
        "threads {threads_before} -> {threads_quiet}"
    );

    // Each cut is timed from its connection's opening, on a thread started after the
    // count above, however long the steps below take.
    let mut watched: Vec<_> = quiet
        .iter()
        .map(|(t, _)| (t.as_raw_fd(), quiet_opened))
        .collect();

    // 2. Clients that send a valid hello and never their ready byte: the server built
    //    their queue pairs and buffers, and holds them until the deadline.
    let mut never: Vec<NeverReady> = (0..NEVER_READY)
        .map(|_| {
            let opened = Instant::now();
            let n = NeverReady::connect(addr);
            watched.push((n.tcp.as_raw_fd(), opened));
            n
        })
        .collect();
    let cuts = watch_closes(watched, TIMEOUT + 2 * SLACK);
    let pinned_hellos = pinned_kib();
    assert!(
        pinned_hellos >= pinned_quiet + NEVER_READY as u64 * 200,
        "a valid hello must get the server's buffers (pinned {pinned_quiet} -> {pinned_hellos} \
         KiB): is VmPin measuring registrations?"
    );

    // 3. Meanwhile, well-behaved clients are served (no refusal: 24 + 4 < 32).
    let refused: usize = std::thread::scope(|s| {
        let clients: Vec<_> = (0..4)
            .map(|c| s.spawn(move || good_client(addr, c, 2, 20, 4 * KIB, TIMEOUT)))
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    });
    assert_eq!(refused, 0, "a good client was refused");
    assert_eq!(delivered.load(Ordering::SeqCst), 4 * 2 * 20);

    // 4. Every unfinished handshake is cut at the deadline, with the part it was on.
    quiet_connections_are_cut(&log, &mut quiet, TIMEOUT + SLACK, SLACK);
    for n in &mut never {
        let local = n.tcp.local_addr().unwrap();
        closed_by_server(&mut n.tcp, TIMEOUT + SLACK, "never ready");
        wait_lines(&log, &[local], SLACK);
        let line = line_about(&log.lock(), local).unwrap();
        assert!(
            line.contains("too slow") && line.contains("ready byte"),
            "{line}"
        );
    }
    cut_at_the_deadline(cuts.join().unwrap(), TIMEOUT, SLACK);
    drop(never);
    wait_no_sessions(&server);
    // Everything the handshakes held is released (the good clients' messages were
    // eager: the server's pool registered nothing).
    wait_unpinned(pinned_before);
    server.unbind().unwrap();
}

/// Each connection of [`watch_closes`]' answer was cut at the `deadline`: none before
/// it (the server's clock starts after the connection opened), none `slack` after.
fn cut_at_the_deadline(cuts: Vec<Option<Duration>>, deadline: Duration, slack: Duration) {
    for (i, took) in cuts.into_iter().enumerate() {
        let took = took.unwrap_or_else(|| panic!("connection {i}: no close seen"));
        assert!(
            took >= deadline && took < deadline + slack,
            "connection {i} was cut {took:?} after it opened (deadline {deadline:?})"
        );
    }
}

/// Watches `conns` (a socket and when it was opened) on a thread of its own until the
/// server has closed every one, or for `within`: returns for each how long after its
/// opening the close was seen (a FIN or a reset; bytes the server sent do not count).
fn watch_closes(
    conns: Vec<(RawFd, Instant)>,
    within: Duration,
) -> std::thread::JoinHandle<Vec<Option<Duration>>> {
    std::thread::spawn(move || {
        let mut fds: Vec<libc::pollfd> = conns
            .iter()
            .map(|&(fd, _)| libc::pollfd {
                fd,
                events: libc::POLLRDHUP,
                revents: 0,
            })
            .collect();
        let mut took = vec![None; conns.len()];
        let deadline = Instant::now() + within;
        while took.iter().any(Option::is_none) && Instant::now() < deadline {
            // SAFETY: `fds` is a valid array of `fds.len()` entries. The test holds
            // the sockets until it has joined this thread (a socket closed early
            // would only read as POLLNVAL).
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) };
            let now = Instant::now();
            for ((pfd, &(_, opened)), t) in fds.iter_mut().zip(&conns).zip(&mut took) {
                if pfd.fd >= 0 && pfd.revents != 0 {
                    *t = Some(now - opened);
                    // Not polled again.
                    pfd.fd = -1;
                }
            }
        }
        took
    })
}

/// `silent` connections that say nothing and `half` that send half a hello, each
/// with the part of the hello the server waits for.
fn quiet_connections(
    addr: SocketAddr,
    silent: usize,
    half: usize,
) -> Vec<(TcpStream, &'static str)> {
    let hello = some_hello();
    let mut quiet: Vec<(TcpStream, &str)> = Vec::new();
    for i in 0..silent + half {
        let mut tcp = TcpStream::connect(addr).unwrap();
        if i >= silent {
            tcp.write_all(&hello[..30]).unwrap();
            quiet.push((tcp, "hello body"));
        } else {
            quiet.push((tcp, "hello header"));
        }
    }
    quiet
}

/// Each quiet connection is closed `within` without a byte from the server, and
/// logged (within `slack`) as too slow on the part it was on.
fn quiet_connections_are_cut(
    log: &Mutex<Vec<String>>,
    quiet: &mut [(TcpStream, &str)],
    within: Duration,
    slack: Duration,
) {
    for (tcp, part) in quiet {
        let local = tcp.local_addr().unwrap();
        let sent = closed_by_server(tcp, within, part);
        assert!(sent.is_empty(), "the server answered an incomplete hello");
        wait_lines(log, &[local], slack);
        let line = line_about(&log.lock(), local).unwrap();
        assert!(
            line.contains("the peer was too slow") && line.contains(*part),
            "{part}: {line}"
        );
    }
}

/// Waits (5 s at most) until the process pins no more than 64 KiB above `before`.
fn wait_unpinned(before: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pinned_kib() > before + 64 {
        assert!(
            Instant::now() < deadline,
            "pinned {before} -> {} KiB after every handshake ended",
            pinned_kib()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn h_a_dripped_hello_is_cut_at_the_deadline_while_others_are_served() {
    const TIMEOUT: Duration = Duration::from_millis(1500);
    // Room for a slow guest, and still short of the 6 s the whole hello takes: a
    // deadline per read instead of one for the handshake would never cut it.
    const SLACK: Duration = Duration::from_millis(3500);
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let hello = some_hello();
    std::thread::scope(|s| {
        // Three clients drip a valid hello a byte per 100 ms (6 s for all of it).
        let drippers: Vec<_> = (0..3)
            .map(|_| {
                let log = &log;
                s.spawn(move || {
                    let start = Instant::now();
                    let mut tcp = TcpStream::connect(addr).unwrap();
                    let local = tcp.local_addr().unwrap();
                    let mut writer = tcp.try_clone().unwrap();
                    let drip = std::thread::spawn(move || {
                        for byte in hello {
                            // Once the server gave up, writes fail: stop there.
                            if writer.write_all(&[byte]).is_err() {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    });
                    // The server never answers a hello it has not read whole.
                    let sent = closed_by_server(&mut tcp, TIMEOUT + SLACK, "dripper");
                    let took = start.elapsed();
                    assert!(sent.is_empty(), "the server answered a partial hello");
                    assert!(took < TIMEOUT + SLACK, "cut off after {took:?}");
                    assert!(
                        took + Duration::from_millis(200) >= TIMEOUT,
                        "cut early: {took:?}"
                    );
                    wait_lines(log, &[local], SLACK);
                    let line = line_about(&log.lock(), local).unwrap();
                    assert!(line.contains("the peer was too slow"), "{line}");
                    assert!(line.contains("1.5s allowed"), "{line}");
                    drip.join().unwrap();
                })
            })
            .collect();
        // Meanwhile two clients exchange messages of up to 1 MiB (read ones too).
        let clients: Vec<_> = (0..2)
            .map(|c| s.spawn(move || good_client(addr, 100 + c, 3, 10, MIB, TIMEOUT)))
            .collect();
        for c in clients {
            assert_eq!(c.join().unwrap(), 0, "a good client was refused");
        }
        for d in drippers {
            d.join().unwrap();
        }
    });
    assert_eq!(delivered.load(Ordering::SeqCst), 2 * 3 * 10);
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// Whether `tcp` is still open with nothing to read (the server neither wrote to
/// nor closed it).
fn still_open(tcp: &mut TcpStream) -> bool {
    tcp.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let open = matches!(tcp.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    tcp.set_nonblocking(false).unwrap();
    open
}

/// Every handshake place is held. By clients that sent their hello: a newcomer is
/// refused, however long they have held them. By connections that said nothing
/// for longer than the grace (a quarter of `timeout`): a client that speaks takes
/// the oldest one's place and is served at once, that connection is closed
/// without a byte and logged with the reason, and the others keep theirs.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn j_a_silent_connection_gives_its_place_to_a_client_that_speaks() {
    // The grace is a quarter of it, 4 s; the silent connections that stay are cut
    // at 16 s, long after the client that spoke is done.
    const TIMEOUT: Duration = Duration::from_secs(16);
    const PAST_GRACE: Duration = Duration::from_millis(4500);
    const PLACES: usize = 4;
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        max_handshakes: PLACES,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let in_progress = |log: &Mutex<Vec<String>>| {
        let needle = format!("refused: {PLACES} handshakes in progress");
        log.lock().iter().filter(|l| l.contains(&needle)).count()
    };

    // 1. Clients that sent their hello keep their places past the grace.
    let mut never: Vec<NeverReady> = (0..PLACES).map(|_| NeverReady::connect(addr)).collect();
    std::thread::sleep(PAST_GRACE);
    let client = Transport::new(Config {
        timeout: Duration::from_secs(5),
        ..Config::default()
    });
    let refused = client.connect(addr);
    assert!(
        refused.is_err(),
        "a place was given up by a client that spoke"
    );
    assert_eq!(in_progress(&log), 1, "{:?}", log.lock());
    for n in &mut never {
        assert!(
            still_open(&mut n.tcp),
            "a client that sent its hello was cut"
        );
    }
    let locals: Vec<SocketAddr> = never.iter().map(|n| n.tcp.local_addr().unwrap()).collect();
    drop(never);
    wait_lines(&log, &locals, Duration::from_secs(5));

    // 2. Silent connections, the oldest first, give way to a client that speaks.
    let mut silent: Vec<TcpStream> = (0..PLACES)
        .map(|_| {
            let tcp = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            tcp
        })
        .collect();
    std::thread::sleep(PAST_GRACE);
    let refused = good_client(addr, 300, 1, 10, 64 * KIB, Duration::from_secs(1));
    assert_eq!(refused, 0, "the client that spoke was refused");
    assert_eq!(delivered.load(Ordering::SeqCst), 10);
    let oldest = silent[0].local_addr().unwrap();
    let sent = closed_by_server(&mut silent[0], Duration::from_secs(2), "the oldest silent");
    assert!(
        sent.is_empty(),
        "the server wrote to a client that said nothing"
    );
    wait_lines(&log, &[oldest], Duration::from_secs(2));
    let line = line_about(&log.lock(), oldest).unwrap();
    assert!(
        line.contains("no hello within 4s") && line.contains("went to a newer connection"),
        "{line}"
    );
    for tcp in &mut silent[1..] {
        assert!(still_open(tcp), "a younger silent connection was cut");
    }
    assert_eq!(in_progress(&log), 1, "{:?}", log.lock());
    drop(silent);
    wait_no_sessions(&server);
    server.unbind().unwrap();
}
