//! The perftest rows of `cargo xtask bench` from the raw outputs: the figures of
//! each round, the medians, the Rust/C time ratio with its interval and
//! verdict; the table, the JSON, and the guest's `__bench-more` step.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::bench_plan::{figure, unit, Row};
use crate::stats::{self, RatioEstimate, Verdict};

/// The figures of a row's rounds: `c[i]` and `rust[i]` from round `i` (NaN where
/// a run gave none), for every round that has at least one output file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// C's figure per round.
    pub c: Vec<f64>,
    /// Rust's figure per round.
    pub rust: Vec<f64>,
}

impl Figures {
    /// Reads the row's rounds under `raw`, up to the first round with no file.
    pub fn read(raw: &Path, row: &Row) -> Self {
        let mut f = Figures::default();
        for round in 0.. {
            let text = |rust| fs::read_to_string(raw.join(row.file(rust, round))).ok();
            let (c, rust) = (text(false), text(true));
            if c.is_none() && rust.is_none() {
                break;
            }
            // perftest prints `inf` when its CPU-frequency estimate failed.
            let value = |t: Option<String>| {
                t.and_then(|t| figure(row.metric, row.size, &t))
                    .filter(|v| v.is_finite())
                    .unwrap_or(f64::NAN)
            };
            f.c.push(value(c));
            f.rust.push(value(rust));
        }
        f
    }

    /// How many runs gave no figure.
    pub fn missing(&self) -> usize {
        self.c
            .iter()
            .chain(&self.rust)
            .filter(|v| v.is_nan())
            .count()
    }
}

/// A row's result: the Rust/C ratio of time (for a bandwidth row, C's figure
/// over Rust's: the time a message takes), so that below 1.0 is always "Rust faster".
#[derive(Clone, Debug)]
pub struct RowResult {
    /// The row.
    pub row: Row,
    /// Its figures, round by round.
    pub figures: Figures,
    /// Median of C's figures (rounds where both sides gave one).
    pub c_median: Option<f64>,
    /// Median of Rust's figures (the same rounds).
    pub rust_median: Option<f64>,
    /// The ratio, its interval and the pairs it rests on.
    pub estimate: Option<RatioEstimate>,
}

impl RowResult {
    /// Computes a row's result from its figures: the median of the rounds'
    /// ratios and the sign test's interval of it ([`stats::round_ratios`]).
    pub fn new(row: Row, figures: Figures) -> Self {
        let (estimate, c_median, rust_median) = if row.metric.higher_is_better() {
            let e = stats::round_ratios(&figures.c, &figures.rust);
            (e, e.map(|e| e.num_median), e.map(|e| e.den_median))
        } else {
            let e = stats::round_ratios(&figures.rust, &figures.c);
            (e, e.map(|e| e.den_median), e.map(|e| e.num_median))
        };
        RowResult {
            row,
            figures,
            c_median,
            rust_median,
            estimate,
        }
    }

    /// The verdict words, "too few rounds" or "no data".
    pub fn verdict(&self) -> &'static str {
        match self.estimate {
            None => "no data",
            Some(e) if e.n < stats::MIN_FOR_VERDICT => stats::TOO_FEW,
            Some(e) => Verdict::of(e.ci).words(),
        }
    }

    /// Whether the row needs another round ([`stats::needs_more`]).
    pub fn needs_more(&self, precision: f64) -> bool {
        stats::needs_more(self.estimate, precision)
    }
}

/// The results of `rows`, read from `raw`.
pub fn results(raw: &Path, rows: &[Row]) -> Vec<RowResult> {
    rows.iter()
        .map(|r| RowResult::new(*r, Figures::read(raw, r)))
        .collect()
}

