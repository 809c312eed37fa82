//! The KIARA rows' report: the table, the JSON array and issue #15's goal rows,
//! read from the outputs the rounds of `bench_kiara` left. The targets: one way
//! at least 0.95 x `ib_read_bw` at 64 KiB and 1.0 x at 1 MiB; the 64 B round
//! trip at most 1.3 x twice `ib_send_lat`; with 4 clients at 64 B, p99 at most
//! 3 x p50. A row reports the median of the rounds' ratios with the sign test's
//! interval of it, and meets or misses its target only when the whole interval
//! is on one side of it.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::bench_adjacent;
use super::bench_kiara::{Oneway, LATENCY_CLIENTS, LATENCY_SIZES, THROUGHPUT_SIZES};
use super::bench_layouts;
use super::bench_report::{entry, num};
use crate::stats::{self, RatioEstimate};

/// Targets: one-way throughput against `ib_read_bw` per size (at least), the
/// round trip against twice `ib_send_lat` (at most), p99 against p50 with
/// [`TAIL_CLIENTS`] clients (at most).
fn throughput_target(size: u64) -> f64 {
    if size <= 65536 {
        0.95
    } else {
        1.0
    }
}
const RTT_TARGET: f64 = 1.3;
const TAIL_TARGET: f64 = 3.0;
const TAIL_CLIENTS: u64 = 4;

/// The figure in the row of `size` (first column), column `col`, of a KIARA table.
fn figure(text: &str, size: u64, col: usize) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(size.to_string().as_str()))?
        .split_whitespace()
        .nth(col)?
        .parse()
        .ok()
}

/// A KIARA row against its C counterpart (or a run's p99 against its p50):
/// the median of the rounds' ratios, the sign test's interval of it, and where
/// it stands against `target`.
pub(super) struct Compared {
    pub(super) kiara: Option<f64>,
    pub(super) c: Option<f64>,
    pub(super) estimate: Option<RatioEstimate>,
    pub(super) verdict: &'static str,
}

impl Compared {
    /// The row of samples measured together round by round (`kiara[i]` next
    /// to `c[i]`; a missing figure is NaN): the ratio is the median of the
    /// rounds' ratios, its interval the sign test's ([`stats::round_ratios`]).
    pub(super) fn paired(kiara: &[f64], c: &[f64], target: f64, at_least: bool) -> Self {
        let estimate = stats::round_ratios(kiara, c);
        Compared {
            kiara: stats::median(kiara),
            c: stats::median(c),
            estimate,
            verdict: Self::verdict(estimate, target, at_least),
        }
    }

    fn verdict(estimate: Option<RatioEstimate>, target: f64, at_least: bool) -> &'static str {
        match estimate {
            None => "no data",
            Some(e) if e.n < stats::MIN_FOR_VERDICT => stats::TOO_FEW,
            Some(e) => stats::against_target(e.ci, target, at_least),
        }
    }

    /// Ratio and interval columns.
    pub(super) fn columns(&self) -> (String, String) {
        self.estimate.map_or(("-".into(), "-".into()), |e| {
            (
                format!("{:.3}", e.ratio),
                format!("[{:.3}, {:.3}]", e.ci.lo, e.ci.hi),
            )
        })
    }

    /// The JSON members after `what`, `size` and `unit`.
    pub(super) fn json(&self, c_name: &str) -> String {
        let e = self.estimate;
        format!(
            "\"kiara\": {}, \"{c_name}\": {}, \"ratio\": {}, \"ci_low\": {}, \"ci_high\": {}, \
             \"verdict\": \"{}\"",
            num(self.kiara),
            num(self.c),
            num(e.map(|e| e.ratio)),
            num(e.map(|e| e.ci.lo)),
            num(e.map(|e| e.ci.hi)),
            self.verdict
        )
    }
}

