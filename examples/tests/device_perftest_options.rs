//! perftest's `-b` (bidirectional bandwidth), `--output` (one figure a size),
//! `-I` (inline data) and `-e` (sleeping on completion events) in the Rust ports, against Debian's perftest (C) in both
//! directions, with the C tools' own command lines.
//!
//! With `-b` both sides send; each prints its own size and iterations with both
//! sides' figures summed, so the two rows must be the same. A C SEND peer only
//! finishes once it has received all our messages, and a C peer of any verb
//! only once the exchanges after the run came in its order.

#[path = "support/perftest.rs"]
mod perftest;
use examples::perftest::child::{bw_row, lat_row, rows_after, run_pair, Outcome};
use examples::perftest::inline::NOT_RECOGNIZED;
use examples::perftest::report::RESULT_LINE as DASHES;
use perftest::{args, ours, pair};
use std::process::Command;
use std::time::Duration;

const IGNORE: &str = "needs an RDMA device: run `cargo xtask test`";

/// The result row of a side that ran `-b`, checked; its title says so.
fn duplex_row(who: &str, o: &Outcome, tool: &str, size: f64, iters: f64) -> [f64; 5] {
    assert!(o.ok(), "{who} failed:\n{o}");
    let title = match tool {
        "ib_write_bw" => "RDMA_Write Bidirectional BW Test",
        "ib_read_bw" => "RDMA_Read Bidirectional BW Test",
        _ => "Send Bidirectional BW Test",
    };
    assert!(o.stdout.contains(title), "{who} printed no {title:?}:\n{o}");
    let row = bw_row(&o.stdout).unwrap_or_else(|| panic!("{who} printed no result row:\n{o}"));
    assert_eq!(
        (row[0], row[1]),
        (size, iters),
        "{who}: #bytes, #iterations\n{o}"
    );
    assert!(
        row[3] > 0.0 && row[4] > 0.0,
        "{who}: figures not positive\n{o}"
    );
    row
}

