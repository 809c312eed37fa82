//! `ib_rdma_bw` (the old perftest tool), Rust against Rust: one-way and `-b`; the
//! measuring sides print the peak/average bandwidth and service-demand lines.

use examples::perftest::child::{run_pair, Outcome};
use std::time::Duration;

fn args(port: u16, extra: &[&str], client: bool) -> Vec<String> {
    let mut v = vec!["-p".to_string(), port.to_string()];
    v.extend(extra.iter().map(|s| s.to_string()));
    if client {
        v.push(std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into()));
    }
    v
}

fn figure(o: &Outcome, prefix: &str) -> f64 {
    let line = o
        .stdout
        .lines()
        .find(|l| l.contains(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line:\n{o}"));
    let after = line
        .split("): ")
        .nth(1)
        .or_else(|| line.split(": ").nth(2))
        .unwrap_or("");
    after
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("bad line {line:?}"))
}

/// A report of `size`-byte messages at `-t 10`, with both bandwidths and both
/// addresses.
fn check_report(o: &Outcome, size: usize) {
    assert!(o.ok(), "failed:\n{o}");
    assert!(
        o.stdout.contains(&format!("| size={size} | tx_depth=10 |")),
        "{o}"
    );
    assert!(figure(o, "Bandwidth peak") > 0.0, "{o}");
    assert!(figure(o, "Bandwidth average:") > 0.0, "{o}");
    assert!(o.stdout.contains("cycles/KB"), "{o}");
    assert!(
        o.stdout.contains("Local address:  LID") && o.stdout.contains("Remote address: LID"),
        "{o}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn one_way() {
    let ours = env!("CARGO_BIN_EXE_ib_rdma_bw");
    let port = 19311;
    let extra = ["-n", "200", "-t", "10"];
    let (s, c) = run_pair(
        (ours, args(port, &extra, false)),
        (ours, args(port, &extra, true)),
        port,
        Duration::from_secs(90),
    );
    check_report(&c, 65536);
    assert!(s.ok(), "server failed:\n{s}");
    assert!(
        !s.stdout.contains("Bandwidth average"),
        "a one-way server reports nothing\n{s}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn bidirectional() {
    let ours = env!("CARGO_BIN_EXE_ib_rdma_bw");
    let port = 19312;
    let extra = ["-n", "200", "-t", "10", "-s", "4096", "-b"];
    let (s, c) = run_pair(
        (ours, args(port, &extra, false)),
        (ours, args(port, &extra, true)),
        port,
        Duration::from_secs(90),
    );
    check_report(&c, 4096);
    check_report(&s, 4096);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn non_ascii_address_is_an_error_not_a_panic() {
    // A two-byte character inside the QPN field of the classic 45-byte message.
    let mut msg = b"0000:000011:abcdef:00000abc:00007f0000001000\0".to_vec();
    msg[5..7].copy_from_slice("é".as_bytes());
    let port = 19404;
    let o = examples::perftest::child::feed_server(
        env!("CARGO_BIN_EXE_ib_rdma_bw"),
        &args(port, &[], false),
        port,
        &msg,
        Duration::from_secs(20),
    );
    assert!(o.status.is_some(), "server hung\n{o}");
    assert!(!o.stderr.contains("panicked"), "{o}");
    assert!(!o.ok() && o.stderr.contains("QPN"), "{o}");
}

/// A one-way server waits for its client's whole run, however long, as C's
/// blocking read does: the exchange after the run had the setup's 60-second
/// deadline, so a run of more than a minute failed the server ("the peer was too
/// slow"). A raw client connects as `ib_rdma_bw` does (the two address exchanges),
/// then stands for a run of 65 seconds before the last exchange.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_one_way_server_waits_past_a_minute_for_the_run() {
    use examples::perftest::legacy::{read_dest, LegacyDest};
    use std::io::{Read, Write};
    let port = 19317;
    let mut srv = examples::perftest::child::spawn_listening(
        env!("CARGO_BIN_EXE_ib_rdma_bw"),
        &args(port, &["-n", "200"], false),
        port,
    );
    assert!(srv.running(), "the server ended before its client came");
    let ip: std::net::Ipv4Addr = std::env::var("RDMA_IP")
        .unwrap_or_else(|_| "198.18.0.1".into())
        .parse()
        .unwrap();
    // A queue pair that does not exist: the server's goes to RTS all the same, and
    // nothing is ever sent to it.
    let mine = LegacyDest {
        qpn: 0x11,
        psn: 0x22,
        rkey: 0x33,
        vaddr: 0x1000,
        gid: Some(ip.to_ipv6_mapped().octets()),
        ..Default::default()
    };
    let mut s = std::net::TcpStream::connect((ip, port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for _ in 0..2 {
        s.write_all(&mine.encode()).unwrap();
        read_dest(&mut s).unwrap();
    }
    std::thread::sleep(Duration::from_secs(65));
    assert!(srv.running(), "the server gave up during the run");
    s.write_all(&mine.encode()).unwrap();
    read_dest(&mut s).unwrap();
    let mut done = [0u8; 5];
    s.read_exact(&mut done).unwrap();
    assert_eq!(&done, b"done\0");
    let o = srv.wait(Duration::from_secs(20));
    assert!(o.ok(), "the server failed after a long run:\n{o}");
}
