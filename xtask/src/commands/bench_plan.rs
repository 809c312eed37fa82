//! What `cargo xtask bench` measures: the tools, sizes and options of the
//! perftest rows, how a figure is read from a tool's output, and the guest's
//! shell script that runs the rows round after round.

use std::fmt::Write as _;

use crate::process::sh_quote;

/// Message sizes.
pub const SIZES: &[u64] = &[2, 64, 4096, 65536, 1 << 20];

/// What a tool's figure means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// perftest's average bandwidth (MiB/s), or its message rate (Mpps) below
    /// `MSG_RATE_BELOW` bytes, where two decimals of MiB/s are too coarse: higher is
    /// better.
    Bandwidth,
    /// perftest's t_typical (usec): lower is better.
    Latency,
    /// `ibv_rc_pingpong`'s usec/iter: lower is better.
    PingPong,
}

impl Metric {
    /// Whether a higher figure is better (a rate rather than a time).
    pub fn higher_is_better(self) -> bool {
        self == Metric::Bandwidth
    }
}

/// The tools: name (the same for the C program and the Rust binary) and metric.
pub const TOOLS: &[(&str, Metric)] = &[
    ("ib_write_bw", Metric::Bandwidth),
    ("ib_read_bw", Metric::Bandwidth),
    ("ib_send_bw", Metric::Bandwidth),
    ("ib_write_lat", Metric::Latency),
    ("ib_read_lat", Metric::Latency),
    ("ib_send_lat", Metric::Latency),
    ("ibv_rc_pingpong", Metric::PingPong),
];

/// Iterations per run, short enough for a round of every row to take minutes.
fn iterations(metric: Metric, size: u64) -> u64 {
    match (metric, size) {
        // Tiny messages: long enough for a steady rate (2000 took 45 ms, noise-bound).
        (Metric::Bandwidth, s) if s <= 64 => 20000,
        (Metric::Bandwidth, s) if s <= 4096 => 2000,
        (Metric::Bandwidth, s) if s <= 65536 => 300,
        (Metric::Bandwidth, _) => 20,
        // ibv_rc_pingpong reports one average from its start: short runs are noisy.
        (Metric::PingPong, s) if s <= 4096 => 20000,
        (Metric::PingPong, s) if s <= 65536 => 500,
        (Metric::PingPong, _) => 50,
        (_, s) if s <= 4096 => 500,
        (_, s) if s <= 65536 => 100,
        _ => 10,
    }
}

/// The options of one run (both sides), without the port and the server address.
fn options(tool: &str, metric: Metric, size: u64) -> Vec<String> {
    let n = iterations(metric, size).to_string();
    let mut v: Vec<String> = match metric {
        Metric::PingPong => vec!["-g".into(), "1".into()],
        _ => vec!["-x".into(), "1".into()],
    };
    v.extend(["-s".into(), size.to_string(), "-n".into(), n]);
    if tool == "ibv_rc_pingpong" {
        // A small receive queue: fewer receives to post before the first ping.
        v.extend(["-r".into(), "100".into()]);
    }
    v
}

/// Bandwidth runs smaller than this are compared by message rate.
const MSG_RATE_BELOW: u64 = 4096;

/// The unit of a figure.
pub fn unit(metric: Metric, size: u64) -> &'static str {
    match metric {
        Metric::Bandwidth if size < MSG_RATE_BELOW => "Mpps",
        Metric::Bandwidth => "MiB/s",
        _ => "usec",
    }
}

/// The client's figure from its output.
pub fn figure(metric: Metric, size: u64, out: &str) -> Option<f64> {
    let row_after = |word: &str, col: usize| -> Option<f64> {
        let mut lines = out.lines();
        lines.find(|l| l.contains(word))?;
        let row = lines.find(|l| !l.trim().is_empty())?;
        row.split_whitespace().nth(col)?.parse().ok()
    };
    match metric {
        Metric::Bandwidth if size < MSG_RATE_BELOW => row_after("BW average", 4),
        Metric::Bandwidth => row_after("BW average", 3),
        Metric::Latency => row_after("t_typical", 4),
        Metric::PingPong => {
            let line = out.lines().find(|l| l.ends_with("usec/iter"))?;
            let w: Vec<&str> = line.split_whitespace().collect();
            w.get(w.len().checked_sub(2)?)?.parse().ok()
        }
    }
}

/// One row of the table: a tool at one size, C against Rust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The tool's name.
    pub tool: &'static str,
    /// What its figure means.
    pub metric: Metric,
    /// The message size, bytes.
    pub size: u64,
}