/// The KIARA table and JSON array, from the raw outputs under `raw`.
/// `layouts` is how many layouts the rounds rotated through.
pub fn report(raw: &Path, rounds: usize, layouts: usize) -> (String, String) {
    let read = |name: String| fs::read_to_string(raw.join(name)).unwrap_or_default();
    let mut table = String::from(
        "KIARA                 size      KIARA          C  ratio  95% CI           target\n",
    );
    let mut json = Vec::new();
    let oneway_64k = oneway_rows(&read, rounds, &Oneway::DEFAULT, &mut table, &mut json);
    rtt_row(&read, rounds, layouts, &mut table, &mut json);
    latency_rows(&read, rounds, &mut table, &mut json);
    c_tail_row(&read, rounds, &mut table, &mut json);
    let (line, scoped) = scoped_row(&read, rounds, oneway_64k);
    table.push_str(&line);
    json.push(scoped);
    super::bench_aggregate::rows(&read, rounds, &mut table, &mut json);
    oneway_rows(&read, rounds, &Oneway::SPINNING, &mut table, &mut json);
    (table, format!("[\n{}\n  ]", json.join(",\n")))
}

/// KIARA's one-way MiB/s at `size`, per round (NaN where a run gave none).
pub(super) fn oneway(
    read: &dyn Fn(String) -> String,
    file: &str,
    size: u64,
    rounds: usize,
) -> Vec<f64> {
    // kiara-echo-client prints MB/s (10^6); perftest's "MB/sec" are MiB/s.
    (0..rounds)
        .map(|r| {
            figure(&read(format!("{file}-{r}.txt")), size, 2)
                .map_or(f64::NAN, |mb| mb * 1e6 / f64::from(1 << 20))
        })
        .collect()
}

/// A figure with two decimals, or `-`.
pub(super) fn show(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.2}"))
}

/// The one-way throughput rows of `kind`, each round against the C `ib_read_bw`
/// runs around it; returns KIARA's median MiB/s at 64 KiB.
fn oneway_rows(
    read: &dyn Fn(String) -> String,
    rounds: usize,
    kind: &Oneway,
    table: &mut String,
    json: &mut Vec<String>,
) -> Option<f64> {
    let mut oneway_64k = None;
    for &size in THROUGHPUT_SIZES {
        let target = throughput_target(size);
        let row = oneway_compared(read, kind, size, rounds);
        if size == SCOPED_SIZE {
            oneway_64k = row.kiara;
        }
        let (ratio, ci) = row.columns();
        let _ = writeln!(
            table,
            "{:<14} {size:>11}  {:>9}  {:>9}  {ratio:>5}  {ci:<15}  >= {target} x ib_read_bw: {}",
            kind.label,
            show(row.kiara),
            show(row.c),
            row.verdict
        );
        json.push(entry(&format!(
            "{}, \"size\": {size}, \"unit\": \"MiB/s\", \
             \"target\": \">= {target}\", {ONEWAY_NOTE}, {}",
            kind.json(),
            row.json("c_ib_read_bw")
        )));
    }
    oneway_64k
}

/// KIARA's one-way runs of `kind` at `size` against the C `ib_read_bw` runs
/// around them, round by round.
fn oneway_compared(
    read: &dyn Fn(String) -> String,
    kind: &Oneway,
    size: u64,
    rounds: usize,
) -> Compared {
    let kiara = oneway(read, kind.file, size, rounds);
    let c = bench_adjacent::per_round(read, "ib_read_bw", size, rounds);
    Compared::paired(&kiara, &c, throughput_target(size), true)
}

/// Issue #15's goal rows over `rounds` rounds, each named, as the table shows
/// them: the default one-way throughput at each size, the 64 B round trip, and
/// the tail with [`TAIL_CLIENTS`] clients at 64 B.
pub(super) fn goals(read: &dyn Fn(String) -> String, rounds: usize) -> Vec<(String, Compared)> {
    let mut goals: Vec<(String, Compared)> = THROUGHPUT_SIZES
        .iter()
        .map(|&size| {
            let row = oneway_compared(read, &Oneway::DEFAULT, size, rounds);
            (format!("one-way-{size}"), row)
        })
        .collect();
    let (rtt, c) = rtt_series(read, rounds);
    let rtt = Compared::paired(&rtt, &c, RTT_TARGET, false);
    goals.push(("round-trip".into(), rtt));
    let col = |c| latency_column(read, TAIL_CLIENTS, LATENCY_SIZES[0].0, c, rounds);
    let tail = Distribution::new(col(3), col(4), col(5)).tail;
    goals.push((format!("tail-{TAIL_CLIENTS}-clients"), tail));
    goals
}

/// How the KIARA rows' C figures were taken, for the JSON.
const ADJACENT_NOTE: &str = "\"c_runs\": \"right before and after, same round\"";

