//! perftest's `--out_json` file from the Rust ports, against the file Debian's
//! perftest (C) writes for the same run, with the C tools' own command lines.
//!
//! Each pair runs twice, the port as client and as server, every side writing
//! its own file. The port's file must be the C tool's line for line: the same
//! keys in the same order, the same description of the test, and results that
//! are the row the side printed.

#[path = "support/perftest.rs"]
mod perftest;
use examples::perftest::child::{run_pair, server_and_client, Outcome};
use perftest::{args, ours};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A fresh path for one side's file.
fn file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("perftest-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn json_args(port: u16, extra: &[&str], json: &Path, client: bool) -> Vec<String> {
    let file = format!("--out_json_file={}", json.display());
    let extra: Vec<&str> = extra.iter().copied().chain(["--out_json", &file]).collect();
    args(port, &extra, client)
}

/// One side's run: what it printed and the file it wrote.
struct Side {
    who: String,
    out: Outcome,
    json: String,
}

/// Runs `tool` with the port as client (`rust_is_client`) or server; returns
/// (server, client).
fn pair(tool: &str, rust_is_client: bool, port: u16, extra: &[&str]) -> (Side, Side) {
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    let (sf, cf) = (
        file(&format!("{port}-server")),
        file(&format!("{port}-client")),
    );
    let (s, c) = run_pair(
        (srv, json_args(port, extra, &sf, false)),
        (cli, json_args(port, extra, &cf, true)),
        port,
        Duration::from_secs(120),
    );
    let side = |role: &str, rust: bool, out: Outcome, f: &Path| {
        let who = format!("{} {role} of {tool}", if rust { "Rust" } else { "C" });
        assert!(out.ok(), "{who} failed:\n{out}");
        let json =
            std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{who}: no file: {e}\n{out}"));
        Side { who, out, json }
    };
    (
        side("server", !rust_is_client, s, &sf),
        side("client", rust_is_client, c, &cf),
    )
}

