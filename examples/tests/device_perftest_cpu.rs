//! perftest's `--cpu_util` in the Rust ports, against Debian's perftest (C) in
//! both directions, with the C tools' own command lines.
//!
//! In a `-D` run the table gains a `CPU_Util[%]` column: the machine's user
//! time over user and idle time across the sampled window. Both programs
//! spin, so a side that sampled a window shows a share above zero; a side that
//! runs no window (a WRITE server) shows 0.00, as C's does. Without `-D` both
//! warn, in the same words, and run as usual.

#[path = "support/perftest.rs"]
mod perftest;
use examples::perftest::child::{row_after, Outcome};
use perftest::pair;

/// The CPU column of a side's row after the header with `word`, checked: the
/// header names it, and the row has `columns` numbers, the last the share.
fn cpu_share(who: &str, o: &Outcome, word: &str, columns: usize) -> f64 {
    assert!(o.ok(), "{who} failed:\n{o}");
    let header = o.stdout.lines().find(|l| l.contains(word));
    assert!(
        header.is_some_and(|h| h.ends_with("    CPU_Util[%]")),
        "{who}: no CPU column in the header\n{o}"
    );
    let row = row_after(&o.stdout, word).unwrap_or_else(|| panic!("{who}: no row\n{o}"));
    assert_eq!(row.len(), columns, "{who}: {row:?}\n{o}");
    let share = row[columns - 1];
    assert!((0.0..=100.0).contains(&share), "{who}: {share}\n{o}");
    share
}

/// Both sides of each pair, both ways.
fn both_ways(tool: &str, ports: [u16; 2], word: &str, columns: usize, server_samples: bool) {
    both_ways_with(tool, ports, &[], word, columns, server_samples);
}

/// [`both_ways`] with `extra` options.
fn both_ways_with(
    tool: &str,
    ports: [u16; 2],
    extra: &[&str],
    word: &str,
    columns: usize,
    server_samples: bool,
) {
    let mut opts = vec!["-D", "4", "-s", "64", "--cpu_util"];
    opts.extend_from_slice(extra);
    for (rust_is_client, port) in [(true, ports[0]), (false, ports[1])] {
        let (s, c) = pair(tool, rust_is_client, port, &opts);
        let (sw, cw) = if rust_is_client {
            ("C server", "Rust client")
        } else {
            ("Rust server", "C client")
        };
        assert!(
            cpu_share(cw, &c, word, columns) > 0.0,
            "{cw} sampled no CPU\n{c}"
        );
        let server = cpu_share(sw, &s, word, columns);
        if server_samples {
            assert!(server > 0.0, "{sw} sampled no CPU\n{s}");
        } else {
            assert_eq!(server, 0.0, "{sw} runs no window\n{s}");
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn bandwidth_rows_show_the_cpu_both_ways() {
    both_ways("ib_write_bw", [19113, 19114], "BW average", 6, false);
    both_ways("ib_send_bw", [19115, 19116], "BW average", 6, true);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn latency_rows_show_the_cpu_both_ways() {
    both_ways("ib_send_lat", [19117, 19118], "tps average", 5, true);
}

/// Without `-D`, both warn in perftest's words and run as usual, with no
/// column.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn without_a_duration_both_warn_and_run() {
    let (s, c) = pair("ib_send_lat", true, 19119, &["-n", "200", "--cpu_util"]);
    for (who, o) in [("C server", &s), ("Rust client", &c)] {
        assert!(o.ok(), "{who} failed:\n{o}");
        let warning = " CPU Utilization works only with Duration mode.";
        assert!(o.stderr.contains(warning), "{who}: no warning\n{o}");
        assert!(!o.stdout.contains("CPU_Util"), "{who}: a CPU column\n{o}");
        assert!(
            row_after(&o.stdout, "t_typical").is_some(),
            "{who}: no row\n{o}"
        );
    }
}

/// With `-b` both sides run the test and sample the CPU; with `--report-both`
/// every row of the report has the column (both sides' own and their sum);
/// with `--output` only the figure is printed, as C prints it.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn the_column_with_other_report_options() {
    both_ways_with(
        "ib_write_bw",
        [19159, 19160],
        &["-b"],
        "BW average",
        6,
        true,
    );
    // Rows per role, C's and the port's: (C server, Rust client), then
    // (Rust server, C client).
    let mut counts = Vec::new();
    for (rust_is_client, port) in [(true, 19203), (false, 19204)] {
        let (s, c) = pair(
            "ib_read_bw",
            rust_is_client,
            port,
            &["-D", "4", "-s", "4096", "--cpu_util", "--report-both"],
        );
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            let rows = rows_after(&o.stdout, "BW average");
            assert!(!rows.is_empty(), "{who}: no row\n{o}");
            for r in &rows {
                assert_eq!(r.len(), 6, "{who}: a row without the column: {r:?}\n{o}");
            }
            counts.push(rows.len());
        }
    }
    assert_eq!(
        (counts[0], counts[1]),
        (counts[2], counts[3]),
        "rows of (server, client): C's and the port's"
    );
    for (rust_is_client, port) in [(true, 19205), (false, 19206)] {
        let (s, c) = pair(
            "ib_send_bw",
            rust_is_client,
            port,
            &["-D", "4", "-s", "4096", "--cpu_util", "--output=bandwidth"],
        );
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.ok(), "{who} failed:\n{o}");
            let figure: Result<f64, _> = o.stdout.trim().parse();
            assert!(figure.is_ok_and(|f| f > 0.0), "{who}: one figure\n{o}");
        }
    }
}

/// The rows of numbers after the header with `word`, up to the next line that
/// is not one.
fn rows_after(stdout: &str, word: &str) -> Vec<Vec<f64>> {
    stdout
        .lines()
        .skip_while(|l| !l.contains(word))
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .map(str::parse::<f64>)
                .collect::<Result<Vec<_>, _>>()
        })
        .take_while(|r| r.as_ref().is_ok_and(|v| !v.is_empty()))
        .map(Result::unwrap)
        .collect()
}
