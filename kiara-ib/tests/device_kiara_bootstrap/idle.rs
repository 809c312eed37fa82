//! A thousand idle connections beside good clients: refused or cut, and the
//! good clients served.

use super::*;

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn i_a_thousand_idle_connections_are_refused_or_cut_and_good_clients_served() {
    const IDLE: usize = 1000;
    const TIMEOUT: Duration = Duration::from_secs(2);
    const SLACK: Duration = Duration::from_secs(4);
    const MAX_HANDSHAKES: usize = 16;
    allow_files(4096);
    // Every refusal logged, to check each connection's reason (the rate of the
    // lines is the next test's).
    let (server, log, delivered) = checksum_server(Config {
        timeout: TIMEOUT,
        max_handshakes: MAX_HANDSHAKES,
        log_lines_per_second: 0,
        ..Config::default()
    });
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let threads_before = status("Threads");
    let pinned_before = pinned_kib();
    let peaks = Peaks::start();
    let start = Instant::now();

    let (idle, refused) = idle_connections_beside_good_clients(addr, IDLE);
    assert_eq!(delivered.load(Ordering::SeqCst), 4 * 3 * 10);

    // Every idle connection is closed without a byte, refused at once or cut at the
    // deadline, and logged once with its reason.
    let mut idle = idle;
    let locals: Vec<SocketAddr> = idle.iter().map(|(t, _)| t.local_addr().unwrap()).collect();
    for (tcp, opened) in &mut idle {
        let left = (*opened + TIMEOUT + SLACK).saturating_duration_since(Instant::now());
        let sent = closed_by_server(tcp, left.max(Duration::from_millis(1)), "idle");
        assert!(
            sent.is_empty(),
            "the server wrote to a client that said nothing"
        );
    }
    wait_lines(&log, &locals, SLACK);
    let (threads_peak, pinned_peak) = peaks.finish();
    let reasons = idle_reasons(&log.lock(), &locals, MAX_HANDSHAKES);
    eprintln!(
        "{IDLE} idle connections: {reasons:?}; good clients refused {refused} times; \
         threads {threads_before} -> peak {threads_peak}; pinned {pinned_before} -> peak \
         {pinned_peak} KiB; {:?}",
        start.elapsed()
    );
    assert!(
        reasons.get("in progress").copied().unwrap_or(0) > 0,
        "{reasons:?}"
    );
    assert!(reasons.get("cut").copied().unwrap_or(0) > 0, "{reasons:?}");
    assert!(
        reasons.get("gave way").copied().unwrap_or(0) > 0,
        "{reasons:?}"
    );
    // Threads: the handshakes (those holding a place, and at most as many again
    // that gave theirs up and are ending), the clients' and the test's own (4
    // openers, 4 clients, the peak sampler, each client's poller, each session's
    // dispatcher): nowhere near one per connection.
    assert!(
        threads_peak <= threads_before + 2 * MAX_HANDSHAKES as u64 + 24,
        "threads {threads_before} -> peak {threads_peak}"
    );
    // Pinned memory: at most the handshakes' buffers and the good clients' sessions
    // and pools, not 270 KiB per connection (270 MiB).
    assert!(
        pinned_peak <= pinned_before + 24 * 1024,
        "pinned {pinned_before} -> peak {pinned_peak} KiB"
    );
    assert!(
        start.elapsed() < Duration::from_secs(40),
        "{:?}",
        start.elapsed()
    );
    drop(idle);
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// Four threads open `idle` connections in all, as fast as they can, and keep them
/// open, while four well-behaved clients send (retrying while refused). Returns the
/// idle connections with the time each was opened, and the clients' refusals.
fn idle_connections_beside_good_clients(
    addr: SocketAddr,
    idle: usize,
) -> (Vec<(TcpStream, Instant)>, usize) {
    std::thread::scope(|s| {
        let openers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(move || {
                    (0..idle / 4)
                        .map(|_| {
                            let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                                .expect("connect");
                            (tcp, Instant::now())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let clients: Vec<_> = (0..4)
            .map(|c| {
                s.spawn(move || {
                    good_client(addr, 200 + c, 3, 10, 64 * KIB, Duration::from_secs(30))
                })
            })
            .collect();
        let idle: Vec<_> = openers
            .into_iter()
            .flat_map(|o| o.join().unwrap())
            .collect();
        let refused: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
        (idle, refused)
    })
}

/// How many idle connections the log says were refused ("in progress": the
/// `max_handshakes` limit), cut ("cut": too slow on the hello header) or cut for a
/// newer connection ("gave way": silent past the grace with every place taken);
/// any other reason fails the test.
fn idle_reasons(
    log: &[String],
    locals: &[SocketAddr],
    max_handshakes: usize,
) -> HashMap<&'static str, usize> {
    let mut reasons: HashMap<&str, usize> = HashMap::new();
    for local in locals {
        let line = line_about(log, *local).unwrap();
        let reason = if line.contains(&format!("refused: {max_handshakes} handshakes in progress"))
        {
            "in progress"
        } else if line.contains("the peer was too slow") && line.contains("hello header") {
            "cut"
        } else if line.contains("no hello within") && line.contains("went to a newer connection") {
            "gave way"
        } else {
            panic!("unexpected reason: {line}");
        };
        *reasons.entry(reason).or_default() += 1;
    }
    reasons
}
