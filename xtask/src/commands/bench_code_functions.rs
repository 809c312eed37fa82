//! Where the code rows' instructions are: each side's count split by the
//! function `callgrind` found each instruction in (code the compiler inlined
//! counts in its caller), written to `code-functions.txt` beside the bench's
//! JSON. A cut to the code a message runs shows here by name, and a side that
//! grew says where.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use super::bench_code::{self, Counts, PROGRAMS, SIDES};

/// Functions listed per side at most, the largest first; the rest, and those
/// under half an instruction, are summed in one line.
const TOP: usize = 40;

/// One function's share of a side's counts.
#[derive(Debug, PartialEq)]
struct Share {
    /// Its object's file name and its name, as `callgrind` gives them.
    name: String,
    counts: Counts,
}

/// A side's counts per round trip by function, the largest share of the code
/// first; `None` as for the side's own counts.
fn by_function(short: &str, long: &str) -> Option<Vec<Share>> {
    let a = bench_code::read_output(short)?;
    let b = bench_code::read_output(long)?;
    let mut shares: HashMap<&str, Counts> = HashMap::new();
    for (instr, grew) in bench_code::growth(&a.counts, &b.counts) {
        let name = b.functions.get(instr).map_or("?", String::as_str);
        shares.entry(name).or_default().add(grew);
    }
    let mut shares: Vec<Share> = shares
        .into_iter()
        .filter(|(_, c)| c.total > 0.0)
        .map(|(name, counts)| Share {
            name: name.to_string(),
            counts,
        })
        .collect();
    shares.sort_by(|x, y| {
        y.counts
            .code
            .total_cmp(&x.counts.code)
            .then(x.name.cmp(&y.name))
    });
    Some(shares)
}

/// The text of `code-functions.txt`, from a reader of the raw outputs.
fn text(read: &dyn Fn(String) -> String) -> String {
    let mut out = String::from(
        "Code per 64 B round trip by function (instructions, each at most once a round \
         trip / all; inlined code counts in its caller)\n",
    );
    for program in PROGRAMS {
        for side in SIDES {
            let shares = bench_code::side_outputs(read, program, side)
                .and_then(|(short, long)| by_function(&short, &long));
            let Some(shares) = shares else {
                let _ = writeln!(out, "\n{}, {side}: no count", program.label());
                continue;
            };
            let mut all = Counts::default();
            for s in &shares {
                all.code += s.counts.code;
                all.total += s.counts.total;
            }
            let _ = writeln!(
                out,
                "\n{}, {side}: {:.0} / {:.0}",
                program.label(),
                all.code,
                all.total
            );
            // Listed while they round to an instruction or more; the rest summed.
            let listed = shares
                .iter()
                .take(TOP)
                .take_while(|s| s.counts.code >= 0.5)
                .count();
            for s in &shares[..listed] {
                let _ = writeln!(
                    out,
                    "{:>7.0} {:>8.0}  {}",
                    s.counts.code, s.counts.total, s.name
                );
            }
            let rest = &shares[listed..];
            if !rest.is_empty() {
                let code: f64 = rest.iter().map(|s| s.counts.code).sum();
                let total: f64 = rest.iter().map(|s| s.counts.total).sum();
                let n = rest.len();
                let _ = writeln!(out, "{code:>7.0} {total:>8.0}  ({n} more functions)");
            }
        }
    }
    out
}

/// Writes `code-functions.txt` into `dir` from the code runs' outputs under
/// `raw`; returns its path.
pub fn write(raw: &Path, dir: &Path) -> std::io::Result<std::path::PathBuf> {
    let path = dir.join("code-functions.txt");
    std::fs::write(&path, text(&bench_code::raw_reader(raw)))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`bench_code::sample_output`] with a start-up of 100.
    fn out(n: u64, polls: u64) -> String {
        bench_code::sample_output(n, 100, polls)
    }

    #[test]
    fn each_function_gets_its_own_instructions_largest_first() {
        let (short, long) = (out(bench_code::SHORT, 5), out(bench_code::LONG, 5));
        let shares = by_function(&short, &long).unwrap();
        let names: Vec<&str> = shares.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["x main", "y.so memcpy"]);
        // main: 0x20 and 0x30 once each as code, 1 + 5 in all (its start-up
        // and the call's inclusive line do not count); memcpy: 1 + 0.5.
        assert_eq!(
            shares[0].counts,
            Counts {
                total: 6.0,
                code: 2.0
            }
        );
        assert_eq!(
            shares[1].counts,
            Counts {
                total: 2.5,
                code: 1.5
            }
        );
        assert_eq!(by_function("", &long), None);
    }

    #[test]
    fn the_file_lists_every_side_and_says_which_gave_no_count() {
        let read = |name: String| {
            let n = if name.contains("-3000") {
                bench_code::LONG
            } else {
                bench_code::SHORT
            };
            if name.ends_with(".failed") {
                return String::new();
            }
            if name.ends_with(".cli.txt") {
                return " 64 1000 every echo verified\n".into();
            }
            if name.contains("rust") && name.contains("server") {
                return String::new();
            }
            out(n, 5)
        };
        let t = text(&read);
        // The side: main's and memcpy's, 3.5 and 8.5, as the table rounds them.
        let side = format!("\nKIARA echo, server: {:.0} / {:.0}\n", 3.5, 8.5);
        assert!(t.contains(&side), "{t}");
        assert!(t.contains("\n      2        6  x main\n"), "{t}");
        assert!(t.contains("\nRust ib_send_lat, server: no count\n"), "{t}");
        assert_eq!(t.matches(", client: ").count(), 3, "{t}");
    }
}
