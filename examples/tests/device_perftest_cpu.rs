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
    for (rust_is_client, port) in [(true, ports[0]), (false, ports[1])] {
        let (s, c) = pair(
            tool,
            rust_is_client,
            port,
            &["-D", "4", "-s", "64", "--cpu_util"],
        );
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