/// The guest's `__bench-more` step: the ids (plan order) of the rows that ran
/// `rounds` rounds and are not yet within ± `precision`, separated by spaces.
pub fn more(plan: &[Row], raw: &Path, rounds: usize, precision: f64) -> String {
    plan.iter()
        .enumerate()
        .filter(|(_, row)| {
            let r = RowResult::new(**row, Figures::read(raw, row));
            r.figures.c.len() >= rounds && r.needs_more(precision)
        })
        .map(|(id, _)| id.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A figure as the table shows it.
fn show(v: Option<f64>, unit: &str) -> String {
    v.map_or("-".to_string(), |v| match unit {
        "Mpps" => format!("{v:.6}"),
        _ => format!("{v:.2}"),
    })
}

/// The perftest table.
pub fn table(results: &[RowResult]) -> String {
    let mut t = format!(
        "{:<16} {:>8} {:>6}  {:>12}  {:>12}  {:<6} {:>6}  {:<15} verdict (Rust vs C)\n",
        "tool", "size", "rounds", "C median", "Rust median", "unit", "ratio", "95% CI"
    );
    for r in results {
        let unit = unit(r.row.metric, r.row.size);
        let (ratio, ci) = r.estimate.map_or(("-".into(), "-".into()), |e| {
            (
                format!("{:.3}", e.ratio),
                format!("[{:.3}, {:.3}]", e.ci.lo, e.ci.hi),
            )
        });
        let _ = writeln!(
            t,
            "{:<16} {:>8} {:>6}  {:>12}  {:>12}  {:<6} {:>6}  {:<15} {}",
            r.row.tool,
            r.row.size,
            r.estimate.map_or(0, |e| e.n),
            show(r.c_median, unit),
            show(r.rust_median, unit),
            unit,
            ratio,
            ci,
            r.verdict()
        );
    }
    t.push_str(
        "ratio: Rust's time over C's (bandwidth rows: C's figure over Rust's); below 1 is faster\n",
    );
    t.push_str(&verdict_count(results));
    t
}

/// How many rows with a verdict were called faster or slower, against how
/// many would be on average if no row differed (the sum of each row's
/// `1 - coverage`, [`stats::sign_rank`]): the line under the table, and what
/// an A/A run (`--control`) is read by.
pub fn verdict_count(results: &[RowResult]) -> String {
    let decided: Vec<RatioEstimate> = results
        .iter()
        .filter_map(|r| r.estimate)
        .filter(|e| e.n >= stats::MIN_FOR_VERDICT)
        .collect();
    let called = decided
        .iter()
        .filter(|e| Verdict::of(e.ci) != Verdict::Same)
        .count();
    let by_chance: f64 = decided
        .iter()
        .filter_map(|e| stats::sign_rank(e.n))
        .map(|(_, coverage)| 1.0 - coverage)
        .sum();
    format!(
        "intervals excluding 1.0: {called} of {} rows (with no real difference, {by_chance:.2} \
         on average)\n",
        decided.len()
    )
}

/// A number for JSON (`null` if absent or not finite).
pub fn num(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or("null".to_string(), |v| v.to_string())
}

/// One JSON object of a results array, on its own indented line, from its
/// members (`"name": value, ...`).
pub fn entry(members: &str) -> String {
    ["    {", members, "}"].concat()
}

/// A JSON array of figures.
fn list(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|x| num(Some(*x))).collect();
    format!("[{}]", items.join(", "))
}

/// The JSON objects of the rows, one per line, without the enclosing array.
pub fn json_rows(results: &[RowResult]) -> String {
    let rows: Vec<String> = results
        .iter()
        .map(|r| {
            let e = r.estimate;
            entry(&format!(
                "\"tool\": \"{}\", \"size\": {}, \"unit\": \"{}\", \"higher_is_better\": {}, \
                 \"rounds\": {}, \"pairs\": {}, \"c\": {}, \"rust\": {}, \"c_median\": {}, \
                 \"rust_median\": {}, \"ratio\": {}, \"ci_low\": {}, \"ci_high\": {}, \"verdict\": \"{}\"",
                r.row.tool,
                r.row.size,
                unit(r.row.metric, r.row.size),
                r.row.metric.higher_is_better(),
                r.figures.c.len(),
                e.map_or(0, |e| e.n),
                list(&r.figures.c),
                list(&r.figures.rust),
                num(r.c_median),
                num(r.rust_median),
                num(e.map(|e| e.ratio)),
                num(e.map(|e| e.ci.lo)),
                num(e.map(|e| e.ci.hi)),
                r.verdict()
            ))
        })
        .collect();
    rows.join(",\n")
}

#[cfg(test)]
mod tests {
    use super::super::bench_plan::{rows, Metric};
    use super::*;

    fn row(tool: &'static str, metric: Metric) -> Row {
        Row {
            tool,
            metric,
            size: 64,
        }
    }

    #[test]
    fn ratios_are_times_for_both_kinds_of_rows() {
        // Bandwidth: Rust moves twice as much, so its time is half.
        let f = Figures {
            c: vec![1.0, 1.1, 0.9, 1.0, 1.05, 1.0],
            rust: vec![2.0, 2.2, 1.8, 2.0, 2.1, 2.0],
        };
        let r = RowResult::new(row("ib_write_bw", Metric::Bandwidth), f);
        let e = r.estimate.unwrap();
        assert!((e.ratio - 0.5).abs() < 1e-9, "{e:?}");
        assert_eq!((r.c_median, r.rust_median), (Some(1.0), Some(2.0)));
        assert_eq!(r.verdict(), "faster");
        // Latency: Rust takes twice as long.
        let f = Figures {
            c: vec![10.0, 11.0, 9.0, 10.0, 10.0, 12.0],
            rust: vec![20.0, 22.0, 18.0, 20.0, 20.0, 24.0],
        };
        let r = RowResult::new(row("ib_send_lat", Metric::Latency), f);
        assert_eq!(r.estimate.map(|e| e.ratio), Some(2.0));
        assert_eq!((r.c_median, r.rust_median), (Some(10.0), Some(20.0)));
        assert_eq!(r.verdict(), "slower");
        assert!(!r.needs_more(0.05));
        let noisy = Figures {
            c: vec![10.0, 20.0, 9.0, 10.0, 15.0, 11.0],
            rust: vec![20.0, 9.0, 12.0, 10.0, 9.0, 12.0],
        };
        let r = RowResult::new(row("ib_send_lat", Metric::Latency), noisy);
        assert_eq!(r.verdict(), "same within noise");
        assert!(r.needs_more(0.05));
        let r = RowResult::new(row("ib_send_lat", Metric::Latency), Figures::default());
        assert_eq!((r.verdict(), r.needs_more(0.05)), ("no data", false));
    }

    #[test]
    fn the_count_leaves_out_rows_without_a_verdict() {
        let result = |c: &[f64], rust: &[f64]| {
            let figures = Figures {
                c: c.to_vec(),
                rust: rust.to_vec(),
            };
            RowResult::new(row("ib_send_lat", Metric::Latency), figures)
        };
        let c = [10.0, 11.0, 9.0, 10.0, 10.0, 12.0];
        let slow: Vec<f64> = c.iter().map(|x| x * 1.5).collect();
        let rows = [
            result(&c, &slow),
            result(&c, &[10.5, 10.0, 9.5, 11.0, 9.0, 12.5]),
            // Five rounds: slower in all, but no verdict; however narrow, the
            // row runs another round.
            result(&c[..5], &slow[..5]),
        ];
        assert!(rows[2].needs_more(10.0) && !rows[0].needs_more(10.0));
        assert_eq!(
            (rows[0].verdict(), rows[1].verdict(), rows[2].verdict()),
            ("slower", "same within noise", stats::TOO_FEW)
        );
        let line = verdict_count(&rows);
        assert!(
            line.starts_with("intervals excluding 1.0: 1 of 2 rows"),
            "{line}"
        );
        // Two rows of six rounds: 2 x 2/64 by chance.
        assert!(line.contains("difference, 0.06 on average"), "{line}");
    }

    #[test]
    fn figures_table_json_and_more_from_files() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-report-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let plan = rows(&["ib_send_lat".into()], &[2, 64]);
        let lat = |t: f64| format!(" #bytes #iterations t_min t_max t_typical\n 2 200 1 2 {t} 3\n");
        for round in 0..3 {
            for (rust, t) in [
                (false, 10.0 + round as f64),
                (true, 3.0 * (10.0 + round as f64)),
            ] {
                fs::write(dir.join(plan[0].file(rust, round)), lat(t)).unwrap();
                fs::write(
                    dir.join(plan[1].file(rust, round)),
                    lat(10.0 * (1.0 + rust as u8 as f64 * round as f64)),
                )
                .unwrap();
            }
        }
        fs::write(dir.join(plan[0].file(true, 3)), "garbage").unwrap();
        let res = results(&dir, &plan);
        assert_eq!(res[0].figures.c[..3], [10.0, 11.0, 12.0]);
        assert!(res[0].figures.c[3].is_nan() && res[0].figures.rust[3].is_nan());
        assert_eq!(res[0].figures.missing(), 2);
        assert_eq!(res[0].verdict(), "too few rounds");
        // Row 0: 3 x C in each of three rounds, an interval of no width, but
        // short of the six rounds a verdict needs; row 1: Rust 10, 20, 30
        // against C 10, a wide interval.
        assert_eq!(more(&plan, &dir, 3, 0.05), "0 1");
        assert_eq!(more(&plan, &dir, 5, 0.05), "");
        let t = table(&res);
        assert!(
            t.contains("ib_send_lat") && t.contains("too few rounds") && t.contains("95% CI"),
            "{t}"
        );
        let j = format!("[{}]", json_rows(&res));
        let parsed = crate::json::Json::parse(&j).unwrap();
        let first = &parsed.as_array().unwrap()[0];
        assert_eq!(
            first.get("verdict").and_then(|v| v.as_str()),
            Some("too few rounds")
        );
        assert_eq!(first.get("rounds"), Some(&crate::json::Json::Number(4.0)));
        fs::remove_dir_all(&dir).unwrap();
    }
}
