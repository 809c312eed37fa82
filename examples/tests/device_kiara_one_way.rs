//! `kiara-echo-client --one-way` against `kiara-echo-server --sink`, in one guest:
//! - sizes whose default window (64 in flight) would pass the server's
//!   `max_receiving_bytes` (64 MiB per session): the client keeps its stream under
//!   half of it, sends again what the server refuses as busy, and every size
//!   reports a rate (8 MiB was refused with code 2 when 64 were in flight);
//! - a size the server could never hold: the client says so before it sends.

use examples::perftest::child::{listening, spawn, Outcome};
use std::time::{Duration, Instant};

const SERVER: &str = env!("CARGO_BIN_EXE_kiara-echo-server");
const CLIENT: &str = env!("CARGO_BIN_EXE_kiara-echo-client");

fn ip() -> String {
    std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

/// Runs the sink server on `port` and the client with `args`; returns both.
fn stream(port: u16, args: &[&str]) -> (Outcome, Outcome) {
    let p = port.to_string();
    let server_args: Vec<String> = ["--sink", "-a", &ip(), "-p", &p]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let srv = spawn(SERVER, &server_args).expect("start kiara-echo-server");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening(port) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client_args = vec![ip(), "-p".into(), p];
    client_args.extend(args.iter().map(|s| s.to_string()));
    let client = spawn(CLIENT, &client_args)
        .expect("start kiara-echo-client")
        .wait(Duration::from_secs(240));
    // The sink serves until stopped: waiting no longer stops it.
    let server = srv.wait(Duration::ZERO);
    (server, client)
}

/// The sizes and message counts of the client's table rows.
fn rows(out: &Outcome) -> Vec<(usize, usize)> {
    out.stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let rate: f64 = cols.get(2)?.parse().ok()?;
            assert!(rate > 0.0, "a zero rate: {l}\n{out}");
            Some((cols[0].parse().ok()?, cols[1].parse().ok()?))
        })
        .collect()
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn large_messages_stay_under_the_servers_budget() {
    let sizes = "65536,4194304,8388608";
    let args = ["--one-way", "-c", "2", "-n", "24", "-s", sizes];
    let (server, client) = stream(19721, &args);
    assert!(client.ok(), "client:\n{client}\nserver:\n{server}");
    assert!(!client.stderr.contains("refused"), "{client}");
    let want = vec![(65536, 48), (4194304, 48), (8388608, 48)];
    assert_eq!(rows(&client), want, "{client}");
    assert!(!server.stderr.contains("panicked"), "{server}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_size_beyond_the_servers_budget_is_named() {
    let args = ["--one-way", "-c", "1", "-n", "2", "-s", "67108865"];
    let (server, client) = stream(19722, &args);
    assert!(!client.ok(), "client:\n{client}");
    assert!(
        client
            .stderr
            .contains("size 67108865: 67108865 bytes is more than")
            && client.stderr.contains("max_receiving_bytes"),
        "{client}"
    );
    assert!(!server.stderr.contains("panicked"), "{server}");
}