impl Row {
    /// The raw output file of the client of one run.
    pub fn file(&self, rust: bool, round: usize) -> String {
        let side = if rust { "rust" } else { "c" };
        format!("{}-{}-{side}-{round}.txt", self.tool, self.size)
    }

    /// The row's name, e.g. `ib_write_bw 64`.
    pub fn name(&self) -> String {
        format!("{} {}", self.tool, self.size)
    }
}

/// The rows, in table order, of the tools and sizes asked for (all if empty).
pub fn rows(tools: &[String], sizes: &[u64]) -> Vec<Row> {
    let mut out = Vec::new();
    for &(tool, metric) in TOOLS {
        if !tools.is_empty() && !tools.iter().any(|t| t == tool) {
            continue;
        }
        for &size in SIZES {
            if sizes.is_empty() || sizes.contains(&size) {
                out.push(Row { tool, metric, size });
            }
        }
    }
    out
}

/// The plan file the guest's `__bench-more` step reads: a row per line, `tool size`.
pub fn plan_text(rows: &[Row]) -> String {
    rows.iter().map(|r| format!("{}\n", r.name())).collect()
}

/// The rows of a plan file, in order; unknown lines are skipped.
pub fn parse_plan(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|l| {
            let (tool, size) = l.trim().split_once(' ')?;
            let size = size.trim().parse().ok()?;
            let &(tool, metric) = TOOLS.iter().find(|(t, _)| *t == tool)?;
            Some(Row { tool, metric, size })
        })
        .collect()
}

/// How many rounds, and for how long, the guest runs the rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Rounds {
    /// Rounds every row runs.
    pub min: usize,
    /// Rounds no row runs more than.
    pub max: usize,
    /// Seconds the rounds after the first `min` may take, in all.
    pub budget_secs: u64,
    /// A row runs more rounds while its interval is wider than ± this share of its ratio.
    pub precision: f64,
}

/// Shell helpers: `wait_listen PORT`, and `pair PROG FILE PORT ARGS...`, which
/// runs a server and its client on the guest's address, keeping the client's output.
const HELPERS: &str = "\
wait_listen() { hex=$(printf ':%04X ' \"$1\"); i=0; \
while [ $i -lt 100 ]; do grep -q \"$hex.* 0A \" /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0; \
sleep 0.1; i=$((i+1)); done; return 1; }
pair() { prog=$1; f=$2; port=$3; shift 3
  timeout 120 \"$prog\" \"$@\" -p \"$port\" > \"$raw/srv-$f\" 2>&1 &
  wait_listen \"$port\"
  timeout 120 \"$prog\" \"$@\" -p \"$port\" 198.18.0.1 > \"$raw/$f\" 2>&1 || echo \"  client failed: $f\"
  wait; }
";