/// `-b -n 200`: both finish, and both rows are the two sides' sum.
fn duplex_pair(tool: &str, rust_is_client: bool, port: u16, size: u64) {
    let size_arg = size.to_string();
    let (s, c) = pair(
        tool,
        rust_is_client,
        port,
        &["-b", "-n", "200", "-s", &size_arg],
    );
    let crow = duplex_row("client", &c, tool, size as f64, 200.0);
    let srow = duplex_row("server", &s, tool, size as f64, 200.0);
    assert_eq!(crow, srow, "the sides' sums differ\n{s}\n{c}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_bidirectional_rust_client_c_server() {
    let _ = IGNORE;
    duplex_pair("ib_write_bw", true, 19141, 65536);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_bw_bidirectional_c_client_rust_server() {
    duplex_pair("ib_write_bw", false, 19142, 65536);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_bw_bidirectional_rust_client_c_server() {
    duplex_pair("ib_read_bw", true, 19143, 65536);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_bidirectional_rust_client_c_server() {
    duplex_pair("ib_send_bw", true, 19144, 4096);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_bidirectional_c_client_rust_server() {
    duplex_pair("ib_send_bw", false, 19145, 4096);
}

/// `-b -a`: every size on both sides, each row the sum of both.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_and_write_bw_bidirectional_all_sizes() {
    for (tool, rust_is_client, port) in [("ib_send_bw", true, 19146), ("ib_write_bw", false, 19147)]
    {
        let (s, c) = pair(tool, rust_is_client, port, &["-b", "-a", "-n", "5"]);
        assert!(s.ok() && c.ok(), "{tool}:\n{s}\n{c}");
        let rows = |o: &Outcome| rows_after(&o.stdout, "BW average");
        let (srows, crows) = (rows(&s), rows(&c));
        let sizes: Vec<f64> = crows.iter().map(|r| r[0]).collect();
        let want: Vec<f64> = (1..24).map(|i| (1u64 << i) as f64).collect();
        assert_eq!(sizes, want, "{tool}: the sizes of -a\n{c}");
        assert_eq!(srows, crows, "{tool}: the sides' sums differ\n{s}\n{c}");
        assert!(
            crows.iter().all(|r| r[1] == 5.0 && r[4] > 0.0),
            "{tool}\n{c}"
        );
    }
}

/// `-b -D 4` on SEND: no reports are swapped; each side prints its own window,
/// which counts the messages it sent and received.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_bidirectional_duration_counts_both_ways() {
    for (rust_is_client, port) in [(true, 19148), (false, 19149)] {
        let (s, c) = pair(
            "ib_send_bw",
            rust_is_client,
            port,
            &["-b", "-D", "4", "-s", "4096"],
        );
        let (rust, c_side) = if rust_is_client { (&c, &s) } else { (&s, &c) };
        for (who, o) in [("port", rust), ("C", c_side)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            let row = bw_row(&o.stdout).unwrap_or_else(|| panic!("{who}: no row\n{o}"));
            assert!(row[1] > 0.0 && row[4] > 0.0, "{who}: nothing counted\n{o}");
        }
        // The port's window is 2 s of the 4: its count over its rate.
        let row = bw_row(&rust.stdout).unwrap();
        let window = row[1] / (row[4] * 1e6);
        assert!((window - 2.0).abs() < 0.1, "window {window:.3} s\n{rust}");
        // Both directions are counted: C's row, on the same wire, is of the same
        // order; a port counting one way would show about half.
        let theirs = bw_row(&c_side.stdout).unwrap();
        let ratio = row[1] / theirs[1];
        assert!(
            (0.6..1.6).contains(&ratio),
            "port {} against C {}\n{s}\n{c}",
            row[1],
            theirs[1]
        );
    }
}

/// The one figure `--output` prints: C's `"%lf\n"`, and nothing else on stdout
/// but, for READ on a device perftest does not know, the dashed line of its
/// inline warning.
fn only_figure(who: &str, o: &Outcome, read: bool) -> f64 {
    assert!(o.ok(), "{who} failed:\n{o}");
    let mut lines: Vec<&str> = o.stdout.lines().collect();
    if read {
        assert_eq!(
            lines.first(),
            Some(&DASHES),
            "{who}: no inline warning\n{o}"
        );
        assert!(o.stderr.contains(NOT_RECOGNIZED), "{who}\n{o}");
        lines.remove(0);
    }
    assert_eq!(lines.len(), 1, "{who} printed more than the figure:\n{o}");
    let decimals = lines[0].split('.').nth(1).map_or(0, str::len);
    assert_eq!(decimals, 6, "{who}: not %lf's six decimals: {:?}", lines[0]);
    let v: f64 = lines[0]
        .parse()
        .unwrap_or_else(|_| panic!("{who}: {:?}", lines[0]));
    assert!(v > 0.0, "{who}: {v}\n{o}");
    v
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn output_prints_the_figure_alone_both_ways() {
    let cases: [(&str, &[&str], u16); 6] = [
        ("ib_write_bw", &["--output=bandwidth", "-n", "200"], 19151),
        (
            "ib_send_bw",
            &["--output=message_rate", "-n", "200", "-s", "4096"],
            19152,
        ),
        (
            "ib_read_bw",
            &["--output=bandwidth", "-b", "-n", "200"],
            19153,
        ),
        (
            "ib_send_lat",
            &["--output=latency", "-n", "500", "-s", "64"],
            19154,
        ),
        ("ib_write_lat", &["--output=latency", "-n", "500"], 19155),
        ("ib_read_lat", &["--output", "latency", "-n", "500"], 19156),
    ];
    for (tool, extra, port) in cases {
        for rust_is_client in [true, false] {
            let (s, c) = pair(tool, rust_is_client, port, extra);
            let read = tool.starts_with("ib_read");
            let cv = only_figure(&format!("{tool} client"), &c, read);
            if tool == "ib_read_lat" {
                // perftest's READ latency server prints nothing.
                assert!(s.ok(), "{tool} server:\n{s}");
                assert_eq!(s.stdout.trim(), DASHES, "{tool} server:\n{s}");
                continue;
            }
            let sv = only_figure(&format!("{tool} server"), &s, read);
            if tool == "ib_write_bw" || tool == "ib_read_bw" {
                // The one-sided server prints the client's figure; with -b both
                // print the sum.
                assert_eq!(cv, sv, "{tool}:\n{s}\n{c}");
            }
        }
    }
}

/// What C refuses, the port refuses in C's words, before touching a device.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn bidirectional_latency_and_wrong_output_are_refused_as_c_refuses_them() {
    let cases: [(&str, &[&str], &str); 12] = [
        (
            "ib_send_lat",
            &["-l", "2"],
            "Post list is supported in BW tests only",
        ),
        (
            "ib_read_bw",
            &["-I", "16"],
            "Inline feature not available on READ/Atomic verbs",
        ),
        (
            "ib_write_lat",
            &["-o", "4"],
            "Setting Outstanding reads only available on READ verb",
        ),
        (
            "ib_read_bw",
            &["-r", "2"],
            "On RDMA verbs rx depth can be only 1",
        ),
        ("ib_write_bw", &["-H"], " Available only on Latency tests"),
        ("ib_read_bw", &["-U"], " is Available only on Latency tests"),
        (
            "ib_write_lat",
            &["-e"],
            "Events feature not available on WRITE verb",
        ),
        (
            "ib_send_bw",
            &["-e", "-D", "4"],
            "Duration mode doesn't work with events",
        ),
        (
            "ib_send_lat",
            &["-b"],
            "Bidirectional is only available in BW test",
        ),
        (
            "ib_write_bw",
            &["--output=latency"],
            "Output verbosity level for BW can be",
        ),
        (
            "ib_read_lat",
            &["--output=bandwidth"],
            "Output verbosity level for LAT can be",
        ),
        (
            "ib_send_bw",
            &["--output=bw"],
            "Invalid verbosity level output flag",
        ),
    ];
    for (tool, extra, why) in cases {
        for prog in [tool, ours(tool)] {
            let out = Command::new(prog).args(extra).output().expect(prog);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{prog} {extra:?} ran");
            assert!(stderr.contains(why), "{prog} {extra:?}: {stderr}");
        }
    }
}

/// `-I` on Soft-RoCE, which perftest does not recognize: both sides turn inline
/// data off, warn as C warns, and still run.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn inline_on_an_unrecognized_device_is_turned_off_as_c_does() {
    for (rust_is_client, port) in [(true, 19157), (false, 19158)] {
        let extra = ["-I", "64", "-s", "64", "-n", "200"];
        let (s, c) = pair("ib_send_lat", rust_is_client, port, &extra);
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            assert_eq!(o.stdout.lines().next(), Some(DASHES), "{who}\n{o}");
            assert!(o.stderr.contains(NOT_RECOGNIZED), "{who}\n{o}");
            assert!(o.stdout.contains(" Max inline data : 0[B]"), "{who}\n{o}");
        }
        let row = lat_row(&c.stdout).unwrap_or_else(|| panic!("no latency row\n{c}"));
        assert_eq!((row[0], row[1]), (64.0, 200.0), "{c}");
    }
}

/// `-e` against C's `-e`, both ways: every pair reaches its report, and both
/// sides say they wait on events.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn events_both_ways() {
    let cases: [(&str, &[&str], u16); 5] = [
        ("ib_send_lat", &["-e", "-s", "64", "-n", "300"], 19161),
        ("ib_read_lat", &["-e", "-s", "64", "-n", "300"], 19162),
        ("ib_send_bw", &["-e", "-s", "4096", "-n", "300"], 19163),
        ("ib_read_bw", &["-e", "-s", "65536", "-n", "300"], 19164),
        (
            "ib_send_bw",
            &["-e", "-b", "-s", "4096", "-n", "300"],
            19165,
        ),
    ];
    for (tool, extra, port) in cases {
        for rust_is_client in [true, false] {
            let (s, c) = pair(tool, rust_is_client, port, extra);
            let who =
                |side: &str| format!("{tool} {extra:?} {side} (Rust client: {rust_is_client})");
            for (side, o) in [("server", &s), ("client", &c)] {
                assert!(o.ok(), "{} failed:\n{o}", who(side));
                assert!(
                    o.stdout.contains(" Test with events. Using "),
                    "{}\n{o}",
                    who(side)
                );
            }
            if tool.ends_with("_lat") {
                let row = lat_row(&c.stdout).unwrap_or_else(|| panic!("{}\n{c}", who("client")));
                assert_eq!((row[0], row[1]), (64.0, 300.0), "{}\n{c}", who("client"));
            } else {
                let row = bw_row(&c.stdout).unwrap_or_else(|| panic!("{}\n{c}", who("client")));
                assert_eq!(row[1], 300.0, "{}\n{c}", who("client"));
                assert!(row[3] > 0.0, "{}\n{c}", who("client"));
            }
        }
    }
}

