//! perftest's `--run_infinitely` in the Rust bandwidth ports, against Debian's
//! perftest (C) in both directions, with the C tools' own command lines.
//!
//! Neither side ends: every `-D` seconds each side that counts prints a row over
//! what completed since its last one, with no peak. The test lets a pair run,
//! kills the client, and reads the rows. A row's bytes and count over its
//! average give the seconds it covers, which must be about `-D` (with `-b`,
//! READ and WRITE count each message twice, as perftest does). The C tools run
//! under `stdbuf -oL`: killed, they would lose the rows still in stdio's buffer.

#[path = "support/perftest.rs"]
mod perftest;
use examples::perftest::child::{rows_after, spawn, spawn_listening, Outcome};
use perftest::ours;
use std::process::Command;
use std::time::Duration;

/// How long a pair runs before its client is killed.
const RUN: Duration = Duration::from_secs(9);

/// The rows a side must have printed in `RUN` (rows every second, after a setup
/// of a few seconds under emulation).
const MIN_ROWS: usize = 3;

/// The command line of one side: the C tool under `stdbuf -oL`, or the port.
fn side(tool: &str, rust: bool, port: u16, extra: &[&str], client: bool) -> (String, Vec<String>) {
    let gid = std::env::var("RDMA_GID_INDEX").unwrap_or_else(|_| "1".into());
    let mut v: Vec<String> = vec!["-x".into(), gid, "-p".into(), port.to_string()];
    v.extend(["--run_infinitely", "-D", "1"].map(String::from));
    v.extend(extra.iter().map(|s| s.to_string()));
    if client {
        v.push(std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into()));
    }
    if rust {
        return (ours(tool).into(), v);
    }
    let mut c = vec!["-oL".to_string(), tool.to_string()];
    c.extend(v);
    ("stdbuf".into(), c)
}

/// Runs a server and a client for `RUN`, kills the client, then gives the server
/// 5 s to end by itself (a READ or WRITE server waits for its client's end)
/// before killing it. Returns (server, client).
fn endless_pair(tool: &str, rust_is_client: bool, port: u16, extra: &[&str]) -> (Outcome, Outcome) {
    let (sp, sa) = side(tool, !rust_is_client, port, extra, false);
    let (cp, ca) = side(tool, rust_is_client, port, extra, true);
    let srv = spawn_listening(&sp, &sa, port);
    let cli = spawn(&cp, &ca).unwrap_or_else(|e| panic!("cannot start {cp}: {e}"));
    std::thread::sleep(RUN);
    let c = cli.wait(Duration::ZERO);
    let s = srv.wait(Duration::from_secs(5));
    assert!(
        c.status.is_none(),
        "the client ended by itself in an endless run:\n{c}\nserver:\n{s}"
    );
    (s, c)
}

/// The rows a side printed, checked: at least `MIN_ROWS`, each of `size` bytes
/// with no peak, and covering about a second (`factor` 2 for `-b`). Once the
/// client is gone a server that goes on counts nothing: rows of zeros.
fn check_rows(who: &str, o: &Outcome, size: f64, factor: f64) {
    let rows = rows_after(&o.stdout, "BW average");
    let live = rows.iter().take_while(|r| r.get(1) != Some(&0.0)).count();
    assert!(live >= MIN_ROWS, "{who}: {live} rows\n{o}");
    for r in &rows[live..] {
        assert_eq!(r[1..], [0.0; 4], "{who}: a row after the peer went\n{o}");
    }
    for r in &rows[..live] {
        assert_eq!(r.len(), 5, "{who}: row {r:?}\n{o}");
        let (iters, peak, avg, rate) = (r[1], r[2], r[3], r[4]);
        assert_eq!((r[0], peak), (size, 0.0), "{who}: #bytes, peak\n{o}");
        assert!(avg > 0.0 && rate > 0.0, "{who}: {r:?}\n{o}");
        // A row's own time: about `-D`, so a figure off by the factor of -b, or
        // a period off by one, shows.
        let secs = factor * size * iters / (avg * 1048576.0);
        assert!((0.8..1.6).contains(&secs), "{who}: row of {secs} s\n{o}");
        let by_rate = factor * iters / (rate * 1e6);
        assert!(
            (by_rate / secs - 1.0).abs() < 0.05,
            "{who}: {secs} s by bytes, {by_rate} s by rate\n{o}"
        );
    }
}