/// How the one-way rows' C figures were taken, for the JSON.
const ONEWAY_NOTE: &str = "\"c_runs\": \"right before and after both kinds of one-way \
    runs, same round; the kinds take turns going first\"";

/// The 64 B round trip (median of the one-client latency run) against twice C
/// `ib_send_lat` run right around it: a paired comparison, round by round.
fn rtt_row(
    read: &dyn Fn(String) -> String,
    rounds: usize,
    layouts: usize,
    table: &mut String,
    json: &mut Vec<String>,
) {
    let (rtt, c) = rtt_series(read, rounds);
    let row = Compared::paired(&rtt, &c, RTT_TARGET, false);
    let (ratio, ci) = row.columns();
    let _ = writeln!(
        table,
        "round trip usec         64  {:>9}  {:>9}  {ratio:>5}  {ci:<15}  <= {RTT_TARGET} x 2 x ib_send_lat: {}",
        show(row.kiara),
        show(row.c),
        row.verdict
    );
    let by_layout = bench_layouts::by_layout(&rtt, &c, layouts);
    if layouts > 1 {
        let each = by_layout.iter().enumerate().map(|(k, x)| match x {
            Some(x) => format!("{k}: {x:.3}"),
            None => format!("{k}: -"),
        });
        let _ = writeln!(
            table,
            "  by layout (round % {layouts}): {}",
            each.collect::<Vec<_>>().join(", ")
        );
    }
    let by_layout_json = by_layout
        .iter()
        .map(|x| num(*x))
        .collect::<Vec<_>>()
        .join(", ");
    json.push(entry(&format!(
        "\"what\": \"request/reply round trip\", \"size\": 64, \"unit\": \"usec\", \
         \"target\": \"<= {RTT_TARGET}\", {ADJACENT_NOTE}, {}, \"ratio_by_layout\": [{by_layout_json}]",
        row.json("c_2x_ib_send_lat")
    )));
}

/// The 64 B round trip of each round (the one-client latency run's median),
/// and twice the C `ib_send_lat` run around it.
fn rtt_series(read: &dyn Fn(String) -> String, rounds: usize) -> (Vec<f64>, Vec<f64>) {
    let rtt = latency_column(read, 1, 64, 3, rounds);
    let c = bench_adjacent::per_round(read, "ib_send_lat", 64, rounds)
        .iter()
        .map(|t| 2.0 * t)
        .collect();
    (rtt, c)
}

/// Column `col` of the latency runs of `clients` clients at `size`, round by
/// round, NaN where a run gave no figure (so that columns stay paired by run).
fn latency_column(
    read: &dyn Fn(String) -> String,
    clients: u64,
    size: u64,
    col: usize,
    rounds: usize,
) -> Vec<f64> {
    (0..rounds)
        .map(|r| {
            figure(&read(format!("kiara-lat{clients}-{r}.txt")), size, col).unwrap_or(f64::NAN)
        })
        .collect()
}

/// The round-trip distribution per size and number of clients: medians over
/// the rounds of p50, p99 and p99.9; at 64 B with [`TAIL_CLIENTS`] clients, p99
/// against p50 with its target.
fn latency_rows(
    read: &dyn Fn(String) -> String,
    rounds: usize,
    table: &mut String,
    json: &mut Vec<String>,
) {
    for &(size, _) in LATENCY_SIZES {
        for &n in LATENCY_CLIENTS {
            let col = |c| latency_column(read, n, size, c, rounds);
            let dist = Distribution::new(col(3), col(4), col(5));
            let targeted = n == TAIL_CLIENTS && size == LATENCY_SIZES[0].0;
            let verdict = if targeted {
                format!("p99 <= {TAIL_TARGET} x p50: {}", dist.tail.verdict)
            } else {
                "p99 / p50".to_string()
            };
            table.push_str(&dist.line(&format!("rtt p50/p99 {n:>2} cl{size:>9}  "), &verdict));
            json.push(entry(&format!(
                "\"what\": \"round-trip distribution\", \"size\": {size}, \"clients\": {n}, \
                 \"unit\": \"usec\", {}, \"verdict\": \"{}\"",
                dist.json(),
                if targeted { dist.tail.verdict } else { "-" }
            )));
        }
    }
}