/// The share of its wall time the client spent off the CPU (asleep), from
/// bash's `time`.
fn idle_share(o: &Outcome) -> f64 {
    let line = o
        .stderr
        .lines()
        .find(|l| l.starts_with("cpu "))
        .unwrap_or_else(|| panic!("{o}"));
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(v.len(), 3, "{line}");
    eprintln!("client: {line} (user, system, real seconds)");
    1.0 - (v[0] + v[1]) / v[2].max(1e-3)
}

/// `-e` sleeps: the client of a Rust pair of `ib_send_lat` spends a good part of
/// its time off the CPU with it (about half here), and little spinning without
/// it (under a tenth; Soft-RoCE's work is in the client's system calls either
/// way).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn events_sleep_instead_of_spinning() {
    let prog = ours("ib_send_lat");
    let share = |events: bool, port: u16| {
        let mut extra = vec!["-s", "64", "-n", "20000"];
        if events {
            extra.push("-e");
        }
        let mut client = vec![
            "-c".to_string(),
            "TIMEFORMAT='cpu %U %S %R'; time \"$0\" \"$@\"".to_string(),
            prog.to_string(),
        ];
        client.extend(args(port, &extra, true));
        let (s, c) = run_pair(
            (prog, args(port, &extra, false)),
            ("bash", client),
            port,
            Duration::from_secs(120),
        );
        assert!(s.ok() && c.ok(), "events {events}:\n{s}\n{c}");
        idle_share(&c)
    };
    let asleep = share(true, 19166);
    let spinning = share(false, 19167);
    assert!(
        asleep > 0.25 && asleep > 2.0 * spinning,
        "with -e the client was off the CPU {asleep:.2} of its time, spinning {spinning:.2}"
    );
}