/// A READ or WRITE server whose client was killed ends by itself, with an error.
fn ended_with_its_client(who: &str, o: &Outcome) {
    assert!(
        o.status.is_some_and(|s| !s.success()),
        "{who} did not fail when its client went:\n{o}"
    );
    assert!(!o.stderr.trim().is_empty(), "{who} said nothing:\n{o}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_rows_rust_client_c_server() {
    let (_, c) = endless_pair("ib_write_bw", true, 19181, &["-s", "4096"]);
    check_rows("Rust client", &c, 4096.0, 1.0);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_rows_c_client_rust_server() {
    let (s, c) = endless_pair("ib_write_bw", false, 19182, &["-s", "4096"]);
    check_rows("C client", &c, 4096.0, 1.0);
    ended_with_its_client("Rust server", &s);
    assert!(
        rows_after(&s.stdout, "BW average").is_empty(),
        "the server counts nothing\n{s}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_rows_rust_client_c_server() {
    let (_, c) = endless_pair("ib_read_bw", true, 19183, &["-s", "65536"]);
    check_rows("Rust client", &c, 65536.0, 1.0);
}

/// SEND: both sides count, the client its sends and the server its receives.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_rows_both_ways() {
    for (rust_is_client, port) in [(true, 19184), (false, 19185)] {
        let (s, c) = endless_pair("ib_send_bw", rust_is_client, port, &["-s", "4096"]);
        let (sw, cw) = if rust_is_client {
            ("C server", "Rust client")
        } else {
            ("Rust server", "C client")
        };
        check_rows(cw, &c, 4096.0, 1.0);
        check_rows(sw, &s, 4096.0, 1.0);
    }
}

/// `-b` with READ and WRITE: both sides post, and each row counts its messages
/// twice, as perftest's `run_inf_bi_factor` does.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn bidirectional_rows_count_both_ways() {
    for (tool, rust_is_client, port) in [("ib_write_bw", true, 19186), ("ib_read_bw", false, 19187)]
    {
        let (s, c) = endless_pair(tool, rust_is_client, port, &["-b", "-s", "65536"]);
        check_rows(&format!("{tool} client"), &c, 65536.0, 2.0);
        check_rows(&format!("{tool} server"), &s, 65536.0, 2.0);
    }
}

/// `--output=bandwidth`: a figure alone every second, from either side.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn output_prints_a_figure_a_row() {
    for (rust_is_client, port) in [(true, 19188), (false, 19189)] {
        let extra = ["-s", "4096", "--output=bandwidth"];
        let (_, c) = endless_pair("ib_write_bw", rust_is_client, port, &extra);
        let figures: Vec<f64> = c
            .stdout
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        assert!(figures.len() >= MIN_ROWS, "client: {figures:?}\n{c}");
        assert!(figures.iter().all(|&f| f > 0.0), "{figures:?}\n{c}");
        assert!(
            !c.stdout.contains("BW average"),
            "a header with --output\n{c}"
        );
    }
}

/// Where perftest refuses `--run_infinitely`, the port refuses it in its words.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn refused_where_c_refuses_it() {
    let cases: [(&str, &[&str], &str); 3] = [
        (
            "ib_send_bw",
            &["-e"],
            "run_infinitely does not support events feature yet.",
        ),
        (
            "ib_send_lat",
            &[],
            "run_infinitely exists only in BW tests for now.",
        ),
        (
            "ib_send_bw",
            &["-b"],
            "run_infinitely mode is not supported in SEND Bidirectional BW test",
        ),
    ];
    for (tool, extra, why) in cases {
        for prog in [tool, ours(tool)] {
            let out = Command::new(prog)
                .arg("--run_infinitely")
                .args(extra)
                .output()
                .expect(prog);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{prog} {extra:?} ran");
            assert_eq!(stderr.trim(), why, "{prog} {extra:?}");
        }
    }
}