/// A round-trip distribution over the rounds: the median of each round's
/// p50, p99 and p99.9, and each run's p99 over its p50 (the median ratio, its
/// interval and the verdict against [`TAIL_TARGET`]).
struct Distribution {
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
    tail: Compared,
}

impl Distribution {
    /// From the rounds' p50, p99 and p99.9 (NaN where a run gave none): the
    /// tail is each run's p99 over its own p50.
    fn new(p50: Vec<f64>, p99: Vec<f64>, p999: Vec<f64>) -> Self {
        Distribution {
            p50: stats::median(&p50),
            p99: stats::median(&p99),
            p999: stats::median(&p999),
            tail: Compared::paired(&p99, &p50, TAIL_TARGET, false),
        }
    }

    /// Its table line: `label`, the p50 and p99 columns, the tail ratio and its
    /// interval, then `verdict`.
    fn line(&self, label: &str, verdict: &str) -> String {
        let (ratio, ci) = self.tail.columns();
        format!(
            "{label}{:>9}  {:>9}  {ratio:>5}  {ci:<15}  {verdict} (p99.9 {} usec)\n",
            show(self.p50),
            show(self.p99),
            show(self.p999),
        )
    }

    /// Its JSON members: the percentiles and the tail ratio with its interval.
    fn json(&self) -> String {
        let e = self.tail.estimate;
        format!(
            "\"p50\": {}, \"p99\": {}, \"p99_9\": {}, \"tail_ratio\": {}, \"ci_low\": {}, \
             \"ci_high\": {}",
            num(self.p50),
            num(self.p99),
            num(self.p999),
            num(e.map(|e| e.ratio)),
            num(e.map(|e| e.ci.lo)),
            num(e.map(|e| e.ci.hi)),
        )
    }
}

/// The tail of C `ib_send_lat` at 64 B in the same rounds, for reference: p99
/// over t_typical (its median) of each run around the KIARA round trips, as the
/// KIARA rows report theirs. perftest prints t_typical, then p99 and p99.9 three
/// and four columns later.
fn c_tail_row(
    read: &dyn Fn(String) -> String,
    rounds: usize,
    table: &mut String,
    json: &mut Vec<String>,
) {
    let outputs = bench_adjacent::outputs(read, "ib_send_lat", 64, rounds);
    let col = |c: usize| -> Vec<f64> {
        outputs
            .iter()
            .map(|out| {
                let value = || -> Option<f64> {
                    let mut lines = out.lines();
                    lines.find(|l| l.contains("t_typical"))?;
                    let row = lines.find(|l| !l.trim().is_empty())?;
                    row.split_whitespace().nth(c)?.parse().ok()
                };
                // NaN keeps the runs in step, so p99 and p50 pair by run.
                value().unwrap_or(f64::NAN)
            })
            .collect()
    };
    let dist = Distribution::new(col(4), col(7), col(8));
    table.push_str(&dist.line(
        "C ib_send_lat p50/p99     64  ",
        "p99 / p50 of C, for reference",
    ));
    json.push(entry(&format!(
        "\"what\": \"C ib_send_lat distribution\", \"size\": 64, \"unit\": \"usec\", {}",
        dist.json()
    )));
}

/// The message size `kiara-scoped-cost` measures (its default).
const SCOPED_SIZE: u64 = 65536;

