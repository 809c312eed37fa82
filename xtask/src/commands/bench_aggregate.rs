//! The aggregate-throughput rows of `cargo xtask bench` (issue #15 part 3): one
//! `kiara-echo-server --sink` streamed to by 1, 4 and 16 clients at once (64 KiB
//! read messages, each client a session with its own thread), against C
//! `ib_read_bw -q N` (N queue pairs of one process) in the same boot. The
//! one-client row reuses the one-way 64 KiB runs and the C `ib_read_bw` runs
//! around them (`bench_adjacent`); the others run here. Target: at least 0.95 x C, as one way.

use std::fmt::Write as _;

use super::bench_kiara_report::{oneway, show, Compared};
use super::bench_plan::{self, Metric};
use super::bench_report::entry;

/// Clients (KIARA sessions, C queue pairs) of the aggregate rows.
pub const CLIENTS: &[u64] = &[1, 4, 16];

/// The message size of the aggregate rows.
pub const SIZE: u64 = 65536;

/// At least this share of C's aggregate.
const TARGET: f64 = 0.95;

/// KIARA messages per aggregate run, over all clients.
const KIARA_MESSAGES: u64 = 2000;

/// C `ib_read_bw` iterations per queue pair.
const C_ITERATIONS: u64 = 300;

/// Shell code for one round's KIARA aggregate runs with more than one client,
/// while the sink server `server_port` listens (outputs under `$raw`; `client`
/// is kiara-echo-client).
pub fn kiara_script(client: &str, server_port: u64, round: usize) -> String {
    let mut s = String::new();
    for &n in CLIENTS.iter().filter(|&&n| n > 1) {
        let _ = writeln!(
            s,
            "timeout 300 {client} 198.18.0.1 -p {server_port} --one-way -c {n} -n {per} -s {SIZE} \
             > \"$raw/kiara-agg{n}-{round}.txt\" 2>&1 || echo '  KIARA aggregate ({n} clients) failed'",
            per = KIARA_MESSAGES.div_ceil(n),
        );
    }
    s
}

/// Shell code for one round's C `ib_read_bw -q N` runs (its own port per run).
/// It must run after the sink server is gone: `pair` waits for every job of
/// the shell.
pub fn c_script(round: usize) -> String {
    let mut s = String::new();
    for &n in CLIENTS.iter().filter(|&&n| n > 1) {
        let _ = writeln!(
            s,
            "pair ib_read_bw \"kiara-c-read-q{n}-{round}.txt\" {port} -x 1 -s {SIZE} -n {C_ITERATIONS} -q {n}",
            port = 19400 + 40 * round as u64 + n,
        );
    }
    s
}

/// The aggregate rows, appended to the KIARA `table` and `json`, each round
/// against the C runs of the same round (paired). The one-client row is the
/// one-way 64 KiB runs against the C `ib_read_bw` runs around them.
pub fn rows(
    read: &dyn Fn(String) -> String,
    rounds: usize,
    table: &mut String,
    json: &mut Vec<String>,
) {
    for &n in CLIENTS {
        let (kiara_file, c) = if n == 1 {
            let c = super::bench_adjacent::per_round(read, "ib_read_bw", SIZE, rounds);
            ("kiara-oneway".to_string(), c)
        } else {
            let c = (0..rounds)
                .map(|r| {
                    let out = read(format!("kiara-c-read-q{n}-{r}.txt"));
                    bench_plan::figure(Metric::Bandwidth, SIZE, &out).unwrap_or(f64::NAN)
                })
                .collect();
            (format!("kiara-agg{n}"), c)
        };
        let kiara = oneway(read, &kiara_file, SIZE, rounds);
        let row = Compared::paired(&kiara, &c, TARGET, true);
        let (ratio, ci) = row.columns();
        let _ = writeln!(
            table,
            "aggregate MiB/s {n:>2} cl    {:>9}  {:>9}  {ratio:>5}  {ci:<15}  >= {TARGET} x ib_read_bw -q {n}: {}",
            show(row.kiara),
            show(row.c),
            row.verdict
        );
        json.push(entry(&format!(
            "\"what\": \"aggregate throughput\", \"size\": {SIZE}, \"clients\": {n}, \
             \"unit\": \"MiB/s\", \"target\": \">= {TARGET}\", {}",
            row.json("c_ib_read_bw_q")
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_run_kiara_and_c_with_as_many_clients_as_queue_pairs() {
        let k = kiara_script("kc", 19000, 2);
        assert!(k.contains("kc 198.18.0.1 -p 19000 --one-way -c 4 -n 500 -s 65536"));
        assert!(k.contains("\"$raw/kiara-agg16-2.txt\""));
        assert!(
            !k.contains("-c 1 "),
            "one client comes from the one-way runs"
        );
        let c = c_script(2);
        assert!(c.contains("pair ib_read_bw \"kiara-c-read-q16-2.txt\" 19496 -x 1 -s 65536"));
        assert!(c.contains("-q 4"), "{c}");
    }

    #[test]
    fn aggregate_rows_compare_with_ib_read_bw_q_n() {
        let c_out = |bw: f64| {
            format!(
                " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n \
                 65536 4800 {bw} {bw} 0.003\n"
            )
        };
        let read = |name: String| -> String {
            let r: f64 = name[name.rfind('-').unwrap() + 1..name.len() - 4]
                .parse()
                .unwrap();
            match name.split('-').take(2).collect::<Vec<_>>()[..] {
                // 10^6 B/s: 104.8576 MB/s is 100 MiB/s.
                ["kiara", "oneway"] => format!("#bytes #msgs MB/s\n 65536 1 {}\n", 104.8576 + r),
                ["kiara", "agg4"] => format!("#bytes #msgs MB/s\n 65536 1 {}\n", 209.7152 + r),
                ["kiara", "agg16"] => "#bytes #msgs MB/s\n 65536 1 10\n".into(),
                _ if name.contains("-q4-") => c_out(200.0 + r),
                // C around the one-way runs: 100 MiB/s on average.
                _ if name.contains("-before-") => c_out(99.0 + r),
                _ if name.contains("-after-") => c_out(101.0 - r),
                _ => c_out(400.0 + r),
            }
        };
        let (mut table, mut json) = (String::new(), Vec::new());
        rows(&read, 6, &mut table, &mut json);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(
            lines[0].contains(" 1 cl") && lines[0].contains("ib_read_bw -q 1: met"),
            "{table}"
        );
        assert!(
            lines[1].contains("202.38") && lines[1].contains("-q 4: met"),
            "{table}"
        );
        assert!(
            lines[2].contains("9.54") && lines[2].ends_with("-q 16: MISSED"),
            "{table}"
        );
        let parsed = crate::json::Json::parse(&format!("[{}]", json.join(","))).unwrap();
        let rows = parsed.as_array().unwrap();
        assert_eq!(rows[2].get("clients").and_then(|v| v.as_f64()), Some(16.0));
        assert!(
            rows[2]
                .get("c_ib_read_bw_q")
                .and_then(|v| v.as_f64())
                .unwrap()
                >= 400.0
        );
    }
}