/// The file's lines as (key, value), the results' values apart.
fn lines(s: &Side) -> Vec<(String, String)> {
    s.json
        .lines()
        .map(|l| match l.split_once(": ") {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

/// Keys whose values are measured (they differ from run to run).
const MEASURED: [&str; 14] = [
    "BW_peak",
    "tps_average",
    "BW_average",
    "MsgRate",
    "bw_avg",
    "msgRate_avg",
    "t_min",
    "t_max",
    "t_typical",
    "t_avg",
    "t_stdev",
    "percentile_99",
    "percentile_99.9",
    "avg_lat",
];

/// The port's file against C's for the same role: the same keys in the same
/// order, the same values but measured ones, which must be numbers of as many
/// decimals as C's. With `-D` (`timed`) the iterations are measured too.
fn same_file(rust: &Side, c: &Side, timed: bool) {
    let (r, k) = (lines(rust), lines(c));
    let keys = |v: &[(String, String)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(
        keys(&r),
        keys(&k),
        "{}:\n{}\n{}:\n{}",
        rust.who,
        rust.json,
        c.who,
        c.json
    );
    for ((key, rv), (_, cv)) in r.iter().zip(&k) {
        if MEASURED.contains(&key.as_str()) || (timed && key == "n_iterations") {
            let num = |v: &str| v.trim_end_matches(',').parse::<f64>().is_ok();
            assert!(num(rv) && num(cv), "{key}: {rv} / {cv}");
            let decimals = |v: &str| v.split_once('.').map_or(0, |(_, d)| d.len());
            assert_eq!(decimals(rv), decimals(cv), "{key}: {rv} / {cv}");
        } else {
            assert_eq!(rv, cv, "{key}:\n{}\n{}", rust.json, c.json);
        }
    }
}

/// The value of `key` in a side's file, as a number.
fn value(s: &Side, key: &str) -> f64 {
    let v = lines(s)
        .into_iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{}: no {key}:\n{}", s.who, s.json))
        .1;
    v.trim_end_matches(',').parse().expect(key)
}

/// The numbers of the row a side printed after its last header with `word`
/// (the file holds the last result printed).
fn row(s: &Side, word: &str) -> Vec<f64> {
    let text = &s.out.stdout;
    let last = text.rfind(word).and_then(|i| text[..i].rfind('\n'));
    examples::perftest::child::row_after(&text[last.unwrap_or(0)..], word)
        .unwrap_or_else(|| panic!("{}: no row:\n{}", s.who, s.out))
}

/// A side's results are the row it printed after the header with `word`, the
/// row's columns read as `keys` (to the row's two decimals).
fn results_are_the_row(s: &Side, word: &str, keys: &[&str]) {
    let r = row(s, word);
    for (key, want) in keys.iter().zip(&r) {
        let got = value(s, key);
        assert!(
            (got - want).abs() < 0.006,
            "{}: {key} {got} against {want}\n{}",
            s.who,
            s.json
        );
    }
}

/// A bandwidth side's results are its row.
fn bw_results_are_the_row(s: &Side) {
    let keys = [
        "MsgSize",
        "n_iterations",
        "BW_peak",
        "BW_average",
        "MsgRate",
    ];
    results_are_the_row(s, "BW average", &keys);
}

/// Runs `tool` both ways and compares each role's files.
fn both_ways(tool: &str, ports: (u16, u16), extra: &[&str], check: fn(&Side)) {
    let (c_srv, rust_cli) = pair(tool, true, ports.0, extra);
    let (rust_srv, c_cli) = pair(tool, false, ports.1, extra);
    let timed = extra.contains(&"-D");
    same_file(&rust_cli, &c_cli, timed);
    same_file(&rust_srv, &c_srv, timed);
    for s in [&c_srv, &rust_cli, &rust_srv, &c_cli] {
        check(s);
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn bandwidth_files_are_perftests() {
    both_ways(
        "ib_write_bw",
        (19190, 19191),
        &["-s", "4096", "-n", "500"],
        bw_results_are_the_row,
    );
    both_ways(
        "ib_read_bw",
        (19192, 19193),
        &["-s", "4096", "-n", "500"],
        bw_results_are_the_row,
    );
    // The tiny Gb/s figures print six decimals; the file follows.
    both_ways(
        "ib_write_bw",
        (19120, 19123),
        &["--report_gbits", "-s", "2", "-n", "500"],
        bw_results_are_the_row,
    );
    // The file holds the last of the three reports: the peer's.
    both_ways(
        "ib_read_bw",
        (19124, 19125),
        &["-b", "--report-both", "-s", "4096", "-n", "500"],
        bw_results_are_the_row,
    );
    both_ways(
        "ib_send_bw",
        (19194, 19195),
        &["-b", "-s", "4096", "-n", "500"],
        bw_results_are_the_row,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn latency_files_are_perftests() {
    fn lat_results_are_the_row(s: &Side) {
        let keys = [
            "MsgSize",
            "n_iterations",
            "t_min",
            "t_max",
            "t_typical",
            "t_avg",
            "t_stdev",
        ];
        results_are_the_row(s, "t_typical", &keys);
    }
    both_ways(
        "ib_send_lat",
        (19196, 19197),
        &["-s", "64", "-n", "500"],
        lat_results_are_the_row,
    );
    fn figure_alone(s: &Side) {
        let printed: f64 = s.out.stdout.trim().parse().expect("one figure");
        assert!(
            (value(s, "avg_lat") - printed).abs() < 1e-6,
            "{}\n{}",
            s.who,
            s.json
        );
    }
    both_ways(
        "ib_send_lat",
        (19198, 19199),
        &["-n", "500", "--output=latency"],
        figure_alone,
    );
}

/// The options that change the file's description or its results' kind:
/// `-D` (bandwidth, and latency's duration keys), `-e`, `-R` and `-a` (the
/// file holds the last size's results).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn the_files_of_other_modes_are_perftests() {
    both_ways(
        "ib_write_bw",
        (19126, 19127),
        &["-D", "2", "-s", "4096"],
        bw_results_are_the_row,
    );
    fn lat_dur_results_are_the_row(s: &Side) {
        let keys = ["MsgSize", "n_iterations", "t_avg", "tps_average"];
        results_are_the_row(s, "tps average", &keys);
    }
    both_ways(
        "ib_send_lat",
        (19128, 19129),
        &["-D", "2", "-s", "64"],
        lat_dur_results_are_the_row,
    );
    fn lat_results_are_the_row(s: &Side) {
        let keys = ["MsgSize", "n_iterations", "t_min", "t_max", "t_typical"];
        results_are_the_row(s, "t_typical", &keys);
    }
    both_ways(
        "ib_send_lat",
        (19130, 19137),
        &["-e", "-s", "64", "-n", "200"],
        lat_results_are_the_row,
    );
    both_ways(
        "ib_write_bw",
        (19138, 19139),
        &["-R", "-s", "4096", "-n", "500"],
        bw_results_are_the_row,
    );
    // The last of the sizes 2 to 8 MiB.
    fn last_size(s: &Side) {
        assert_eq!(
            value(s, "MsgSize"),
            (8 << 20) as f64,
            "{}\n{}",
            s.who,
            s.json
        );
    }
    both_ways(
        "ib_write_lat",
        (19140, 19150),
        &["-a", "-n", "20"],
        last_size,
    );
}