/// The shell function `row_<id> ROUND` of a row: C and Rust, one after the
/// other, C first in even rounds and Rust first in odd ones (so that neither
/// side always runs right after another tool). Every run has its own port.
/// `rust_exe` is the Rust program as a shell word, which may use the round, `$1`.
fn row_function(id: usize, row: &Row, rust_exe: &str) -> String {
    let args = options(row.tool, row.metric, row.size)
        .iter()
        .map(|a| sh_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    let side = |rust: bool, port: &str| {
        let prog = if rust {
            rust_exe.to_string()
        } else {
            sh_quote(row.tool)
        };
        let file = format!(
            "{}-{}-{}-$1.txt",
            row.tool,
            row.size,
            if rust { "rust" } else { "c" }
        );
        format!("pair {prog} \"{file}\" {port} {args}")
    };
    format!(
        "row_{id}() {{ p=$((20000 + ({id} * 200 + $1 * 2) % 40000))\n  \
         echo \"==> {name} round $(($1 + 1))\"\n  \
         if [ $(($1 % 2)) -eq 0 ]; then\n    {c0}\n    {r1}\n  else\n    {r0}\n    {c1}\n  fi; }}\n",
        name = row.name(),
        c0 = side(false, "$p"),
        r1 = side(true, "$((p + 1))"),
        r0 = side(true, "$p"),
        c1 = side(false, "$((p + 1))"),
    )
}

/// The start of every bench script: `$raw` (where the outputs go) and the
/// shell helpers.
pub fn prelude(raw: &str) -> String {
    format!("raw={}\n{HELPERS}", sh_quote(raw))
}

/// The guest's script for the perftest rows: `rounds.min` rounds of every row,
/// then, while the budget lasts and below `rounds.max`, one more round of each
/// row that `decide` (the xtask binary's `__bench-more` step, reading `plan`)
/// names as not yet precise enough. `rust_exe(tool)` is the Rust binary as a
/// shell word, which may use the round, `$1` (e.g. to pick its layout).
pub fn script(
    rows: &[Row],
    rust_exe: &dyn Fn(&str) -> String,
    raw: &str,
    decide: &str,
    plan: &str,
    rounds: &Rounds,
) -> String {
    let mut body = prelude(raw);
    for (id, row) in rows.iter().enumerate() {
        body.push_str(&row_function(id, row, &rust_exe(row.tool)));
    }
    let all = (0..rows.len()).map(|i| i.to_string()).collect::<Vec<_>>();
    let _ = write!(
        body,
        "r=0\n\
         while [ $r -lt {min} ]; do\n  \
           for id in {all}; do row_$id $r; done\n  r=$((r + 1))\n\
         done\n\
         deadline=$(( $(date +%s) + {budget} ))\n\
         while [ $r -lt {max} ] && [ \"$(date +%s)\" -lt \"$deadline\" ]; do\n  \
           more=$({decide} __bench-more --plan {plan} --raw \"$raw\" --rounds $r --precision {precision}) \
           || {{ echo '  __bench-more failed: no more rounds'; break; }}\n  \
           [ -n \"$more\" ] || break\n  \
           echo \"==> round $((r + 1)): $(echo $more | wc -w) rows not yet within ±{pct}%\"\n  \
           for id in $more; do row_$id $r; done\n  r=$((r + 1))\n\
         done\n\
         echo \"==> perftest rows: $r rounds at most\"\n",
        budget = rounds.budget_secs,
        min = rounds.min,
        max = rounds.max,
        all = all.join(" "),
        decide = sh_quote(decide),
        plan = sh_quote(plan),
        precision = rounds.precision,
        pct = rounds.precision * 100.0,
    );
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_parsed() {
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      200              58.85              55.40  \t\t   0.000886\n";
        assert_eq!(figure(Metric::Bandwidth, 65536, bw), Some(55.40));
        assert_eq!(figure(Metric::Bandwidth, 64, bw), Some(0.000886));
        assert_eq!(unit(Metric::Bandwidth, 64), "Mpps");
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec] ...\n 2       200          10.72          155.75       11.26    \t       13.48\n";
        assert_eq!(figure(Metric::Latency, 2, lat), Some(11.26));
        let pp = "8192000 bytes in 0.18 seconds = 374.08 Mbit/sec\n1000 iters in 0.18 seconds = 175.19 usec/iter\n";
        assert_eq!(figure(Metric::PingPong, 8192, pp), Some(175.19));
    }

    #[test]
    fn rows_plans_and_script() {
        assert_eq!(rows(&[], &[]).len(), TOOLS.len() * SIZES.len());
        let some = rows(&["ib_send_lat".into()], &[2, 64]);
        assert_eq!(
            some.iter().map(Row::name).collect::<Vec<_>>(),
            ["ib_send_lat 2", "ib_send_lat 64"]
        );
        assert_eq!(parse_plan(&plan_text(&some)), some);
        assert_eq!(parse_plan("bogus 2\nib_send_lat x\n"), []);
        assert_eq!(some[1].file(true, 3), "ib_send_lat-64-rust-3.txt");
        let rounds = Rounds {
            min: 2,
            max: 4,
            budget_secs: 60,
            precision: 0.05,
        };
        let s = script(
            &some,
            &|t| format!("bin/$(($1 % 2))/{t}"),
            "target/bench/raw",
            "x",
            "plan",
            &rounds,
        );
        assert!(
            s.contains("row_1() {")
                && s.contains("pair bin/$(($1 % 2))/ib_send_lat \"ib_send_lat-64-rust-$1.txt\"")
        );
        assert!(s.contains("for id in 0 1; do row_$id $r; done"));
        assert!(s.contains("__bench-more --plan plan --raw \"$raw\" --rounds $r --precision 0.05"));
        assert!(s.contains("while [ $r -lt 4 ]") && s.contains("+ 60 ))"));
        // The budget is for the rounds after the first `min`: its clock starts then.
        let first = s.find("while [ $r -lt 2 ]").unwrap();
        assert!(s.find("deadline=").unwrap() > first, "{s}");
    }
}
