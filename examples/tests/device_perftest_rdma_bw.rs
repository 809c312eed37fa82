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

fn check_report(o: &Outcome) {
    assert!(o.ok(), "failed:\n{o}");
    assert!(
        o.stdout.contains("| size=65536 | tx_depth=10 |")
            || o.stdout.contains("| size=4096 | tx_depth=10 |"),
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
    check_report(&c);
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
    check_report(&c);
    check_report(&s);
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
