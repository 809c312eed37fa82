//! Two hosts, one wire: the perftest ports and `ibv_rc_pingpong` against the C
//! tools, each server on host b and its client on host a, both ways (Rust server
//! with C client, C server with Rust client). Every side checks its own result
//! lines, and the two hosts compare what they saw of each other.
//!
//! Run by `cargo xtask test` on its two guests (`docs/two-hosts.md`); they fail
//! anywhere else.

use examples::perftest::child::{bw_row, lat_row, listening, Outcome};
use examples::twohost::{side, Case, Role};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
const IGNORE: &str = "needs two hosts: run `cargo xtask test`";

fn gid() -> String {
    std::env::var("RDMA_GID_INDEX").unwrap_or_else(|_| "1".into())
}

/// Options of both sides (`-x`/`-g` GID index, port, `extra`), plus the server's
/// address on the client.
fn args(case: &Case, gid_flag: &str, port: u16, extra: &[&str]) -> (Vec<String>, Vec<String>) {
    let mut server: Vec<String> = vec![gid_flag.into(), gid(), "-p".into(), port.to_string()];
    server.extend(extra.iter().map(|s| s.to_string()));
    let mut client = server.clone();
    client.push(case.server_ip());
    (server, client)
}

/// (server, client) programs: the Rust port on the server side or on the client's.
fn programs<'a>(c_tool: &'a str, rust: &'a str, rust_serves: bool) -> (&'a str, &'a str) {
    if rust_serves {
        (rust, c_tool)
    } else {
        (c_tool, rust)
    }
}

fn who(case: &Case) -> &'static str {
    match case.role() {
        Role::Server => "server (host b)",
        Role::Client => "client (host a)",
    }
}

fn write_bw(name: &str, rust_serves: bool, port: u16) {
    let _ = IGNORE;
    let case = Case::start(name);
    let (s, c) = args(&case, "-x", port, &["-n", "200", "-s", "65536"]);
    let rust = env!("CARGO_BIN_EXE_ib_write_bw");
    let (srv, cli) = programs("ib_write_bw", rust, rust_serves);
    let out = side::perftest(&case, (srv, &s), (cli, &c), || listening(port), T);
    let who = who(&case);
    assert!(out.ok(), "{who} failed:\n{out}");
    let row = bw_row(&out.stdout).unwrap_or_else(|| panic!("{who}: no result row\n{out}"));
    assert_eq!(
        (row[0], row[1]),
        (65536.0, 200.0),
        "{who}: #bytes, #iterations\n{out}"
    );
    assert!(
        row[3] > 0.0 && row[4] > 0.0,
        "{who}: bandwidth and rate\n{out}"
    );
    // A write server prints the row its client measured and sent it.
    case.publish("row", &format!("{row:?}"));
    let theirs = case.wait_for("row", T);
    assert_eq!(
        theirs,
        format!("{row:?}"),
        "{who}: the two hosts' rows differ\n{out}"
    );
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn ib_write_bw_rust_server_c_client() {
    write_bw("ib_write_bw_rust_server_c_client", true, 19501);
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn ib_write_bw_c_server_rust_client() {
    write_bw("ib_write_bw_c_server_rust_client", false, 19502);
}

fn check_lat(who: &str, out: &Outcome, size: f64, iters: f64) {
    assert!(out.ok(), "{who} failed:\n{out}");
    let r = lat_row(&out.stdout).unwrap_or_else(|| panic!("{who}: no latency row\n{out}"));
    assert_eq!(
        (r[0], r[1]),
        (size, iters),
        "{who}: #bytes, #iterations\n{out}"
    );
    assert!(
        r[2] > 0.0 && r[2] <= r[4] && r[4] <= r[3],
        "{who}: min <= typical <= max\n{out}"
    );
}

fn send_lat(name: &str, rust_serves: bool, port: u16) {
    let case = Case::start(name);
    let (s, c) = args(&case, "-x", port, &["-n", "200", "-s", "64"]);
    let rust = env!("CARGO_BIN_EXE_ib_send_lat");
    let (srv, cli) = programs("ib_send_lat", rust, rust_serves);
    let out = side::perftest(&case, (srv, &s), (cli, &c), || listening(port), T);
    // Both sides of a send latency test measure.
    check_lat(who(&case), &out, 64.0, 200.0);
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn ib_send_lat_rust_server_c_client() {
    send_lat("ib_send_lat_rust_server_c_client", true, 19511);
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn ib_send_lat_c_server_rust_client() {
    send_lat("ib_send_lat_c_server_rust_client", false, 19512);
}

/// The `(local, remote)` address lines of `ibv_rc_pingpong`, checked: the local
/// GID is this host's address, the remote one the peer's; and the bytes and
/// iterations lines.
fn check_pingpong(who: &str, out: &Outcome, iters: u64, size: u64) -> (String, String) {
    assert!(out.ok(), "{who} failed:\n{out}");
    let line = |start: &str| {
        let l = out.stdout.lines().find(|l| l.starts_with(start));
        l.unwrap_or_else(|| panic!("{who}: no `{start}` line\n{out}"))
            .to_string()
    };
    let (local, remote) = (line("  local address:  LID"), line("  remote address: LID"));
    let me = std::env::var("RDMA_IP").expect("RDMA_IP");
    let peer = std::env::var("PEER_IP").expect("PEER_IP");
    assert!(
        local.ends_with(&format!("GID ::ffff:{me}")),
        "{who}: {local}"
    );
    assert!(
        remote.ends_with(&format!("GID ::ffff:{peer}")),
        "{who}: {remote}"
    );
    let bytes = line(&format!("{} bytes in ", 2 * size * iters));
    assert!(bytes.ends_with(" Mbit/sec"), "{who}: {bytes}");
    let it = line(&format!("{iters} iters in "));
    assert!(it.ends_with(" usec/iter"), "{who}: {it}");
    let qpn = |l: &str| {
        l.split("QPN ")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .map(str::to_string)
    };
    (
        qpn(&local).expect("local QPN"),
        qpn(&remote).expect("remote QPN"),
    )
}

fn rc_pingpong(name: &str, rust_serves: bool, port: u16) {
    let case = Case::start(name);
    let (s, c) = args(&case, "-g", port, &["-n", "500"]);
    let rust = env!("CARGO_BIN_EXE_ibv_rc_pingpong");
    let (srv, cli) = programs("ibv_rc_pingpong", rust, rust_serves);
    let out = side::perftest(&case, (srv, &s), (cli, &c), || listening(port), T);
    let (local, remote) = check_pingpong(who(&case), &out, 500, 4096);
    case.publish("qpns", &format!("{local} {remote}"));
    let theirs = case.wait_for("qpns", T);
    assert_eq!(
        theirs,
        format!("{remote} {local}"),
        "each side's remote QPN is the other's local one"
    );
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn ibv_rc_pingpong_rust_server_c_client() {
    rc_pingpong("ibv_rc_pingpong_rust_server_c_client", true, 19521);
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn ibv_rc_pingpong_c_server_rust_client() {
    rc_pingpong("ibv_rc_pingpong_c_server_rust_client", false, 19522);
}
