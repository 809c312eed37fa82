//! `cargo xtask bench`: the C tools (Debian's perftest and `ibv_rc_pingpong`) against
//! their Rust ports, side by side, in one guest boot.
//!
//! For every tool and size, the C server/client pair and the Rust pair run in
//! alternation, `ROUNDS` times each; the client's figure is kept (perftest's average
//! bandwidth for `*_bw`, t_typical for `*_lat`, usec/iter for `ibv_rc_pingpong`).
//! The medians and their ratio go to a table on stdout and to
//! `target/bench/bench.json`; every raw output stays under `target/bench/raw/`.
//! Not part of CI: under TCG the whole run takes about a quarter of an hour.

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

use crate::cargo;
use crate::error::{Error, Result};
use crate::guest::GuestRun;
use crate::process::sh_quote;
use crate::workspace::Workspace;
use crate::{step, GuestOptions};

/// Rounds per (tool, size, implementation): five, because single runs in the guest
/// are bimodal (a run lands on the slow mode now and then, for C and Rust alike).
pub const ROUNDS: usize = 5;

/// Message sizes.
pub const SIZES: &[u64] = &[2, 64, 4096, 65536, 1 << 20];

/// What a tool's figure means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Metric {
    /// perftest's average bandwidth (MiB/s), or its message rate (Mpps) below
    /// `MSG_RATE_BELOW` bytes, where two decimals of MiB/s are too coarse: higher is
    /// better.
    Bandwidth,
    /// perftest's t_typical (usec): lower is better.
    Latency,
    /// `ibv_rc_pingpong`'s usec/iter: lower is better.
    PingPong,
}

/// The tools: name (the same for the C program and the Rust binary) and metric.
const TOOLS: &[(&str, Metric)] = &[
    ("ib_write_bw", Metric::Bandwidth),
    ("ib_read_bw", Metric::Bandwidth),
    ("ib_send_bw", Metric::Bandwidth),
    ("ib_write_lat", Metric::Latency),
    ("ib_read_lat", Metric::Latency),
    ("ib_send_lat", Metric::Latency),
    ("ibv_rc_pingpong", Metric::PingPong),
];

/// Iterations per run, short enough for the whole bench to fit in 20 minutes.
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

/// The options of one run (both sides), without the server address.
fn options(tool: &str, metric: Metric, size: u64, port: u16) -> Vec<String> {
    let n = iterations(metric, size).to_string();
    let mut v: Vec<String> = match metric {
        Metric::PingPong => vec!["-g".into(), "1".into()],
        _ => vec!["-x".into(), "1".into()],
    };
    v.extend(["-s".into(), size.to_string(), "-n".into(), n]);
    v.extend(["-p".into(), port.to_string()]);
    if tool == "ibv_rc_pingpong" {
        // A small receive queue: fewer receives to post before the first ping.
        v.extend(["-r".into(), "100".into()]);
    }
    v
}

/// Bandwidth runs smaller than this are compared by message rate.
const MSG_RATE_BELOW: u64 = 4096;

/// The unit of a figure.
fn unit(metric: Metric, size: u64) -> &'static str {
    match metric {
        Metric::Bandwidth if size < MSG_RATE_BELOW => "Mpps",
        Metric::Bandwidth => "MiB/s",
        _ => "usec",
    }
}

