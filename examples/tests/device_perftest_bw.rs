//! Interop of the Rust perftest bandwidth tools with Debian's perftest (C), in both
//! directions: both sides must finish and print the result row, with the right
//! size and iteration count and a positive bandwidth.

#[path = "support/perftest.rs"]
mod perftest;
use examples::perftest::child::{bw_row, run_pair, server_and_client, Outcome};
use perftest::{args, ours};
use std::time::Duration;

const IGNORE: &str = "needs an RDMA device: run `cargo xtask test`";

fn check_row(who: &str, o: &Outcome, size: f64, iters: f64) -> [f64; 5] {
    assert!(o.ok(), "{who} failed:\n{o}");
    assert!(
        o.stdout.contains(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        ),
        "{who} printed no perftest header:\n{o}"
    );
    let row = bw_row(&o.stdout).unwrap_or_else(|| panic!("{who} printed no result row:\n{o}"));
    assert_eq!(row[0], size, "{who}: #bytes\n{o}");
    assert_eq!(row[1], iters, "{who}: #iterations\n{o}");
    assert!(row[3] > 0.0, "{who}: average bandwidth not positive\n{o}");
    assert!(row[4] > 0.0, "{who}: message rate not positive\n{o}");
    row
}

/// Runs `server_prog` and `client_prog` with the same options and checks both reports.
fn pair(tool: &str, rust_is_client: bool, port: u16, extra: &[&str], size: f64, iters: f64) {
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    let (s, c) = run_pair(
        (srv, args(port, extra, false)),
        (cli, args(port, extra, true)),
        port,
        Duration::from_secs(120),
    );
    let crow = check_row("client", &c, size, iters);
    let srow = check_row("server", &s, size, iters);
    if tool != "ib_send_bw" {
        // A one-sided server prints the client's results, received over TCP.
        assert_eq!(
            crow, srow,
            "server's row differs from the client's\n{s}\n{c}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_rust_client_c_server() {
    let _ = IGNORE;
    pair(
        "ib_write_bw",
        true,
        19101,
        &["-n", "200", "-s", "65536"],
        65536.0,
        200.0,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_c_client_rust_server() {
    pair(
        "ib_write_bw",
        false,
        19102,
        &["-n", "200", "-s", "65536"],
        65536.0,
        200.0,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_post_list_and_moderation() {
    pair(
        "ib_write_bw",
        true,
        19103,
        &["-n", "400", "-s", "64", "-t", "64", "-Q", "8", "-l", "8"],
        64.0,
        400.0,
    );
}

/// perftest's lines about moderation on stdout, C's and the port's alike: a post
/// list without `-Q` moderates by its size, and `-Q` with large messages warns.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn moderation_lines_are_cs() {
    let cases: [(&[&str], &str); 2] = [
        (
            &["-n", "400", "-s", "64", "-t", "64", "-l", "8"],
            "Post List requested - CQ moderation will be the size of the post list",
        ),
        (
            &["-n", "200", "-s", "65536", "-Q", "4"],
            "Warning: Large message requested and CQ moderation enabled",
        ),
    ];
    for (i, (extra, line)) in cases.into_iter().enumerate() {
        let port = 19294 + i as u16;
        let (s, c) = run_pair(
            ("ib_write_bw", args(port, extra, false)),
            (ours("ib_write_bw"), args(port, extra, true)),
            port,
            Duration::from_secs(120),
        );
        for (who, o) in [("C server", &s), ("Rust client", &c)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            assert!(
                o.stdout.contains(line),
                "{who} did not print {line:?}:\n{o}"
            );
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_two_qps_gbits() {
    let extra = ["-n", "100", "-s", "4096", "-q", "2", "--report_gbits"];
    let port = 19104;
    let (s, c) = run_pair(
        ("ib_write_bw", args(port, &extra, false)),
        (env!("CARGO_BIN_EXE_ib_write_bw"), args(port, &extra, true)),
        port,
        Duration::from_secs(120),
    );
    assert!(c.ok() && s.ok(), "{s}\n{c}");
    assert!(c.stdout.contains("BW average[Gb/sec]"), "{c}");
    let row = bw_row(&c.stdout).expect("row");
    assert_eq!((row[0], row[1]), (4096.0, 200.0), "2 QPs x 100\n{c}");
}

/// `--disable_pcie_relaxed` is accepted and obeyed as C obeys it: both sides of a
/// `ib_read_bw` pair, which registers with relaxed ordering by default, print
/// "PCIe relax order: OFF", and without the option both print ON.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_disable_pcie_relaxed_both_ways() {
    let port = 19107;
    for (extra, want) in [
        (&["-n", "100", "--disable_pcie_relaxed"][..], "OFF"),
        (&["-n", "100"][..], "ON"),
    ] {
        for rust_is_client in [true, false] {
            let (srv, cli) = server_and_client("ib_read_bw", ours("ib_read_bw"), rust_is_client);
            let (s, c) = run_pair(
                (srv, args(port, extra, false)),
                (cli, args(port, extra, true)),
                port,
                Duration::from_secs(120),
            );
            check_row("client", &c, 65536.0, 100.0);
            check_row("server", &s, 65536.0, 100.0);
            let line = format!(" PCIe relax order: {want}\n");
            for (who, o) in [("server", &s), ("client", &c)] {
                assert!(
                    o.stdout.contains(&line),
                    "{who} {extra:?}: no {line:?}\n{o}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_rust_client_c_server() {
    pair(
        "ib_read_bw",
        true,
        19111,
        &["-n", "200", "-s", "65536"],
        65536.0,
        200.0,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_c_client_rust_server() {
    pair(
        "ib_read_bw",
        false,
        19112,
        &["-n", "200", "-s", "65536", "-o", "4"],
        65536.0,
        200.0,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_rust_client_c_server() {
    pair(
        "ib_send_bw",
        true,
        19121,
        &["-n", "200", "-s", "4096"],
        4096.0,
        200.0,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_c_client_rust_server() {
    pair(
        "ib_send_bw",
        false,
        19122,
        &["-n", "200", "-s", "4096"],
        4096.0,
        200.0,
    );
}

/// With no `-n` each side counts perftest's default (1,000 SENDs: only
/// `ib_write_bw` runs 5,000), which is not exchanged: a side counting otherwise
/// would wait for messages never sent. Both ways, with C's own command line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_default_iterations_both_ways() {
    for (rust_is_client, port) in [(true, 19290), (false, 19291)] {
        pair(
            "ib_send_bw",
            rust_is_client,
            port,
            &["-s", "4096"],
            4096.0,
            1000.0,
        );
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_duration_rust_pair() {
    let ours = env!("CARGO_BIN_EXE_ib_write_bw");
    let extra = ["-D", "2", "-s", "4096"];
    let port = 19105;
    let (s, c) = run_pair(
        (ours, args(port, &extra, false)),
        (ours, args(port, &extra, true)),
        port,
        Duration::from_secs(60),
    );
    let row = check_row(
        "client",
        &c,
        4096.0,
        bw_row(&c.stdout).map_or(0.0, |r| r[1]),
    );
    assert!(row[1] > 0.0, "{c}");
    check_row("server", &s, 4096.0, row[1]);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn malformed_peer_is_an_error_not_a_hang() {
    use std::io::{Read, Write};
    // A fake client that announces version 5.00: our server must refuse it quickly.
    let port = 19106;
    let srv = examples::perftest::child::spawn_listening(
        env!("CARGO_BIN_EXE_ib_write_bw"),
        &args(port, &["-n", "10"], false),
        port,
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"5.00");
    s.write_all(&v).unwrap();
    let mut back = [0u8; 16];
    let _ = s.read(&mut back);
    let o = srv.wait(Duration::from_secs(20));
    assert!(o.status.is_some(), "server hung on a wrong version\n{o}");
    assert!(!o.ok(), "server accepted version 5.00\n{o}");
    assert!(o.stderr.contains("5.70"), "no clear error\n{o}");
}

/// A peer announcing a cycle buffer of 4 GiB - 1 (perftest sends its page size,
/// and the larger of the two sizes every queue pair's buffer) is refused at once,
/// naming the field, before anything is allocated or pinned: taken as it came, it
/// made the server register 8 GiB.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_peer_announcing_a_huge_cycle_buffer_is_refused() {
    use std::io::{Read, Write};
    let port = 19108;
    let srv = examples::perftest::child::spawn_listening(
        env!("CARGO_BIN_EXE_ib_write_bw"),
        &args(port, &["-n", "10"], false),
        port,
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"6.06");
    s.write_all(&v).unwrap();
    s.read_exact(&mut v).unwrap();
    // The system data: the cycle buffer, then the cache line.
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let mut theirs = [0u8; 4];
    let _ = s.read_exact(&mut theirs);
    let _ = s.write_all(&64u32.to_be_bytes());
    let _ = s.read_exact(&mut theirs);
    // The MTU, so that an unchecked server goes on to register what it was told.
    let _ = s.write_all(b"5\0");
    let o = srv.wait(Duration::from_secs(20));
    assert!(
        o.status.is_some(),
        "server hung on a huge cycle buffer\n{o}"
    );
    assert!(!o.ok(), "server took a cycle buffer of 4 GiB\n{o}");
    assert!(
        o.stderr.contains("cycle buffer of 4294967295 bytes"),
        "no clear error\n{o}"
    );
}

/// Checks a duration-mode row: positive figures, and iterations = message rate x the
/// sampled window (`secs`), as both perftest and the port compute them.
fn check_duration_row(who: &str, o: &Outcome, size: f64, secs: Option<f64>) -> [f64; 5] {
    let row = check_row(who, o, size, bw_row(&o.stdout).map_or(-1.0, |r| r[1]));
    assert!(row[1] > 0.0, "{who}: no iteration counted\n{o}");
    let window = row[1] / (row[4] * 1e6);
    if let Some(secs) = secs {
        assert!(
            (window - secs).abs() < 0.05 * secs,
            "{who}: {} iterations at {} Mpps is {window:.3} s, not the {secs} s window\n{o}",
            row[1],
            row[4]
        );
    }
    let bw = size * row[1] / window / 1048576.0;
    assert!(
        (bw - row[3]).abs() < 0.02 * bw + 0.01,
        "{who}: average bandwidth {} is not size x rate ({bw:.2})\n{o}",
        row[3]
    );
    row
}

/// `-D 4`: one second of margin at each end, two seconds sampled. The sampled
/// window is checked on the Rust side only: the C tool's own window stretches
/// when its process is starved of CPU (seen on a loaded 2-core machine: 4.8 s
/// for 2), which says nothing about the port.
fn duration_pair(tool: &str, rust_is_client: bool, port: u16) {
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    let extra = ["-D", "4", "-s", "4096"];
    let (s, c) = run_pair(
        (srv, args(port, &extra, false)),
        (cli, args(port, &extra, true)),
        port,
        Duration::from_secs(60),
    );
    let ours = |rust: bool| rust.then_some(2.0);
    let crow = check_duration_row("client", &c, 4096.0, ours(rust_is_client));
    if tool == "ib_send_bw" {
        // The receiver counts its own window, which starts at its first receive.
        check_duration_row("server", &s, 4096.0, ours(!rust_is_client));
    } else {
        let srow = check_row("server", &s, 4096.0, crow[1]);
        assert_eq!(
            crow, srow,
            "server's row differs from the client's\n{s}\n{c}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_duration_rust_client_c_server() {
    duration_pair("ib_send_bw", true, 19131);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_duration_c_client_rust_server() {
    duration_pair("ib_send_bw", false, 19132);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_duration_rust_client_c_server() {
    duration_pair("ib_write_bw", true, 19133);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_duration_c_client_rust_server() {
    duration_pair("ib_read_bw", false, 19134);
}

/// The 23 rows of `-a` (2 B .. 8 MiB), each with `iters` iterations.
fn check_all_sizes(who: &str, o: &Outcome, iters: f64) {
    assert!(o.ok(), "{who} failed:\n{o}");
    let rows = examples::perftest::child::rows_after(&o.stdout, "BW average");
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    let want: Vec<f64> = (1..24).map(|i| (1u64 << i) as f64).collect();
    assert_eq!(sizes, want, "{who}: the sizes of -a\n{o}");
    for r in &rows {
        assert_eq!(r.len(), 5, "{who}: row {r:?}\n{o}");
        assert_eq!(r[1], iters, "{who}: #iterations of size {}\n{o}", r[0]);
        // perftest prints 0.00 MB/s for the smallest sizes: only the rate is > 0.
        assert!(r[3] >= 0.0 && r[4] > 0.0, "{who}: size {}\n{o}", r[0]);
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_all_sizes_rust_client_c_server() {
    let port = 19135;
    let extra = ["-a", "-n", "5"];
    let (s, c) = run_pair(
        ("ib_write_bw", args(port, &extra, false)),
        (env!("CARGO_BIN_EXE_ib_write_bw"), args(port, &extra, true)),
        port,
        Duration::from_secs(60),
    );
    check_all_sizes("client", &c, 5.0);
    // The one-sided server prints the client's last result only.
    let last = examples::perftest::child::rows_after(&c.stdout, "BW average")
        .last()
        .cloned()
        .unwrap_or_default();
    let srow = check_row("server", &s, 8388608.0, 5.0);
    assert_eq!(srow.to_vec(), last, "{s}\n{c}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_all_sizes_c_client_rust_server() {
    let port = 19136;
    let extra = ["-a", "-n", "5"];
    let (s, c) = run_pair(
        (env!("CARGO_BIN_EXE_ib_send_bw"), args(port, &extra, false)),
        ("ib_send_bw", args(port, &extra, true)),
        port,
        Duration::from_secs(60),
    );
    check_all_sizes("client", &c, 5.0);
    check_all_sizes("server", &s, 5.0);
}