/// A figure of `kiara-scoped-cost`'s output: the number ending the line that starts
/// with `label`.
fn scoped_figure(text: &str, label: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(label))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The scoped-access row: the median cost per 64 KiB read message (kiara's design on
/// Soft-RoCE, LOCAL_INV; and the reader's SEND_WITH_INV, its default elsewhere, for
/// comparison), and its share of the
/// time one 64 KiB message takes one way (from the one-way MiB/s).
fn scoped_row(
    read: &dyn Fn(String) -> String,
    rounds: usize,
    oneway_mib_s: Option<f64>,
) -> (String, String) {
    let cost = |label: &str| {
        let v: Vec<f64> = (0..rounds)
            .filter_map(|r| scoped_figure(&read(format!("kiara-scoped-{r}.txt")), label))
            .collect();
        stats::median(&v)
    };
    let local = cost("total LOCAL_INV");
    let remote = cost("total SEND_WITH_INV");
    let reused = cost("total region reused");
    let per_message = oneway_mib_s.map(|m| SCOPED_SIZE as f64 / (m * f64::from(1 << 20)) * 1e6);
    let share = local.zip(per_message).map(|(c, m)| c / m);
    let line = format!(
        "scoped usec/msg {SCOPED_SIZE:>11}  {:>9}  {:>9}  {:>5}  share of a message's time one way \
         (region reused: {}; SEND_WITH_INV instead: {})\n",
        local.map_or("-".into(), |v| format!("{v:.1}")),
        per_message.map_or("-".into(), |v| format!("{v:.1}")),
        share.map_or("-".into(), |v| format!("{v:.3}")),
        reused.map_or("-".into(), |v| format!("{v:.1} usec")),
        remote.map_or("-".into(), |v| format!("{v:.1} usec")),
    );
    let members = format!(
        "\"what\": \"scoped access cost per read message\", \"size\": {SCOPED_SIZE}, \
         \"unit\": \"usec\", \"local_inv\": {}, \"region_reused\": {}, \
         \"send_with_inv\": {}, \"message_one_way\": {}, \"share\": {}",
        num(local),
        num(reused),
        num(remote),
        num(per_message),
        num(share)
    );
    (line, entry(&members))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::bench_adjacent as adjacent;

    #[test]
    fn kiara_tables_are_parsed() {
        let oneway = "    #bytes    #msgs MB/s (one way)\n     65536      300          28.35\n   1048576      300          20.38\n";
        assert_eq!(figure(oneway, 65536, 2), Some(28.35));
        assert_eq!(figure(oneway, 1048576, 2), Some(20.38));
        let rtt = "    #bytes    #msgs  MB/s (echo)  rtt median us     rtt 99% us\n        64      200         0.05          144.9        51417.5\n";
        assert_eq!(figure(rtt, 64, 3), Some(144.9));
        let scoped = "step     median us p90 us\nbind window  63.05  88.08\n\
                      total LOCAL_INV (kiara)            220.50\n\
                      total SEND_WITH_INV                179.89\n\
                      total region reused                103.66\n";
        assert_eq!(scoped_figure(scoped, "total LOCAL_INV"), Some(220.5));
        assert_eq!(scoped_figure(scoped, "total SEND_WITH_INV"), Some(179.89));
        let (line, entry) = scoped_row(&|_| scoped.to_string(), 3, Some(16.0));
        // 64 KiB at 16 MiB/s: 3906.25 us per message; 220.5 of it is 0.056.
        assert!(line.contains("220.5") && line.contains("3906.2") && line.contains("0.056"));
        assert!(entry.contains("\"local_inv\": 220.5") && entry.contains("\"share\": 0.05"));
        assert!(
            line.contains("region reused: 103.7") && entry.contains("\"region_reused\": 103.66")
        );
    }

    /// Six rounds of outputs as a round's script leaves them, in a directory of
    /// its own (removed on drop): KIARA's runs and the C runs around them.
    struct Fixture(std::path::PathBuf);

    impl Fixture {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("xtask-bench-kiara-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            for r in 0..6 {
                // 10^6 B/s = 0.9537 MiB/s: 55 and 100 MB/s against C at 50 and 200 MiB/s.
                let oneway = format!("#bytes #msgs MB/s\n 65536 1 {}\n 1048576 1 100\n", 55 + r);
                fs::write(dir.join(format!("kiara-oneway-{r}.txt")), oneway).unwrap();
                // Spinning: 60 and 300 MB/s, above C at both sizes.
                let spin = format!("#bytes #msgs MB/s\n 65536 1 {}\n 1048576 1 300\n", 60 + r);
                fs::write(dir.join(format!("kiara-oneway-spin-{r}.txt")), spin).unwrap();
                let rtt = format!(
                    "#bytes #msgs MB/s p50 p99 p999\n 64 1 0.1 {} {} 900\n",
                    40 + r,
                    100 + r
                );
                fs::write(dir.join(format!("kiara-lat1-{r}.txt")), &rtt).unwrap();
                // Four clients: a tail of 5 x p50.
                let four = format!(
                    "#bytes #msgs MB/s p50 p99 p999\n 64 1 0.1 {} {} 900\n",
                    40 + r,
                    200 + r
                );
                // ... and at 4 KiB, appended as the script does: a tail of 2 x p50.
                let four =
                    format!("{four}#bytes #msgs MB/s p50 p99 p999\n 4096 1 0.1 100 200 300\n");
                fs::write(dir.join(format!("kiara-lat4-{r}.txt")), four).unwrap();
                // C ib_send_lat as perftest prints it: p99 is 4 x t_typical.
                let c_lat = format!(
                    " #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] \
                     t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]\n\
                     64 500 9.00 300.00 {} 12.00 3.00 {} 250.00\n",
                    10 + r,
                    4 * (10 + r)
                );
                // Right around the KIARA run: t_typical 10 + r before, 12 + r after
                // (no run after round 0), so 2 x C is 20, 24, 26, 28, 30 and 32.
                let write = |name: String, text: &str| fs::write(dir.join(name), text).unwrap();
                write(adjacent::file("ib_send_lat", 64, "before", r), &c_lat);
                if r > 0 {
                    let after = c_lat
                        .replace(&format!(" {} 12.00", 10 + r), &format!(" {} 12.00", 12 + r))
                        .replace(
                            &format!(" {} 250", 4 * (10 + r)),
                            &format!(" {} 250", 4 * (12 + r)),
                        );
                    write(adjacent::file("ib_send_lat", 64, "after", r), &after);
                }
                // ib_read_bw around the one-way runs: 50 MiB/s at 64 KiB, 200 at 1 MiB.
                let bw = |size: u64, v: f64| {
                    format!(
                        " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n \
                         {size} 300 {v} {v} 0.003\n"
                    )
                };
                for (when, d) in [("before", -1.0), ("after", 1.0)] {
                    write(
                        adjacent::file("ib_read_bw", 65536, when, r),
                        &bw(65536, 50.0 + d),
                    );
                    write(
                        adjacent::file("ib_read_bw", 1 << 20, when, r),
                        &bw(1 << 20, 200.0 + d),
                    );
                }
            }
            Fixture(dir)
        }

        /// The report over `rounds` rounds of `layouts` layouts: table lines and JSON.
        fn report(&self, rounds: usize, layouts: usize) -> (String, String) {
            report(&self.0, rounds, layouts)
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// The table's line that starts with `start`.
    fn line<'a>(table: &'a str, start: &str) -> &'a str {
        let found = table.lines().find(|l| l.starts_with(start));
        found.unwrap_or_else(|| panic!("{start}: {table}"))
    }

    #[test]
    fn the_goal_rows_the_extra_rounds_look_at_are_the_tables() {
        let fx = Fixture::new("goals");
        let (table, _) = fx.report(6, 3);
        let read = |name: String| fs::read_to_string(fx.0.join(name)).unwrap_or_default();
        let verdicts: Vec<_> = goals(&read, 6)
            .into_iter()
            .map(|(name, row)| format!("{name} {}", row.verdict))
            .collect();
        assert_eq!(
            verdicts,
            [
                "one-way-65536 met",
                "one-way-1048576 MISSED",
                "round-trip MISSED",
                "tail-4-clients MISSED"
            ]
        );
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].ends_with("ib_read_bw: met"), "{table}");
        assert!(lines[2].ends_with("ib_read_bw: MISSED"), "{table}");
        assert!(lines[3].ends_with("ib_send_lat: MISSED"), "{table}");
        let four = line(&table, "rtt p50/p99  4 cl       64");
        assert!(four.contains("p99 <= 3 x p50: MISSED"), "{table}");
    }

    #[test]
    fn too_few_rounds_get_no_verdict_and_one_layout_no_split() {
        let fx = Fixture::new("few");
        let (few, _) = fx.report(3, 1);
        assert!(!few.contains("by layout"), "{few}");
        assert!(
            few.lines().nth(1).unwrap().ends_with("too few rounds"),
            "{few}"
        );
    }

    #[test]
    fn the_round_trip_is_also_shown_per_layout() {
        let fx = Fixture::new("layouts");
        let (table, json) = fx.report(6, 3);
        // Round trip over 2 x C per round: 2.0, 1.708, 1.615, 1.536, 1.467,
        // 1.406; rounds 0 and 3 ran layout 0, 1 and 4 layout 1, 2 and 5 layout 2.
        assert_eq!(
            table.lines().nth(4).unwrap(),
            "  by layout (round % 3): 0: 1.768, 1: 1.587, 2: 1.511",
            "{table}"
        );
        assert!(json.contains("\"ratio_by_layout\": [1.7678"), "{json}");
    }

    #[test]
    fn every_distribution_and_cs_own_tail_get_a_line() {
        let fx = Fixture::new("distributions");
        let (table, _) = fx.report(6, 3);
        assert!(
            line(&table, "rtt p50/p99  1 cl       64").contains("p99 / p50"),
            "{table}"
        );
        let four = line(&table, "rtt p50/p99  4 cl       64");
        assert!(four.contains("(p99.9 900.00 usec)"), "{table}");
        let four_4k = line(&table, "rtt p50/p99  4 cl     4096");
        assert!(
            four_4k.contains("100.00")
                && four_4k.contains("2.000")
                && four_4k.contains("p99 / p50"),
            "{table}"
        );
        let none = line(&table, "rtt p50/p99 16 cl  1048576");
        assert!(none.contains(" - "), "{table}");
        assert_eq!(
            table
                .lines()
                .filter(|l| l.starts_with("rtt p50/p99"))
                .count(),
            LATENCY_SIZES.len() * LATENCY_CLIENTS.len()
        );
        let c_tail = line(&table, "C ib_send_lat p50/p99");
        assert!(
            c_tail.contains("14.00")
                && c_tail.contains("56.00")
                && c_tail.contains("4.000")
                && c_tail.contains("(p99.9 250.00 usec)"),
            "{table}"
        );
        // The columns line up under the header's.
        let col = |l: &str| l.find(" 42.00").or_else(|| l.find(" 40.00"));
        assert_eq!(col(four), col(table.lines().nth(3).unwrap()), "{table}");
    }

    #[test]
    fn the_spinning_rows_come_last_against_the_same_c_runs() {
        let fx = Fixture::new("spinning");
        let (table, _) = fx.report(6, 3);
        let lines: Vec<&str> = table.lines().collect();
        let n = lines.len();
        assert!(
            lines[n - 2].starts_with("spinning MiB/s       65536")
                && lines[n - 2].ends_with("ib_read_bw: met"),
            "{table}"
        );
        assert!(
            lines[n - 1].starts_with("spinning MiB/s     1048576")
                && lines[n - 1].ends_with("ib_read_bw: met"),
            "{table}"
        );
        let target = |l: &str| l.find("  >= ");
        assert_eq!(target(lines[n - 2]), target(lines[1]), "{table}");
    }

    #[test]
    fn the_json_carries_every_row_with_its_figures() {
        let fx = Fixture::new("json");
        let (_, json) = fx.report(6, 3);
        let parsed = crate::json::Json::parse(&json).unwrap();
        let rows = parsed.as_array().unwrap();
        assert_eq!(
            rows[1].get("verdict").and_then(|v| v.as_str()),
            Some("MISSED")
        );
        assert!(rows[0].get("ci_low").and_then(|v| v.as_f64()).unwrap() > 0.8);
        let member = |row: usize, name: &str| rows[row].get(name).and_then(|v| v.as_f64());
        assert_eq!(member(2, "c_2x_ib_send_lat"), Some(27.0), "{json}");
        assert_eq!(member(2, "kiara"), Some(42.5), "{json}");
        assert_eq!(member(4, "p99_9"), Some(900.0), "{json}");
        let c_tail = 3 + LATENCY_SIZES.len() * LATENCY_CLIENTS.len();
        assert_eq!(member(c_tail, "p99"), Some(56.0), "{json}");
        assert_eq!(member(c_tail, "tail_ratio"), Some(4.0), "{json}");
        assert_eq!(
            member(3 + LATENCY_CLIENTS.len() + 1, "size"),
            Some(4096.0),
            "{json}"
        );
        assert_eq!(
            member(3 + LATENCY_CLIENTS.len() + 1, "p50"),
            Some(100.0),
            "{json}"
        );
        let last = rows.last().unwrap();
        assert_eq!(
            last.get("what").and_then(|v| v.as_str()),
            Some("one-way throughput")
        );
        assert_eq!(member(rows.len() - 1, "busy_poll_us"), Some(50000.0));
        assert_eq!(member(rows.len() - 1, "size"), Some(1048576.0), "{json}");
        assert_eq!(rows[0].get("busy_poll_us"), Some(&crate::json::Json::Null));
    }
}
