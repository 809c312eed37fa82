//! How many KIARA rounds `cargo xtask bench` runs: `--min-rounds` of them, then
//! one more at a time while one of issue #15's goal rows is not yet within
//! `--precision` (its interval's half width against its ratio), until
//! `--max-rounds` or a budget of `--budget` seconds of their own runs out: the
//! rule the perftest rows follow ([`stats::needs_more`]), which looks at the
//! interval's width only, never at its verdict. Each round runs every KIARA row
//! ([`bench_kiara::round_script`]); after each, the guest asks the xtask binary
//! (`__kiara-more`, the copy `__bench-more` runs from) which goal rows need more.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::bench_layouts::Layouts;
use super::bench_plan::Rounds;
use super::{bench_kiara, bench_kiara_report};
use crate::process::sh_quote;
use crate::stats;

/// Shell code that runs the KIARA rounds and leaves each output under `$raw`:
/// `rounds.min` rounds, then, while the budget lasts (checked between rounds)
/// and below `rounds.max`, one more while `decide` (the xtask binary's
/// `__kiara-more` step) names a goal row that needs it. The budget's clock
/// starts after the first `min`.
pub fn script(layouts: &Layouts, rounds: &Rounds, decide: &str) -> String {
    let mut body = String::from("kiara_round() {\ncase $1 in\n");
    for round in 0..rounds.max {
        let _ = writeln!(
            body,
            "{round})\n{};;",
            bench_kiara::round_script(layouts, round)
        );
    }
    let _ = write!(
        body,
        "esac\n}}\n\
         r=0\n\
         while [ $r -lt {min} ]; do kiara_round $r; r=$((r + 1)); done\n\
         deadline=$(( $(date +%s) + {budget} ))\n\
         while [ $r -lt {max} ] && [ \"$(date +%s)\" -lt \"$deadline\" ]; do\n  \
           more=$({decide} __kiara-more --raw \"$raw\" --rounds $r --precision {precision}) \
           || {{ echo '  __kiara-more failed: no more KIARA rounds'; break; }}\n  \
           [ -n \"$more\" ] || break\n  \
           echo \"==> KIARA round $((r + 1)): not yet within ±{pct}%: $more\"\n  \
           kiara_round $r; r=$((r + 1))\n\
         done\n\
         echo \"==> KIARA rows: $r rounds\"\n",
        min = rounds.min,
        max = rounds.max,
        budget = rounds.budget_secs,
        decide = sh_quote(decide),
        precision = rounds.precision,
        pct = rounds.precision * 100.0,
    );
    body
}

/// The goal rows that need another round after `rounds` rounds whose outputs are
/// under `raw` ([`stats::needs_more`] at `precision`), by name.
pub fn more(raw: &Path, rounds: usize, precision: f64) -> Vec<String> {
    let read = |name: String| fs::read_to_string(raw.join(name)).unwrap_or_default();
    bench_kiara_report::goals(&read, rounds)
        .into_iter()
        .filter(|(_, row)| stats::needs_more(row.estimate, precision))
        .map(|(name, _)| name)
        .collect()
}

/// The KIARA rounds that ran to their end, their outputs under `raw`: each
/// round writes its number last (`kiara-rounds.txt`).
pub fn rounds_run(raw: &Path) -> usize {
    fs::read_to_string(raw.join("kiara-rounds.txt"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds from `min` to `max`, a budget of 600 s, ±3%.
    fn rounds(min: usize, max: usize) -> Rounds {
        Rounds {
            min,
            max,
            budget_secs: 600,
            precision: 0.03,
        }
    }

    #[test]
    fn min_rounds_run_then_more_while_a_goal_row_is_wide() {
        let s = script(&Layouts::new("l", 2), &rounds(2, 4), "d");
        // A case for every round up to the most, each its own layout's.
        for round in 0..4 {
            let case = s.find(&format!("\n{round})\n")).expect("a case per round");
            let next = s[case..].find(";;").unwrap() + case;
            let body = &s[case..next];
            assert!(
                body.contains(&format!("KIARA round {}", round + 1)),
                "{body}"
            );
            assert!(
                body.contains(&format!("l/{}/kiara-echo-server", round % 2)),
                "{body}"
            );
        }
        assert!(!s.contains("\n4)\n"), "no round beyond the most");
        // Nothing in a round's body ends its branch or the `case` early.
        assert_eq!(s.matches(";;").count(), 4, "{s}");
        assert_eq!(s.matches("esac").count(), 1, "{s}");
        // Each round writes its number last, once all its runs are done.
        let second = &s[s.find("\n1)\n").unwrap()..s.find("\n2)\n").unwrap()];
        assert!(
            second.ends_with("wait\necho 2 > \"$raw/kiara-rounds.txt\"\n;;"),
            "{second}"
        );
        assert!(s.contains("while [ $r -lt 2 ]; do kiara_round $r;"), "{s}");
        assert!(s.contains("while [ $r -lt 4 ] && [ \"$(date +%s)\" -lt \"$deadline\" ]"));
        assert!(
            s.contains("\n  more=$(d __kiara-more --raw \"$raw\" --rounds $r"),
            "{s}"
        );
        assert!(s.contains("deadline=$(( $(date +%s) + 600 ))"), "{s}");
        // The budget's clock starts after the first rounds.
        assert!(s.find("deadline=").unwrap() > s.find("-lt 2 ]").unwrap());
    }

    #[test]
    fn goal_rows_get_more_rounds_by_their_width_not_their_verdict() {
        let dir = std::env::temp_dir().join(format!("xtask-kiara-rounds-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(rounds_run(&dir), 0);
        // No figures at all: more rounds would not help.
        assert!(more(&dir, 6, 0.03).is_empty(), "{:?}", more(&dir, 6, 0.03));
        for r in 0..6usize {
            // 10^6 B/s = 0.9537 MiB/s; C reads 50 MiB/s at 64 KiB, 100 at 1 MiB.
            // At 64 KiB KIARA is steady below the target: missed, and exact.
            // At 1 MiB it swings far above C: met, but wide.
            let mb = if r % 2 == 0 { 150 } else { 250 };
            let oneway = format!("#bytes #msgs MB/s\n 65536 1 45\n 1048576 1 {mb}\n");
            fs::write(dir.join(format!("kiara-oneway-{r}.txt")), oneway).unwrap();
            let bw = |size: u64, v: f64| {
                format!(
                    " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n \
                     {size} 300 {v} {v} 0.003\n"
                )
            };
            for when in ["before", "after"] {
                let file = |size| super::super::bench_adjacent::file("ib_read_bw", size, when, r);
                fs::write(dir.join(file(65536)), bw(65536, 50.0)).unwrap();
                fs::write(dir.join(file(1 << 20)), bw(1 << 20, 100.0)).unwrap();
            }
        }
        fs::write(dir.join("kiara-rounds.txt"), "6\n").unwrap();
        assert_eq!(rounds_run(&dir), 6);
        assert_eq!(more(&dir, 6, 0.03), ["one-way-1048576"]);
        // Wide enough a precision, and neither needs more.
        assert!(more(&dir, 6, 0.5).is_empty(), "{:?}", more(&dir, 6, 0.5));
        // Below six rounds no row has a verdict yet: every row with figures waits.
        assert_eq!(more(&dir, 3, 0.5), ["one-way-65536", "one-way-1048576"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