/// The sample lists of `-U` and `-H` in a latency tool's output: each list's
/// unit and values, in the order printed.
fn sample_lists(text: &str) -> Vec<(String, Vec<f64>)> {
    let mut lists: Vec<(String, Vec<f64>)> = Vec::new();
    for line in text.lines() {
        if let Some(units) = line.strip_prefix("#, ") {
            lists.push((units.to_string(), Vec::new()));
        } else if let (Some((n, v)), Some(list)) = (line.split_once(", "), lists.last_mut()) {
            if n.parse::<usize>() == Ok(list.1.len() + 1) {
                list.1.push(v.parse().unwrap_or(f64::NAN));
            }
        }
    }
    lists
}

/// `-U -H`: the unsorted gaps, then the sorted ones without the two largest,
/// then the table's header again and the row, as C prints them; checked on the
/// port's side and the C side alike, both ways.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn latency_sample_lists_follow_c_both_ways() {
    for (tool, port) in [("ib_send_lat", 19171), ("ib_read_lat", 19172)] {
        for rust_is_client in [true, false] {
            let (s, c) = pair(
                tool,
                rust_is_client,
                port,
                // -H by C's own long name (sic).
                &["-U", "--report-histogrm", "-s", "64", "-n", "200"],
            );
            assert!(s.ok() && c.ok(), "{tool}:\n{s}\n{c}");
            let sides: Vec<&Outcome> = if tool == "ib_read_lat" {
                vec![&c]
            } else {
                vec![&s, &c]
            };
            for o in sides {
                let lists = sample_lists(&o.stdout);
                assert_eq!(lists.len(), 2, "{tool}: two lists\n{o}");
                assert!(lists.iter().all(|(u, _)| u == "usec"), "{tool}\n{o}");
                let (unsorted, sorted) = (&lists[0].1, &lists[1].1);
                assert_eq!((unsorted.len(), sorted.len()), (199, 197), "{tool}\n{o}");
                assert!(
                    sorted.windows(2).all(|w| w[0] <= w[1]),
                    "{tool}: not sorted\n{o}"
                );
                let mut all = unsorted.clone();
                all.sort_by(|a, b| a.total_cmp(b));
                assert_eq!(&all[..197], &sorted[..], "{tool}: the same samples\n{o}");
                let after = o.stdout.rsplit("#, usec").next().unwrap_or_default();
                assert!(
                    after.contains(" #bytes #iterations"),
                    "{tool}: header again\n{o}"
                );
                let row = lat_row(after).unwrap_or_else(|| panic!("{tool}: no row\n{o}"));
                assert!((row[2] - sorted[0]).abs() < 0.006, "{tool}: t_min\n{o}");
            }
        }
    }
}

