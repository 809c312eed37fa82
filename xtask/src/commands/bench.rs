//! `cargo xtask bench`: the C tools (Debian's perftest and `ibv_rc_pingpong`) against
//! their Rust ports, side by side, in one guest boot; then the KIARA rows.
//!
//! Every row (tool and size) runs C and Rust one after the other in each round:
//! first `--min-rounds` rounds of every row, then more rounds of the rows whose
//! 95% interval of the Rust/C ratio is still wider than `--precision`, until
//! `--max-rounds` or the `--budget` runs out. Then the KIARA rows, the same way
//! (`bench_kiara_rounds`), and the
//! instructions a 64-byte round trip runs on each side of C `ib_send_lat`, its
//! port and KIARA (`bench_code`). The table goes to stdout, the
//! results to `target/bench/bench.json` and the plot next to it (PNG and SVG);
//! every raw output stays under `target/bench/raw/` (`--control`, C against C:
//! `target/bench/control/`). The method is in `docs/performance.md`. Not part
//! of CI: a whole run with the defaults takes up to about two hours.

use std::fs;
use std::path::{Path, PathBuf};

use super::bench_layouts;
use super::bench_plan::{self, Rounds, Row};
use super::bench_report::{self, RowResult};
use super::{bench_code, bench_code_functions, bench_kiara_report, bench_kiara_rounds, bench_plot};
use crate::error::{Context, Error, Result};
use crate::guest::GuestRun;
use crate::workspace::Workspace;
use crate::{step, GuestOptions};

/// What to measure and for how long (`cargo xtask bench` options).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchOptions {
    /// Only these tools (all if empty).
    pub tools: Vec<String>,
    /// Only these sizes (all if empty).
    pub sizes: Vec<u64>,
    /// Rounds and time budget.
    pub rounds: Rounds,
    /// Skip the KIARA rows (and the code rows).
    pub no_kiara: bool,
    /// Only the code rows (`bench_code`): no timed rows.
    pub code_only: bool,
    /// An A/A run: C against C itself in every row, as if C were the port; no
    /// KIARA or code rows. How often its intervals exclude 1.0 is how often
    /// the bench calls a difference that is not there.
    pub control: bool,
    /// How many layouts of each Rust program the rounds rotate through
    /// ([`bench_layouts`]).
    pub layouts: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            tools: Vec::new(),
            sizes: Vec::new(),
            rounds: Rounds {
                min: 10,
                max: 30,
                budget_secs: 900,
                precision: 0.03,
            },
            no_kiara: false,
            code_only: false,
            control: false,
            layouts: bench_layouts::DEFAULT,
        }
    }
}

