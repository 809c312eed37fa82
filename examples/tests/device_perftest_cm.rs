//! `-R` (rdma_cm) interop of the Rust perftest tools with Debian's perftest 6.06 (C),
//! in both directions, for all six tools: the exchanges ride on a CM-connected queue
//! pair and the test's QPs are connected by the CM. Both sides must finish, say
//! "rdma_cm" in their test description, agree on each other's QP numbers (the binary
//! handshake decoded both ways) and print plausible result rows. `-z` (only the
//! exchanges over rdma_cm, the QPs connected from the exchanged keys) is checked too.

#[path = "support/perftest.rs"]
mod perftest;
use examples::perftest::child::{
    bw_row, cm_listening, lat_row, run_pair_when, server_and_client, Outcome,
};
use perftest::ours;
use std::time::Duration;

fn gid() -> String {
    std::env::var("RDMA_GID_INDEX").unwrap_or_else(|_| "1".into())
}

fn server_ip() -> String {
    std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

fn args(port: u16, extra: &[&str], client: bool) -> Vec<String> {
    args_with("-R", port, extra, client)
}

fn args_with(flag: &str, port: u16, extra: &[&str], client: bool) -> Vec<String> {
    let mut v: Vec<String> = vec![
        flag.into(),
        "-x".into(),
        gid(),
        "-p".into(),
        port.to_string(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    if client {
        v.push(server_ip());
    }
    v
}

/// The QPN of the first "<side> address:" line.
fn qpn(o: &Outcome, side: &str) -> u32 {
    let line = o
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{side} address:")))
        .unwrap_or_else(|| panic!("no {side} address line\n{o}"));
    let hex = line
        .split_whitespace()
        .skip_while(|w| *w != "QPN")
        .nth(1)
        .unwrap_or_else(|| panic!("no QPN in {line:?}"));
    u32::from_str_radix(hex.trim_start_matches("0x"), 16)
        .unwrap_or_else(|_| panic!("QPN {hex:?} is not hex"))
}

/// Runs the pair with `-R` and checks what every tool has in common; returns
/// (server, client).
fn pair(tool: &str, rust_is_client: bool, port: u16, extra: &[&str]) -> (Outcome, Outcome) {
    pair_with("-R", tool, rust_is_client, port, extra)
}

fn pair_with(
    flag: &str,
    tool: &str,
    rust_is_client: bool,
    port: u16,
    extra: &[&str],
) -> (Outcome, Outcome) {
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    let (s, c) = run_pair_when(
        (srv, args_with(flag, port, extra, false)),
        (cli, args_with(flag, port, extra, true)),
        || cm_listening(port),
        Duration::from_secs(120),
    );
    let qps = if flag == "-R" { "ON" } else { "OFF" };
    for (who, o) in [("server", &s), ("client", &c)] {
        let other = if who == "server" { &c } else { &s };
        assert!(o.ok(), "{who} failed:\n{o}\nthe other side:\n{other}");
        assert!(
            o.stdout.contains(&format!(
                " rdma_cm QPs\t : {qps}\n Data ex. method : rdma_cm"
            )),
            "{who} does not describe an rdma_cm {flag} test:\n{o}"
        );
    }
    assert_eq!(
        s.stdout
            .contains(" Waiting for client rdma_cm QP to connect"),
        flag == "-R",
        "server:\n{s}"
    );
    assert_eq!(
        qpn(&s, "remote"),
        qpn(&c, "local"),
        "the server's remote QPN is not the client's QP\n{s}\n{c}"
    );
    assert_eq!(
        qpn(&c, "remote"),
        qpn(&s, "local"),
        "the client's remote QPN is not the server's QP\n{s}\n{c}"
    );
    (s, c)
}

fn check_bw(who: &str, o: &Outcome, size: f64, iters: f64) -> [f64; 5] {
    let row = bw_row(&o.stdout).unwrap_or_else(|| panic!("{who} printed no result row:\n{o}"));
    assert_eq!(
        (row[0], row[1]),
        (size, iters),
        "{who}: #bytes/#iterations\n{o}"
    );
    assert!(
        row[3] > 0.0 && row[4] > 0.0,
        "{who}: bandwidth and rate positive\n{o}"
    );
    row
}

fn bw(tool: &str, rust_is_client: bool, port: u16) {
    let (s, c) = pair(tool, rust_is_client, port, &["-n", "200", "-s", "65536"]);
    let crow = check_bw("client", &c, 65536.0, 200.0);
    let srow = check_bw("server", &s, 65536.0, 200.0);
    if tool != "ib_send_bw" {
        assert_eq!(
            crow, srow,
            "a one-sided server prints the client's results\n{s}\n{c}"
        );
    }
}

fn check_lat(who: &str, o: &Outcome, size: f64, iters: f64) {
    let r = lat_row(&o.stdout).unwrap_or_else(|| panic!("{who} printed no latency row:\n{o}"));
    assert_eq!(
        (r[0], r[1]),
        (size, iters),
        "{who}: #bytes/#iterations\n{o}"
    );
    assert!(
        r[2] > 0.0 && r[2] <= r[4] && r[4] <= r[3] && r[5] > 0.0,
        "{who}: min <= typical <= max, avg > 0\n{o}"
    );
}

fn lat(tool: &str, rust_is_client: bool, port: u16) {
    let (s, c) = pair(tool, rust_is_client, port, &["-n", "200", "-s", "64"]);
    check_lat("client", &c, 64.0, 200.0);
    if tool != "ib_read_lat" {
        check_lat("server", &s, 64.0, 200.0);
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_rust_client_c_server() {
    bw("ib_write_bw", true, 19301);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_c_client_rust_server() {
    bw("ib_write_bw", false, 19302);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_rust_client_c_server() {
    bw("ib_read_bw", true, 19303);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_c_client_rust_server() {
    bw("ib_read_bw", false, 19304);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_rust_client_c_server() {
    bw("ib_send_bw", true, 19305);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_c_client_rust_server() {
    bw("ib_send_bw", false, 19306);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_lat_rust_client_c_server() {
    lat("ib_write_lat", true, 19311);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_lat_c_client_rust_server() {
    lat("ib_write_lat", false, 19312);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_lat_rust_client_c_server() {
    lat("ib_read_lat", true, 19313);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_lat_c_client_rust_server() {
    lat("ib_read_lat", false, 19314);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_lat_rust_client_c_server() {
    lat("ib_send_lat", true, 19315);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_lat_c_client_rust_server() {
    lat("ib_send_lat", false, 19316);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn two_qps_rust_client_c_server() {
    // Two CM connections on the same port, after the exchange link.
    let (s, c) = pair(
        "ib_write_bw",
        true,
        19321,
        &["-n", "100", "-s", "4096", "-q", "2"],
    );
    let row = check_bw("client", &c, 4096.0, 200.0);
    assert_eq!(row, check_bw("server", &s, 4096.0, 200.0), "{s}\n{c}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_pair_read_bw_outstanding_reads() {
    let port = 19322;
    let extra = ["-n", "100", "-s", "8192", "-o", "4"];
    let (s, c) = run_pair_when(
        (ours("ib_read_bw"), args(port, &extra, false)),
        (ours("ib_read_bw"), args(port, &extra, true)),
        || cm_listening(port),
        Duration::from_secs(120),
    );
    assert!(s.ok() && c.ok(), "{s}\n{c}");
    assert!(c.stdout.contains(" Outstand reads  : 4"), "{c}");
    check_bw("client", &c, 8192.0, 100.0);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn comm_rdma_cm_write_bw_rust_client_c_server() {
    // -z: the keys travel in binary over the CM link, the QPs connect from them.
    let (s, c) = pair_with(
        "-z",
        "ib_write_bw",
        true,
        19331,
        &["-n", "200", "-s", "65536"],
    );
    let row = check_bw("client", &c, 65536.0, 200.0);
    assert_eq!(row, check_bw("server", &s, 65536.0, 200.0), "{s}\n{c}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn comm_rdma_cm_send_lat_c_client_rust_server() {
    let (s, c) = pair_with(
        "-z",
        "ib_send_lat",
        false,
        19332,
        &["-n", "200", "-s", "64"],
    );
    check_lat("client", &c, 64.0, 200.0);
    check_lat("server", &s, 64.0, 200.0);
}