/// `-C`: the same table in cycles of the time-stamp counter, at the rate
/// `/proc/cpuinfo` gives: the port's client in cycles against the C server's
/// microseconds of the same round trips.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn latency_in_cycles() {
    let mhz: f64 = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("cpu MHz")?
                .split(':')
                .nth(1)?
                .trim()
                .parse()
                .ok()
        })
        .expect("cpu MHz in /proc/cpuinfo");
    let port = 19174;
    let run = ["-s", "64", "-n", "2000"];
    let mut cycles = vec!["-C"];
    cycles.extend(run);
    let (s, c) = run_pair(
        ("ib_send_lat", args(port, &run, false)),
        (ours("ib_send_lat"), args(port, &cycles, true)),
        port,
        Duration::from_secs(120),
    );
    assert!(s.ok() && c.ok(), "\n{s}\n{c}");
    let usec = lat_row(&s.stdout).unwrap_or_else(|| panic!("{s}"))[4];
    let ticks = lat_row(&c.stdout).unwrap_or_else(|| panic!("{c}"))[4];
    let rate = ticks / usec;
    assert!(
        (rate / mhz - 1.0).abs() < 0.15,
        "{ticks} cycles against C's {usec} usec: {rate:.0} a microsecond, cpu MHz {mhz}"
    );
}

/// `-b -N` (no peak) on SEND: both sides time the whole loop and print the same
/// sum, both ways.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_bw_bidirectional_without_the_peak() {
    for (rust_is_client, port) in [(true, 19177), (false, 19178)] {
        let (s, c) = pair(
            "ib_send_bw",
            rust_is_client,
            port,
            &["-b", "-N", "-n", "300", "-s", "4096"],
        );
        let crow = duplex_row("client", &c, "ib_send_bw", 4096.0, 300.0);
        let srow = duplex_row("server", &s, "ib_send_bw", 4096.0, 300.0);
        assert_eq!(crow, srow, "\n{s}\n{c}");
        assert_eq!(crow[2], 0.0, "no peak\n{c}");
    }
}

/// `--use_old_post_send`, which scripts pass to C: accepted, and on Soft-RoCE
/// both print the old interface, as C always uses it there.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn use_old_post_send_is_accepted_and_both_say_so() {
    for (rust_is_client, port) in [(true, 19175), (false, 19176)] {
        let extra = ["--use_old_post_send", "-n", "100", "-s", "4096"];
        let (s, c) = pair("ib_write_bw", rust_is_client, port, &extra);
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            assert!(o.stdout.contains(" ibv_wr* API     : OFF\n"), "{who}\n{o}");
        }
    }
}