impl BenchOptions {
    /// Takes one bench option, `opt`, reading its value with `value`; false if
    /// `opt` is not a bench option.
    pub fn accept(
        &mut self,
        opt: &str,
        value: &mut dyn FnMut(&str) -> Result<String>,
    ) -> Result<bool> {
        let number = |v: String, what: &str| -> Result<u64> {
            v.parse()
                .map_err(|_| Error::new(format!("{opt}: `{v}` is not {what}")))
        };
        let list = |v: String| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .collect::<Vec<_>>()
        };
        match opt {
            "--tools" => self.tools = list(value("tool,tool,...")?),
            "--sizes" => {
                self.sizes = list(value("bytes,bytes,...")?)
                    .into_iter()
                    .map(|s| number(s, "a size in bytes"))
                    .collect::<Result<_>>()?;
            }
            "--min-rounds" => self.rounds.min = number(value("rounds")?, "a number")? as usize,
            "--max-rounds" => self.rounds.max = number(value("rounds")?, "a number")? as usize,
            "--budget" => self.rounds.budget_secs = number(value("seconds")?, "a number")?,
            "--precision" => {
                let v = value("a share, e.g. 0.03")?;
                self.rounds.precision = v
                    .parse()
                    .ok()
                    .filter(|p: &f64| *p > 0.0)
                    .ok_or_else(|| Error::new(format!("--precision: `{v}` is not above 0")))?;
            }
            "--layouts" => self.layouts = number(value("layouts")?, "a number")? as usize,
            "--no-kiara" => self.no_kiara = true,
            "--code-only" => self.code_only = true,
            "--control" => {
                self.control = true;
                self.no_kiara = true;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The layouts the bench links: `layouts`, or one for the code rows alone,
    /// which count instructions, and those do not depend on the layout, and
    /// for a control run, which runs no Rust program.
    fn layouts_built(&self) -> usize {
        if self.code_only || self.control {
            1
        } else {
            self.layouts
        }
    }

    /// Checks the options against each other and the known tools and sizes.
    pub fn check(&self) -> Result<()> {
        if self.code_only && self.control {
            return Err(Error::new(
                "bench: --control times C against C and --code-only times nothing: pick one",
            ));
        }
        if self.code_only && self.no_kiara {
            return Err(Error::new(
                "bench: --code-only and --no-kiara leave nothing to run",
            ));
        }
        if self.code_only && !(self.tools.is_empty() && self.sizes.is_empty()) {
            return Err(Error::new(
                "bench: --code-only runs no perftest rows: drop --tools and --sizes",
            ));
        }
        if self.rounds.min == 0 || self.rounds.max < self.rounds.min || self.rounds.max > 100 {
            return Err(Error::new(
                "bench: need 1 <= --min-rounds <= --max-rounds <= 100",
            ));
        }
        bench_layouts::check_count(self.layouts)?;
        if let Some(t) = self
            .tools
            .iter()
            .find(|t| !bench_plan::TOOLS.iter().any(|(n, _)| n == t))
        {
            return Err(Error::new(format!("bench: unknown tool `{t}`")));
        }
        if let Some(s) = self.sizes.iter().find(|s| !bench_plan::SIZES.contains(s)) {
            return Err(Error::new(format!(
                "bench: size {s} is not one of {:?}",
                bench_plan::SIZES
            )));
        }
        Ok(())
    }
}

/// The Rust programs a run needs: the ports of its rows' tools, and unless
/// `--no-kiara` the KIARA programs and the `ib_send_lat` port (the code rows).
fn programs(rows: &[Row], opts: &BenchOptions) -> Vec<&'static str> {
    if opts.control {
        return Vec::new();
    }
    let mut names: Vec<&'static str> = Vec::new();
    let kiara = if opts.no_kiara {
        &[][..]
    } else {
        &bench_layouts::KIARA[..]
    };
    let code_port = (!opts.no_kiara).then_some("ib_send_lat");
    let tools = rows.iter().map(|r| r.tool).chain(code_port);
    for name in tools.chain(kiara.iter().copied()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Where the bench writes.
struct Dirs {
    bench: PathBuf,
    raw: PathBuf,
}

/// Empties the raw outputs' directory (`target/bench/raw`, or with
/// `--code-only` `target/bench/code/raw`), writes the plan and a copy of this xtask binary
/// (the guest's `__bench-more` and `__kiara-more` steps: a copy, so that a rebuild
/// during the run does not replace it); returns the guest's script.
fn prepare(ws: &Workspace, dirs: &Dirs, rows: &[Row], opts: &BenchOptions) -> Result<String> {
    let layouts = bench_layouts::build(ws, &programs(rows, opts), opts.layouts_built())?;
    let _ = fs::remove_dir_all(&dirs.raw);
    fs::create_dir_all(&dirs.raw).context(format!("creating {}", dirs.raw.display()))?;
    let plan = dirs.bench.join("plan.txt");
    fs::write(&plan, bench_plan::plan_text(rows)).context(format!("writing {}", plan.display()))?;
    let decide = dirs.bench.join("xtask-bench-more");
    let exe = std::env::current_exe().context("finding the xtask binary")?;
    fs::copy(&exe, &decide).context(format!(
        "copying {} to {}",
        exe.display(),
        decide.display()
    ))?;
    // In a control run the second side of every round is C again.
    let rust_exe = |tool: &str| {
        if opts.control {
            tool.to_string()
        } else {
            layouts.exe_sh(tool, "1")
        }
    };
    let mut body = if opts.code_only {
        bench_plan::prelude(&ws.display(&dirs.raw))
    } else {
        bench_plan::script(
            rows,
            &rust_exe,
            &ws.display(&dirs.raw),
            &ws.display(&decide),
            &ws.display(&plan),
            &opts.rounds,
        )
    };
    if !opts.no_kiara {
        if !opts.code_only {
            body.push_str(&bench_kiara_rounds::script(
                &layouts,
                &opts.rounds,
                &ws.display(&decide),
            ));
        }
        let [server, client, _] = bench_layouts::KIARA.map(|name| layouts.exe(name, 0));
        body.push_str(&bench_code::script(&bench_code::Programs {
            port: &layouts.exe("ib_send_lat", 0),
            server: &server,
            client: &client,
        }));
    }
    Ok(body)
}

/// Reads the results, prints the tables, writes the JSON and the plot; returns
/// how many runs gave no figure.
fn report(ws: &Workspace, dirs: &Dirs, rows: &[Row], opts: &BenchOptions) -> Result<usize> {
    let results = bench_report::results(&dirs.raw, rows);
    let code_missed = if opts.no_kiara {
        0
    } else {
        bench_code::missing(&dirs.raw)
    };
    let missed = results.iter().map(|r| r.figures.missing()).sum::<usize>() + code_missed;
    let none = || (String::new(), "[]".to_string());
    let kiara_rounds = bench_kiara_rounds::rounds_run(&dirs.raw);
    let (kiara_table, kiara_json) = if opts.no_kiara || opts.code_only {
        none()
    } else {
        let (table, json) =
            bench_kiara_report::report(&dirs.raw, kiara_rounds, opts.layouts_built());
        (format!("KIARA rows: {kiara_rounds} rounds\n{table}"), json)
    };
    let (code_table, code_json) = if opts.no_kiara {
        none()
    } else {
        bench_code::report(&dirs.raw)
    };
    let kiara = Kiara {
        rounds: kiara_rounds,
        rows: &kiara_json,
    };
    let json = json_document(&results, opts, &kiara, &code_json);
    let json_path = dirs.bench.join("bench.json");
    fs::write(&json_path, json).context(format!("writing {}", json_path.display()))?;
    let functions = if opts.no_kiara {
        String::new()
    } else {
        let path = bench_code_functions::write(&dirs.raw, &dirs.bench).context(format!(
            "writing the code by function in {}",
            dirs.bench.display()
        ))?;
        format!(", the code by function in {}", ws.display(&path))
    };
    if opts.code_only {
        println!("{code_table}");
        step!(
            "bench: results in {}{functions} (raw outputs in {}); {missed} sides gave no count",
            ws.display(&json_path),
            ws.display(&dirs.raw)
        );
        return Ok(missed);
    }
    if opts.control {
        println!("A/A control: the Rust column is C run again; every verdict is a false one");
    }
    println!("{}", bench_report::table(&results));
    println!("{kiara_table}");
    println!("{code_table}");
    // The plot's axis is Rust over C, which a control run does not have.
    let plots = if opts.control {
        String::new()
    } else {
        let files = bench_plot::plot_file(&json_path, &dirs.bench)?;
        let names: Vec<String> = files.iter().map(|p| ws.display(p)).collect();
        format!(", plot in {}", names.join(" and "))
    };
    step!(
        "bench: results in {}{plots}{functions} (raw outputs in {}); {missed} runs or \
         code sides gave no figure",
        ws.display(&json_path),
        ws.display(&dirs.raw)
    );
    Ok(missed)
}

/// The KIARA rows for the JSON: how many rounds ran, and the rows' array.
struct Kiara<'a> {
    rounds: usize,
    rows: &'a str,
}

/// The whole JSON document; `code` is the code rows' array.
fn json_document(results: &[RowResult], opts: &BenchOptions, kiara: &Kiara, code: &str) -> String {
    let members = [
        (
            "method",
            method_json(&opts.rounds, opts.layouts_built(), opts.control),
        ),
        (
            "results",
            format!("[\n{}\n  ]", bench_report::json_rows(results)),
        ),
        ("kiara_rounds", kiara.rounds.to_string()),
        ("kiara", kiara.rows.to_string()),
        ("code", code.to_string()),
    ];
    let body: Vec<String> = members
        .iter()
        .map(|(key, value)| format!("  \"{key}\": {value}"))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

/// The `method` object of the JSON: the rounds' settings, the layouts they
/// rotate through, whether it was a control run (C against C) and how ratios
/// and intervals are taken.
fn method_json(r: &Rounds, layouts: usize, control: bool) -> String {
    let text = |s: &str| format!("\"{s}\"");
    let members = [
        ("min_rounds", r.min.to_string()),
        ("max_rounds", r.max.to_string()),
        ("budget_secs", r.budget_secs.to_string()),
        ("precision", r.precision.to_string()),
        ("layouts", layouts.to_string()),
        (
            "layout_of_round",
            text("round % layouts; 0 plain, k shuffled by lld with seed k"),
        ),
        ("control", control.to_string()),
        ("level", crate::stats::LEVEL.to_string()),
        (
            "interval",
            text("median of the rounds' ratios, from its k-th smallest to its k-th largest (sign test); no verdict below 6 rounds"),
        ),
        (
            "kiara_tail",
            text("each run's p99 over its own p50; median and interval as above"),
        ),
        (
            "ratio",
            text("Rust time / C time (bandwidth rows: C figure / Rust figure); below 1 is faster"),
        ),
    ];
    let body: Vec<String> = members
        .iter()
        .map(|(key, value)| format!("\"{key}\": {value}"))
        .collect();
    ["{", &body.join(", "), "}"].concat()
}

/// Runs the command; returns the exit code for xtask.
pub fn run(guest: &GuestOptions, opts: &BenchOptions) -> Result<i32> {
    opts.check()?;
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    // A run of the code rows alone, or a control run, keeps to its own
    // directory: a full run's outputs stay.
    let bench = if opts.code_only {
        ws.target.join("bench").join("code")
    } else if opts.control {
        ws.target.join("bench").join("control")
    } else {
        ws.target.join("bench")
    };
    let dirs = Dirs {
        raw: bench.join("raw"),
        bench,
    };
    let rows = if opts.code_only {
        Vec::new()
    } else {
        bench_plan::rows(&opts.tools, &opts.sizes)
    };
    let body = prepare(&ws, &dirs, &rows, opts)?;
    let status = GuestRun::new(&ws)?.run(&assets, guest, &body, &mut |_, _| {})?;
    if status != 0 {
        step!("the bench script ended with status {status}");
    }
    let missed = report(&ws, &dirs, &rows, opts)?;
    Ok(if missed == 0 { 0 } else { 1 })
}

/// `cargo xtask bench --plot-only JSON`: the plot again, from a bench.json, next to it.
pub fn plot_only(json: &Path) -> Result<i32> {
    let dir = json.parent().unwrap_or(Path::new("."));
    for p in bench_plot::plot_file(json, dir)? {
        step!("bench: wrote {}", p.display());
    }
    Ok(0)
}

/// The guest's `__bench-more` step: prints the ids of the rows of `plan` that need
/// another round (see [`bench_report::more`]).
pub fn more(plan: &Path, raw: &Path, rounds: usize, precision: f64) -> Result<i32> {
    let text = fs::read_to_string(plan).context(format!("reading {}", plan.display()))?;
    println!(
        "{}",
        bench_report::more(&bench_plan::parse_plan(&text), raw, rounds, precision)
    );
    Ok(0)
}

/// The guest's `__kiara-more` step: prints the names of the KIARA goal rows that
/// need another round after `rounds` rounds (see [`bench_kiara_rounds::more`]).
pub fn kiara_more(raw: &Path, rounds: usize, precision: f64) -> Result<i32> {
    println!(
        "{}",
        bench_kiara_rounds::more(raw, rounds, precision).join(" ")
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_taken_and_checked() {
        let mut o = BenchOptions::default();
        let mut vals = ["ib_send_lat,ib_write_bw", "2,64", "3", "0.1"].into_iter();
        let mut value = |_: &str| Ok(vals.next().unwrap().to_string());
        assert!(o.accept("--tools", &mut value).unwrap());
        assert!(o.accept("--sizes", &mut value).unwrap());
        assert!(o.accept("--max-rounds", &mut value).unwrap());
        assert!(o.accept("--precision", &mut value).unwrap());
        assert!(!o.accept("--bogus", &mut value).unwrap());
        assert_eq!(o.tools, ["ib_send_lat", "ib_write_bw"]);
        assert_eq!(
            (o.sizes.clone(), o.rounds.max, o.rounds.precision),
            (vec![2, 64], 3, 0.1)
        );
        assert!(o.check().is_err(), "max 3 is below min 10");
        o.rounds.min = 2;
        o.check().unwrap();
        o.sizes = vec![3];
        assert!(o.check().is_err());
        let none = Kiara {
            rounds: 12,
            rows: "[]",
        };
        let doc = json_document(&[], &BenchOptions::default(), &none, "[]");
        let parsed = crate::json::Json::parse(&doc).unwrap();
        assert!(parsed
            .get("method")
            .and_then(|m| m.get("precision"))
            .is_some());
        let rounds = parsed.get("kiara_rounds");
        assert_eq!(rounds.and_then(crate::json::Json::as_f64), Some(12.0));
        let layouts = parsed.get("method").and_then(|m| m.get("layouts"));
        assert_eq!(
            layouts.and_then(crate::json::Json::as_f64),
            Some(bench_layouts::DEFAULT as f64)
        );
        assert!(parsed.get("code").is_some());
        let mut even = |_: &str| Ok("4".to_string());
        assert!(o.accept("--layouts", &mut even).unwrap());
        assert!(o.check().is_err(), "an even count of layouts");
    }

    #[test]
    fn only_the_programs_a_run_needs_are_linked() {
        let mut o = BenchOptions::default();
        let rows = bench_plan::rows(&["ib_write_bw".into(), "ib_send_lat".into()], &[64]);
        let kiara = bench_layouts::KIARA;
        let want: Vec<&str> = ["ib_write_bw", "ib_send_lat"]
            .into_iter()
            .chain(kiara)
            .collect();
        assert_eq!(programs(&rows, &o), want);
        o.no_kiara = true;
        assert_eq!(programs(&rows[..1], &o), ["ib_write_bw"]);
        o.no_kiara = false;
        let code: Vec<&str> = ["ib_send_lat"].into_iter().chain(kiara).collect();
        assert_eq!(programs(&[], &o), code);
    }

    #[test]
    fn a_control_run_times_c_against_c_and_links_nothing() {
        let ws = Workspace::locate().unwrap();
        let bench =
            std::env::temp_dir().join(format!("xtask-bench-control-{}", std::process::id()));
        let dirs = Dirs {
            raw: bench.join("raw"),
            bench: bench.clone(),
        };
        let mut o = BenchOptions::default();
        assert!(o.accept("--control", &mut |_| unreachable!()).unwrap());
        assert!(o.control && o.no_kiara && o.layouts_built() == 1);
        o.check().unwrap();
        let rows = bench_plan::rows(&["ib_send_lat".into()], &[64]);
        assert_eq!(programs(&rows, &o), Vec::<&str>::new());
        let script = prepare(&ws, &dirs, &rows, &o).unwrap();
        // Both sides of every round are Debian's program; no KIARA, no code rows.
        assert!(
            script.contains("pair ib_send_lat \"ib_send_lat-64-c-$1.txt\"")
                && script.contains("pair ib_send_lat \"ib_send_lat-64-rust-$1.txt\""),
            "{script}"
        );
        assert!(
            !script.contains("layouts/") && !script.contains("kiara"),
            "{script}"
        );
        let none = Kiara {
            rounds: 0,
            rows: "[]",
        };
        let doc = json_document(&[], &o, &none, "[]");
        let method = crate::json::Json::parse(&doc).unwrap();
        let control = method.get("method").and_then(|m| m.get("control"));
        assert_eq!(
            control.and_then(crate::json::Json::as_bool),
            Some(true),
            "{doc}"
        );
        o.code_only = true;
        assert!(o.check().is_err(), "--control with --code-only");
        let _ = fs::remove_dir_all(&bench);
    }
}
