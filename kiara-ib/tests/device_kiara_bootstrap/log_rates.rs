//! The rate of the log lines about refused connections and closed sessions.

use super::*;

/// A flood of connections refused at once (`max_sessions` reached) is logged at
/// most `Config::log_lines_per_second` lines a second, and the summaries count
/// every refusal that was not logged on its own line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn k_a_flood_of_refused_connections_is_logged_at_a_bounded_rate() {
    const FLOOD: usize = 400;
    const PER_SECOND: usize = 20;
    allow_files(4096);
    let (server, log, delivered) = checksum_server(Config {
        max_sessions: 1,
        ..Config::default()
    });
    assert_eq!(Config::default().log_lines_per_second as usize, PER_SECOND);
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let s = client.connect(addr).unwrap();

    let start = Instant::now();
    for _ in 0..FLOOD {
        let mut tcp = TcpStream::connect(addr).unwrap();
        let sent = closed_by_server(&mut tcp, Duration::from_secs(5), "refused");
        assert!(sent.is_empty(), "the server wrote to a refused connection");
    }
    let flood = start.elapsed();
    // The last window's summary comes within a second and the accept loop's look.
    let count = |log: &[String]| {
        let lines = log
            .iter()
            .filter(|l| l.contains("refused: max_sessions (1) reached"));
        let held = held_in_summaries(log, SUMMARY_END);
        (lines.count(), held)
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let (lines, held) = loop {
        let (lines, held) = count(&log.lock());
        if lines + held >= FLOOD || Instant::now() > deadline {
            break (lines, held);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let windows = flood.as_secs() as usize + 1;
    eprintln!("{FLOOD} refusals in {flood:?}: {lines} lines, {held} counted in summaries");
    assert_eq!(lines + held, FLOOD, "every refusal is logged or counted");
    assert!(
        held > 0,
        "a flood of {FLOOD} in {flood:?} was logged line by line"
    );
    assert!(
        lines <= PER_SECOND * windows,
        "{lines} lines in {flood:?}: over {PER_SECOND} a second"
    );
    // The session and the server still serve.
    let last = Message::new(b"after the flood".to_vec())
        .with_meta(&[7; 8])
        .unwrap();
    client.send(&s, last, Linger::Block).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.load(Ordering::SeqCst) < 1 {
        assert!(
            Instant::now() < deadline,
            "the message after the flood did not arrive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    client.disconnect(s).unwrap();
    wait_no_sessions(&server);
    server.unbind().unwrap();
}

/// Sessions that all close at once (their client transport went away) are
/// logged at most `Config::log_lines_per_second` lines a second, and the summary
/// counts every close that was not logged on its own line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn n_sessions_closing_at_once_are_logged_at_a_bounded_rate() {
    const SESSIONS: usize = 60;
    const PER_SECOND: usize = 20;
    let (server, log, _) = checksum_server(Config::default());
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let sessions: Vec<_> = (0..SESSIONS)
        .map(|_| client.connect(addr).unwrap())
        .collect();
    let before = log.lock().len();
    let start = Instant::now();
    drop(sessions);
    drop(client);
    wait_no_sessions(&server);
    let closing = start.elapsed();
    let count = |log: &[String]| {
        let lines = log[before..]
            .iter()
            .filter(|l| l.starts_with("session ") && l.contains(") closed: "))
            .count();
        let held = held_in_summaries(&log[before..], SESSION_SUMMARY_END);
        (lines, held)
    };
    // The last window's summary comes within a second and a sweep.
    let deadline = Instant::now() + Duration::from_secs(3);
    let (lines, held) = loop {
        let (lines, held) = count(&log.lock());
        if lines + held >= SESSIONS || Instant::now() > deadline {
            break (lines, held);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("{SESSIONS} sessions closed in {closing:?}: {lines} lines, {held} in summaries");
    assert_eq!(
        lines + held,
        SESSIONS,
        "every close is logged or counted: {:?}",
        &log.lock()[before..]
    );
    assert!(
        held > 0,
        "{SESSIONS} closes in {closing:?} were logged line by line"
    );
    // Every close line is written before the session leaves the engine.
    assert!(
        lines <= PER_SECOND * (closing.as_secs() as usize + 1),
        "{lines} lines in {closing:?}: over {PER_SECOND} a second"
    );
    if closing < Duration::from_secs(1) {
        assert_eq!((lines, held), (PER_SECOND, SESSIONS - PER_SECOND));
    }
    server.unbind().unwrap();
}

/// How a summary line of refusals not logged one by one ends.
const SUMMARY_END: &str =
    " more connections refused within a second, not logged one by one (at most 20 lines a \
     second: Config::log_lines_per_second)";