/// `--report-both` with `-b`: after the summed row, this side's figures and the
/// peer's under their own headers; each side's "Remote" row is the other's
/// "Local" one, and the two add up to the sum.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn report_both_splits_a_bidirectional_run() {
    for (tool, rust_is_client, port) in [("ib_write_bw", true, 19179), ("ib_send_bw", false, 19180)]
    {
        let extra = ["-b", "--report-both", "-n", "200", "-s", "4096"];
        let (s, c) = pair(tool, rust_is_client, port, &extra);
        assert!(s.ok() && c.ok(), "{tool}:\n{s}\n{c}");
        let split = |o: &Outcome| -> (Vec<f64>, Vec<f64>, Vec<f64>) {
            let sum = bw_row(&o.stdout).unwrap_or_else(|| panic!("{o}")).to_vec();
            let (_, after) = o
                .stdout
                .split_once(" Local results: ")
                .unwrap_or_else(|| panic!("{o}"));
            let (local, remote) = after
                .split_once(" Remote results: ")
                .unwrap_or_else(|| panic!("{o}"));
            let row = |t: &str| bw_row(t).unwrap_or_else(|| panic!("{t}")).to_vec();
            (sum, row(local), row(remote))
        };
        let (s_sum, s_local, s_remote) = split(&s);
        let (c_sum, c_local, c_remote) = split(&c);
        assert_eq!(s_sum, c_sum, "{tool}");
        assert_eq!(
            (&s_local, &s_remote),
            (&c_remote, &c_local),
            "{tool}:\n{s}\n{c}"
        );
        // The average is printed with two decimals: the parts add up within them.
        assert!(
            (s_local[3] + s_remote[3] - s_sum[3]).abs() <= 0.011,
            "{tool}:\n{s}"
        );
    }
}

/// `-m` above the port's active MTU (Soft-RoCE's is 1024) is brought down to it,
/// with perftest's two lines, on both sides; the run goes on at 1024 bytes, as C
/// runs it. Both ways, with C's own command line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn an_mtu_above_the_active_one_is_brought_down_as_c_does() {
    for (rust_is_client, port) in [(true, 19292), (false, 19293)] {
        let extra = ["-m", "4096", "-n", "200", "-s", "4096"];
        let (s, c) = pair("ib_write_bw", rust_is_client, port, &extra);
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            assert!(
                o.stdout.contains("Requested mtu is higher than active mtu")
                    && o.stdout.contains("Changing to active mtu - 3"),
                "{who}\n{o}"
            );
            assert!(
                o.stdout.contains(" Mtu             : 1024[B]"),
                "{who}\n{o}"
            );
        }
        let row = bw_row(&c.stdout).unwrap_or_else(|| panic!("no bandwidth row\n{c}"));
        assert_eq!((row[0], row[1]), (4096.0, 200.0), "{c}");
    }
}

/// Exit statuses scripts see: perftest exits 1 after `-h` and `-V` (its parser's
/// HELP_EXIT and VERSION_EXIT make `main` return FAILURE) and for an option it
/// does not know; the ports exit as C does, and `-V` prints the same line.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn help_version_and_unknown_options_exit_as_c_does() {
    for tool in ["ib_send_bw", "ib_read_lat"] {
        for flags in [&["-V"][..], &["-h"], &["--no-such-option"]] {
            let run = |prog: &str| Command::new(prog).args(flags).output().expect(prog);
            let (c, rust) = (run(tool), run(ours(tool)));
            assert_eq!(c.status.code(), Some(1), "C {tool} {flags:?}");
            assert_eq!(
                rust.status.code(),
                Some(1),
                "Rust {tool} {flags:?}: {rust:?}"
            );
            if flags == ["-V"] {
                assert_eq!(rust.stdout, c.stdout, "{tool} -V");
            }
        }
    }
}

