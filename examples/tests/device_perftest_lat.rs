//! Interop of the Rust perftest latency tools with Debian's perftest (C), in both
//! directions: both sides finish, and whoever measures prints perftest's latency row
//! with the right size and iteration count and plausible figures.

#[path = "support/perftest.rs"]
mod perftest;
use examples::perftest::child::{lat_row, run_pair, server_and_client, Outcome};
use perftest::{args, ours};
use std::time::Duration;

fn check_row(who: &str, o: &Outcome, size: f64, iters: f64) {
    assert!(o.ok(), "{who} failed:\n{o}");
    assert!(o.stdout.contains(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "), "{who}: no header\n{o}");
    let r = lat_row(&o.stdout).unwrap_or_else(|| panic!("{who} printed no latency row:\n{o}"));
    assert_eq!(
        (r[0], r[1]),
        (size, iters),
        "{who}: #bytes/#iterations\n{o}"
    );
    assert!(
        r[2] > 0.0 && r[2] <= r[4] && r[4] <= r[3],
        "{who}: min <= typical <= max\n{o}"
    );
    assert!(
        r[5] > 0.0 && r[7] >= r[2] && r[8] >= r[7],
        "{who}: avg and percentiles\n{o}"
    );
}

fn pair(tool: &str, rust_is_client: bool, port: u16, size: u64) {
    let size_s = size.to_string();
    let extra = ["-n", "200", "-s", size_s.as_str()];
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    let (s, c) = run_pair(
        (srv, args(port, &extra, false)),
        (cli, args(port, &extra, true)),
        port,
        Duration::from_secs(120),
    );
    check_row("client", &c, size as f64, 200.0);
    if tool == "ib_read_lat" {
        // Only the reader measures; the server prints its addresses and a line.
        assert!(s.ok(), "server failed:\n{s}");
        assert!(s.stdout.contains(" remote address: LID"), "{s}");
    } else {
        check_row("server", &s, size as f64, 200.0);
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_lat_rust_client_c_server() {
    pair("ib_write_lat", true, 19201, 2);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_lat_c_client_rust_server() {
    pair("ib_write_lat", false, 19202, 64);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_lat_rust_client_c_server() {
    pair("ib_read_lat", true, 19211, 2);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_lat_c_client_rust_server() {
    pair("ib_read_lat", false, 19212, 4096);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_lat_rust_client_c_server() {
    pair("ib_send_lat", true, 19221, 2);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_lat_c_client_rust_server() {
    pair("ib_send_lat", false, 19222, 4096);
}

/// Checks a duration-mode latency row (`-D`): positive figures, and t_avg x tps x the
/// round-trip factor = one second, as perftest computes them; with `window`, also
/// that the 2-second window held tps x 2 iterations. That is asked of the Rust
/// side only: the C tool's own window stretches when its process is starved of CPU
/// (as `device_perftest_bw` saw: 4.8 s for 2), which says nothing about the port.
fn check_duration_row(who: &str, o: &Outcome, size: f64, rtt: f64, window: bool) {
    assert!(o.ok(), "{who} failed:\n{o}");
    assert!(
        o.stdout
            .contains(" #bytes        #iterations       t_avg[usec]    tps average"),
        "{who}: no duration header\n{o}"
    );
    let r = examples::perftest::child::row_after(&o.stdout, "tps average")
        .unwrap_or_else(|| panic!("{who} printed no row:\n{o}"));
    assert_eq!(r.len(), 4, "{who}: row {r:?}\n{o}");
    assert_eq!(r[0], size, "{who}: #bytes\n{o}");
    assert!(r[1] > 0.0 && r[2] > 0.0 && r[3] > 0.0, "{who}: {r:?}\n{o}");
    let one_second = r[2] * r[3] * rtt / 1e6;
    assert!(
        (one_second - 1.0).abs() < 0.02,
        "{who}: t_avg {} x tps {} x {rtt} is not one second\n{o}",
        r[2],
        r[3]
    );
    // The 2-second window of -D 4 holds tps x 2 iterations.
    assert!(
        !window || (r[1] - 2.0 * r[3]).abs() <= 0.05 * r[1] + 1.0,
        "{who}: {} iterations at {} per second in 2 s\n{o}",
        r[1],
        r[3]
    );
}

fn duration_pair(tool: &str, rust_is_client: bool, port: u16) {
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    let extra = ["-D", "4", "-s", "64"];
    let (s, c) = run_pair(
        (srv, args(port, &extra, false)),
        (cli, args(port, &extra, true)),
        port,
        Duration::from_secs(60),
    );
    let rtt = if tool == "ib_read_lat" { 1.0 } else { 2.0 };
    check_duration_row("client", &c, 64.0, rtt, rust_is_client);
    if tool == "ib_read_lat" {
        assert!(s.ok(), "server failed:\n{s}");
    } else {
        check_duration_row("server", &s, 64.0, rtt, !rust_is_client);
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_lat_duration_rust_client_c_server() {
    duration_pair("ib_send_lat", true, 19231);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_lat_duration_c_client_rust_server() {
    duration_pair("ib_send_lat", false, 19232);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_lat_duration_c_client_rust_server() {
    duration_pair("ib_write_lat", false, 19233);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_lat_duration_rust_client_c_server() {
    duration_pair("ib_read_lat", true, 19234);
}

/// The 23 latency rows of `-a` (2 B .. 8 MiB), each with `iters` iterations.
fn check_all_sizes(who: &str, o: &Outcome, iters: f64) {
    assert!(o.ok(), "{who} failed:\n{o}");
    let rows = examples::perftest::child::rows_after(&o.stdout, "t_typical");
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    let want: Vec<f64> = (1..24).map(|i| (1u64 << i) as f64).collect();
    assert_eq!(sizes, want, "{who}: the sizes of -a\n{o}");
    for r in &rows {
        assert_eq!(r.len(), 9, "{who}: row {r:?}\n{o}");
        assert_eq!(r[1], iters, "{who}: #iterations of size {}\n{o}", r[0]);
        assert!(
            r[2] > 0.0 && r[2] <= r[3] && r[5] > 0.0,
            "{who}: size {}\n{o}",
            r[0]
        );
    }
}

fn all_sizes_pair(tool: &str, rust_is_client: bool, port: u16) {
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    let extra = ["-a", "-n", "10"];
    let (s, c) = run_pair(
        (srv, args(port, &extra, false)),
        (cli, args(port, &extra, true)),
        port,
        Duration::from_secs(60),
    );
    check_all_sizes("client", &c, 10.0);
    check_all_sizes("server", &s, 10.0);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_lat_all_sizes_rust_client_c_server() {
    all_sizes_pair("ib_send_lat", true, 19235);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_lat_all_sizes_c_client_rust_server() {
    all_sizes_pair("ib_write_lat", false, 19236);
}