/// The client's figure from its output.
fn figure(metric: Metric, size: u64, out: &str) -> Option<f64> {
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

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One planned run.
struct Run {
    tool: &'static str,
    metric: Metric,
    size: u64,
    rust: bool,
    round: usize,
    file: String,
}

/// Runs the command; returns the exit code for xtask.
pub fn run(opts: &GuestOptions) -> Result<i32> {
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    step!("building the examples: cargo build --release -p examples --bins");
    let artifacts = cargo::build_artifacts(
        &ws.root,
        &["build", "--release", "-p", "examples", "--bins"],
    )
    .map_err(|e| Error::new(format!("building the examples failed: {e}")))?;
    let find = |name: &str| -> Option<PathBuf> {
        artifacts
            .iter()
            .filter(|a| a.is_bin() && a.target_name == name)
            .find_map(|a| a.executable.clone())
    };
    let kiara_server = find("kiara-echo-server")
        .ok_or_else(|| Error::new("the examples package has no binary `kiara-echo-server`"))?;
    let kiara_client = find("kiara-echo-client")
        .ok_or_else(|| Error::new("the examples package has no binary `kiara-echo-client`"))?;
    let kiara_scoped = find("kiara-scoped-cost")
        .ok_or_else(|| Error::new("the examples package has no binary `kiara-scoped-cost`"))?;
    let mut rust_exe = Vec::new();
    for (tool, _) in TOOLS {
        let exe = find(tool)
            .ok_or_else(|| Error::new(format!("the examples package has no binary `{tool}`")))?;
        rust_exe.push((*tool, ws.display(&exe)));
    }
    let bench_dir = ws.target.join("bench");
    let raw_dir = bench_dir.join("raw");
    let _ = fs::remove_dir_all(&raw_dir);
    fs::create_dir_all(&raw_dir)
        .map_err(|e| Error::new(format!("creating {}: {e}", raw_dir.display())))?;
    let raw_shown = ws.display(&raw_dir);

    // The plan: rounds outermost, C and Rust alternating for each tool and size.
    let mut runs = Vec::new();
    for round in 0..ROUNDS {
        for (tool, metric) in TOOLS {
            for &size in SIZES {
                for rust in [false, true] {
                    let file = format!(
                        "{tool}-{size}-{}-{round}.txt",
                        if rust { "rust" } else { "c" }
                    );
                    runs.push(Run {
                        tool,
                        metric: *metric,
                        size,
                        rust,
                        round,
                        file,
                    });
                }
            }
        }
    }

    let mut body = String::new();
    body.push_str(&format!("raw={}\n", sh_quote(&raw_shown)));
    body.push_str(
        "wait_listen() { hex=$(printf ':%04X ' \"$1\"); i=0; \
         while [ $i -lt 100 ]; do grep -q \"$hex.* 0A \" /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0; \
         sleep 0.1; i=$((i+1)); done; return 1; }\n",
    );
    for (i, r) in runs.iter().enumerate() {
        let port = 20000 + (i % 20000) as u16;
        let prog = if r.rust {
            rust_exe
                .iter()
                .find(|(t, _)| *t == r.tool)
                .map(|(_, p)| p.clone())
                .unwrap_or_default()
        } else {
            r.tool.to_string()
        };
        let args: Vec<String> = options(r.tool, r.metric, r.size, port)
            .iter()
            .map(|a| sh_quote(a))
            .collect();
        let args = args.join(" ");
        let _ = writeln!(
            body,
            "echo {hdr}\n\
             timeout 120 {p} {args} > \"$raw/srv-{f}\" 2>&1 &\n\
             wait_listen {port}\n\
             timeout 120 {p} {args} 198.18.0.1 > \"$raw/{f}\" 2>&1 || echo \"  client failed: {f}\"\n\
             wait",
            hdr = sh_quote(&format!(
                "==> {}/{}: {} {} size {} round {}",
                i + 1,
                runs.len(),
                if r.rust { "rust" } else { "C" },
                r.tool,
                r.size,
                r.round + 1
            )),
            p = sh_quote(&prog),
            f = r.file,
        );
    }
    body.push_str(&super::bench_kiara::script(
        &super::bench_kiara::Programs {
            server: &ws.display(&kiara_server),
            client: &ws.display(&kiara_client),
            scoped: &ws.display(&kiara_scoped),
        },
        ROUNDS,
    ));
    let run = GuestRun::new(&ws)?;
    let status = run.run(&assets, opts, &body, &mut |_, _| {})?;
    if status != 0 {
        step!("the bench script ended with status {status}");
    }

    // Collect, table, JSON.
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<16} {:>8}  {:>12}  {:>12}  {:>7}  {:<8} target",
        "tool", "size", "C median", "Rust median", "ratio", "unit"
    );
    let mut json = String::from("{\n  \"rounds\": ");
    let _ = write!(json, "{ROUNDS},\n  \"results\": [\n");
    let mut first = true;
    let mut missed = 0;
    let mut c_medians = std::collections::HashMap::new();
    for (tool, metric) in TOOLS {
        for &size in SIZES {
            let mut c = Vec::new();
            let mut rust = Vec::new();
            for r in runs.iter().filter(|r| r.tool == *tool && r.size == size) {
                let text = fs::read_to_string(raw_dir.join(&r.file)).unwrap_or_default();
                // perftest prints `inf` when its CPU-frequency estimate failed.
                match figure(*metric, size, &text).filter(|v| v.is_finite()) {
                    Some(v) if r.rust => rust.push(v),
                    Some(v) => c.push(v),
                    None => missed += 1,
                }
            }
            let (cm, rm) = (median(&mut c), median(&mut rust));
            if let Some(v) = cm {
                c_medians.insert((*tool, size), v);
            }
            let ratio = match (cm, rm) {
                (Some(c), Some(r)) if c > 0.0 => Some(r / c),
                _ => None,
            };
            let unit = unit(*metric, size);
            let (target, ok) = match metric {
                Metric::Bandwidth => (">= 0.95", ratio.map(|x| x >= 0.95)),
                _ => ("<= 1.05", ratio.map(|x| x <= 1.05)),
            };
            let show = |v: Option<f64>| {
                v.map_or("-".to_string(), |v| match unit {
                    "Mpps" => format!("{v:.6}"),
                    _ => format!("{v:.2}"),
                })
            };
            let _ = writeln!(
                table,
                "{:<16} {:>8}  {:>12}  {:>12}  {:>7}  {:<8} {} {}",
                tool,
                size,
                show(cm),
                show(rm),
                ratio.map_or("-".to_string(), |r| format!("{r:.3}")),
                unit,
                target,
                match ok {
                    Some(true) => "ok",
                    Some(false) => "MISSED",
                    None => "no data",
                }
            );
            let num = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v}"));
            let list = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if !first {
                json.push_str(",\n");
            }
            first = false;
            let _ = write!(
                json,
                "    {{\"tool\": \"{tool}\", \"size\": {size}, \"unit\": \"{unit}\", \
                 \"c\": [{}], \"rust\": [{}], \"c_median\": {}, \"rust_median\": {}, \"ratio\": {}}}",
                list(&c),
                list(&rust),
                num(cm),
                num(rm),
                num(ratio)
            );
        }
    }
    let (kiara_table, kiara_json) = super::bench_kiara::report(&raw_dir, ROUNDS, &|tool, size| {
        c_medians.get(&(tool, size)).copied()
    });
    let _ = write!(json, "\n  ],\n  \"kiara\": {kiara_json}\n}}\n");
    let json_path = bench_dir.join("bench.json");
    fs::write(&json_path, json)
        .map_err(|e| Error::new(format!("writing {}: {e}", json_path.display())))?;
    println!("{table}");
    println!("{kiara_table}");
    step!(
        "bench: results in {} (raw outputs in {}); {missed} runs gave no figure",
        ws.display(&json_path),
        raw_shown
    );
    Ok(if missed == 0 { 0 } else { 1 })
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
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut []), None);
    }
}