/// Command lines perftest refuses, refused byte for byte as C refuses them: the
/// same status (1), the same stdout (the dashed line before a refusal of
/// `force_dependecies`, and its warnings) and the same stderr (the message as C
/// writes it, then " Parser function exited with Error" after a refusal of the
/// parser itself). Each run gets 20 s: a command line one side takes would start
/// a server and wait for a client, and fail here.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn refusals_print_what_c_prints() {
    use examples::cm::child::spawn;
    let cases: [(&str, &[&str]); 37] = [
        // The parser's own checks, in the command line's order.
        ("ib_write_bw", &["-n", "4"]),
        ("ib_write_bw", &["-n", "100000001"]),
        ("ib_send_bw", &["-t", "0"]),
        ("ib_send_bw", &["-t", "15001"]),
        ("ib_read_bw", &["-x", "65"]),
        ("ib_send_lat", &["-q", "2"]),
        ("ib_read_lat", &["-q", "1"]),
        ("ib_write_bw", &["-q", "16385"]),
        ("ib_write_bw", &["-Q", "0"]),
        ("ib_write_bw", &["-Q", "1025"]),
        ("ib_send_bw", &["-S", "16"]),
        ("ib_write_bw", &["-s", "0"]),
        ("ib_write_bw", &["-s", "2048M"]),
        ("ib_write_bw", &["-s", "2147483648"]),
        ("ib_send_bw", &["-i", "0"]),
        ("ib_write_bw", &["-D", "0"]),
        ("ib_read_bw", &["-r", "20000"]),
        ("ib_read_bw", &["-r", "2"]),
        ("ib_read_bw", &["-I", "16"]),
        ("ib_write_lat", &["-o", "4"]),
        ("ib_write_lat", &["-e"]),
        ("ib_send_lat", &["-b", "-N"]),
        ("ib_send_lat", &["-N", "-b"]),
        ("ib_write_bw", &["-H"]),
        ("ib_read_bw", &["-U"]),
        ("ib_send_bw", &["--output=bw"]),
        ("ib_write_bw", &["host", "extra"]),
        // Connection types, refused where they are read.
        ("ib_write_bw", &["-c", "rc"]),
        ("ib_read_bw", &["-c", "UC"]),
        ("ib_write_bw", &["-c", "UD"]),
        // force_dependecies: the dashed line on stdout first.
        ("ib_send_lat", &["-l", "2"]),
        ("ib_write_bw", &["-n", "10", "-l", "3"]),
        ("ib_write_bw", &["-n", "12", "-l", "4", "-Q", "3"]),
        ("ib_send_bw", &["-e", "-D", "4"]),
        ("ib_send_bw", &["-D", "2", "-a"]),
        ("ib_send_bw", &["--run_infinitely", "-e"]),
        ("ib_write_bw", &["--output=latency"]),
    ];
    for (tool, args) in cases {
        let t = Duration::from_secs(20);
        let c = spawn(tool, args).wait(t);
        let rust = spawn(ours(tool), args).wait(t);
        let code = |s: Option<std::process::ExitStatus>| s.and_then(|s| s.code());
        assert_eq!(code(c.status), Some(1), "C {tool} {args:?}:\n{c}");
        assert_eq!(
            (code(rust.status), &rust.stdout, &rust.stderr),
            (code(c.status), &c.stdout, &c.stderr),
            "{tool} {args:?}: the port (left) and C (right) differ"
        );
    }
}

/// More than 64 queue pairs (C's bound is 16384; the port's was 64), both ways.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_hundred_queue_pairs_both_ways() {
    for (rust_is_client, port) in [(true, 19316), (false, 19317)] {
        // Iterations are per queue pair: 100 x 200 x 4 KiB, 80 MiB in all.
        let extra = ["-q", "100", "-n", "200", "-s", "4096"];
        let (s, c) = pair("ib_write_bw", rust_is_client, port, &extra);
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            let row = bw_row(&o.stdout).unwrap_or_else(|| panic!("{who}: no row\n{o}"));
            // The row counts every queue pair's iterations, in C as in the port.
            assert_eq!((row[0], row[1]), (4096.0, 20000.0), "{who}:\n{o}");
        }
    }
}
