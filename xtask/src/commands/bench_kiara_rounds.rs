//! How many KIARA rounds `cargo xtask bench` runs: `--min-rounds` of them, then
//! one more at a time while one of issue #15's goal rows is still undecided (its
//! interval holds its target), until `--max-rounds` or the `--budget` runs out,
//! as the perftest rows get more rounds while they are not yet precise enough.
//! Each round runs every KIARA row ([`bench_kiara::round_script`]); the guest
//! asks the xtask binary (`__kiara-more`, the same copy as `__bench-more`) which
//! goal rows are undecided after each.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::bench_kiara;
use super::bench_layouts::Layouts;
use super::bench_plan::Rounds;
use crate::process::sh_quote;
use crate::stats;

/// Shell code that runs the KIARA rounds and leaves each output under `$raw`:
/// `rounds.min` rounds, then, while the budget lasts and below `rounds.max`,
/// one more while `decide` (the xtask binary's `__kiara-more` step) names a
/// goal row as undecided. The budget's clock starts after the first `min`.
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
           more=$({decide} __kiara-more --raw \"$raw\" --rounds $r) \
           || {{ echo '  __kiara-more failed: no more KIARA rounds'; break; }}\n  \
           [ -n \"$more\" ] || break\n  \
           echo \"==> KIARA goal rows still undecided: $more\"\n  \
           kiara_round $r; r=$((r + 1))\n\
         done\n\
         echo \"==> KIARA rows: $r rounds\"\n",
        min = rounds.min,
        max = rounds.max,
        budget = rounds.budget_secs,
        decide = sh_quote(decide),
    );
    body
}

/// The goal rows still undecided after `rounds` rounds whose outputs are under
/// `raw` (too few rounds for a verdict counts as undecided), by name.
pub fn undecided(raw: &Path, rounds: usize) -> Vec<String> {
    let read = |name: String| fs::read_to_string(raw.join(name)).unwrap_or_default();
    bench_kiara::goals(&read, rounds)
        .into_iter()
        .filter(|(_, verdict)| *verdict == "undecided" || *verdict == stats::TOO_FEW)
        .map(|(name, _)| name)
        .collect()
}

/// The KIARA rounds that ran, their outputs under `raw`: those that started
/// their one-way runs (each round's first output), counted from round 0.
pub fn rounds_run(raw: &Path) -> usize {
    (0..)
        .take_while(|r| raw.join(format!("kiara-oneway-{r}.txt")).exists())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounds(min: usize, max: usize) -> Rounds {
        Rounds {
            min,
            max,
            budget_secs: 600,
            precision: 0.03,
        }
    }

    #[test]
    fn min_rounds_run_then_more_while_a_goal_is_undecided() {
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
    fn undecided_goal_rows_are_named_and_rounds_counted() {
        let dir = std::env::temp_dir().join(format!("xtask-kiara-rounds-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(rounds_run(&dir), 0);
        // No figures at all: no verdict to wait for.
        assert!(undecided(&dir, 6).is_empty(), "{:?}", undecided(&dir, 6));
        for r in 0..6usize {
            // 10^6 B/s = 0.9537 MiB/s; C reads 50 MiB/s at 64 KiB, 100 at 1 MiB.
            // At 64 KiB KIARA alternates around the target (undecided); at
            // 1 MiB it is far above C (met).
            let mb = if r % 2 == 0 { 45 } else { 60 };
            let oneway = format!("#bytes #msgs MB/s\n 65536 1 {mb}\n 1048576 1 200\n");
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
        assert_eq!(rounds_run(&dir), 6);
        assert_eq!(undecided(&dir, 6), ["one-way-65536"]);
        // Below six rounds no row has a verdict yet: every row with figures waits.
        assert_eq!(undecided(&dir, 3), ["one-way-65536", "one-way-1048576"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
