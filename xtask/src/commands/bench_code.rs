//! The code rows of `cargo xtask bench`: the code one 64-byte round trip runs
//! on each side, counted by valgrind's `callgrind` in the guest, for C
//! `ib_send_lat`, its Rust port and the KIARA echo client and server.
//!
//! Time under emulation moves by ±10% between runs, so a change of a few
//! percent in the code a message runs cannot be seen in the timed rows. A count
//! of instructions can: both sides run under `callgrind`, once for [`SHORT`]
//! and once for [`LONG`] round trips, and what each instruction ran more in the
//! longer run, over the extra round trips, is its count per round trip
//! (start-up, connection and teardown cancel out). Both sides slowed alike keep
//! the native pace between them: each waits for the other as it would.
//!
//! A side that waits polls its queue until the reply is there, and how often
//! depends on the guest's speed: one run's total per round trip can differ from
//! another's by a third (docs/performance.md, session 31). So the rows count
//! each instruction at most once a round trip ([`Counts::code`]): the code a
//! round trip runs, its loops and its polling counted once, which repeats
//! within a few percent. The totals go to the JSON too. The count is the code's
//! own cost, which explains most of the round trip's gap to C in this guest
//! (docs/softroce.md, "Code before a post slows the post") and sets it on
//! hardware, where the doorbell is a store.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::process::sh_quote;

/// Round trips of the shorter and the longer run of each side.
pub const SHORT: u64 = 1000;
/// See [`SHORT`].
pub const LONG: u64 = 3000;

/// The two sides, each counted in every run.
const SIDES: [&str; 2] = ["client", "server"];

/// valgrind as the code runs use it: per instruction, absolute addresses and
/// plain names (simple to read back). The final sort of the latency samples
/// (C's `qsort_r`, Rust's `driftsort_main`) is not counted: it grows faster than
/// the round trips, and it is not theirs. (Each `--toggle-collect` turns
/// `--collect-atstart` off, so that comes after them.)
const VALGRIND: &str = "valgrind --tool=callgrind --dump-instr=yes --dump-line=no \
    --compress-strings=no --compress-pos=no --vgdb=no \
    --toggle-collect=qsort_r '--toggle-collect=core::slice::sort::stable::driftsort_main*' \
    --collect-atstart=yes";

/// KIARA's `--busy-poll` in the code runs, µs: long enough that neither side
/// sleeps while its peer runs under valgrind too.
const KIARA_SPIN: u64 = 50_000;

/// The first port of the code runs, after those of the KIARA rounds
/// (`bench_adjacent`, at most 100 rounds of 16 ports from 61000).
const FIRST_PORT: u64 = 63000;

/// A program the rows count, and how it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Program {
    /// C `ib_send_lat` (Debian's perftest).
    C,
    /// The Rust `ib_send_lat` port.
    Port,
    /// `kiara-echo-client` against `kiara-echo-server`.
    Kiara,
}

const PROGRAMS: [Program; 3] = [Program::C, Program::Port, Program::Kiara];

impl Program {
    /// Its name in file names and the JSON.
    fn key(self) -> &'static str {
        match self {
            Program::C => "c-ib_send_lat",
            Program::Port => "rust-ib_send_lat",
            Program::Kiara => "kiara-echo",
        }
    }

    /// Its label in the table.
    fn label(self) -> &'static str {
        match self {
            Program::C => "C ib_send_lat",
            Program::Port => "Rust ib_send_lat",
            Program::Kiara => "KIARA echo",
        }
    }
}

/// The programs the code rows run (paths as the guest sees them).
pub struct Programs<'a> {
    /// The Rust `ib_send_lat`.
    pub port: &'a str,
    /// `kiara-echo-server`.
    pub server: &'a str,
    /// `kiara-echo-client`.
    pub client: &'a str,
}

/// The callgrind output of a run.
fn out_file(program: Program, side: &str, n: u64) -> String {
    format!("code-{}-{side}-{n}.out", program.key())
}

/// Shell code that makes every run of the code rows, leaving the counts under
/// `$raw` (the perftest script's `wait_listen` waits for each server).
pub fn script(p: &Programs<'_>) -> String {
    let (port_exe, server, client) = (sh_quote(p.port), sh_quote(p.server), sh_quote(p.client));
    let mut body = String::from("echo '==> code per round trip (callgrind)'\n");
    let mut port = FIRST_PORT;
    for program in PROGRAMS {
        for n in [SHORT, LONG] {
            port += 1;
            let vg = |side| {
                format!(
                    "timeout 900 {VALGRIND} --callgrind-out-file=\"$raw/{}\"",
                    out_file(program, side, n)
                )
            };
            let (srv, cli) = match program {
                Program::C | Program::Port => {
                    let exe = if program == Program::C {
                        "ib_send_lat".to_string()
                    } else {
                        port_exe.clone()
                    };
                    let args = format!("{exe} -x 1 -s 64 -n {n} -p {port}");
                    (args.clone(), format!("{args} 198.18.0.1"))
                }
                // Both wait by spinning, as in the timed rows, however slow the
                // peer is under valgrind (the spin gives up after `--busy-poll`).
                Program::Kiara => (
                    format!("{server} --busy-poll {KIARA_SPIN} -a 198.18.0.1 -p {port}"),
                    format!(
                        "{client} --busy-poll {KIARA_SPIN} 198.18.0.1 -p {port} -c 1 -n {n} -s 64"
                    ),
                ),
            };
            // The echo server runs until stopped (valgrind writes its count on
            // SIGTERM; a script's background job ignores SIGINT); perftest's
            // server ends with its client.
            let stop = if program == Program::Kiara {
                "kill $srv 2>/dev/null; "
            } else {
                ""
            };
            let out = format!("code-{}-{n}", program.key());
            let _ = writeln!(
                body,
                "{vs} {srv} > \"$raw/{out}.srv.txt\" 2>&1 &\n\
                 srv=$!\n\
                 wait_listen {port}\n\
                 {vc} {cli} > \"$raw/{out}.cli.txt\" 2>&1 || echo '  code run failed: {out}'\n\
                 {stop}wait",
                vs = vg("server"),
                vc = vg("client"),
            );
        }
    }
    body
}

/// Instructions run per address, from a callgrind output written with
/// `--dump-instr=yes --dump-line=no --compress-pos=no`: every cost line is an
/// absolute address and its count, but the line after a `calls=` line is the
/// call's inclusive cost, not the instruction's own.
fn per_address(text: &str) -> HashMap<u64, u64> {
    let mut counts = HashMap::new();
    let mut after_call = false;
    for line in text.lines() {
        if line.starts_with("calls=") {
            after_call = true;
            continue;
        }
        let Some(hex) = line.strip_prefix("0x") else {
            continue;
        };
        if std::mem::take(&mut after_call) {
            continue;
        }
        let mut parts = hex.split_whitespace();
        let addr = parts.next().and_then(|a| u64::from_str_radix(a, 16).ok());
        let n = parts.next().and_then(|n| n.parse::<u64>().ok());
        if let (Some(addr), Some(n)) = (addr, n) {
            *counts.entry(addr).or_insert(0) += n;
        }
    }
    counts
}

/// A side's counts per round trip.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Counts {
    /// Every instruction as often as it ran: polls and loops included.
    total: f64,
    /// Every instruction at most once a round trip: the code a round trip runs.
    code: f64,
}

/// The counts per round trip from the outputs of the two runs.
fn counts(short: &str, long: &str) -> Option<Counts> {
    let (a, b) = (per_address(short), per_address(long));
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let extra = (LONG - SHORT) as f64;
    let mut c = Counts {
        total: 0.0,
        code: 0.0,
    };
    for (addr, &n) in &b {
        let grew = n.saturating_sub(a.get(addr).copied().unwrap_or(0)) as f64 / extra;
        c.total += grew;
        c.code += grew.min(1.0);
    }
    Some(c).filter(|c| c.code > 0.0)
}

/// The counts of `program`'s `side`, from its two runs.
fn side_counts(read: &dyn Fn(String) -> String, program: Program, side: &str) -> Option<Counts> {
    counts(
        &read(out_file(program, side, SHORT)),
        &read(out_file(program, side, LONG)),
    )
}

/// How many of the code runs left no count (for the exit status).
pub fn missing(raw: &Path) -> usize {
    let read = |name: String| std::fs::read_to_string(raw.join(name)).unwrap_or_default();
    PROGRAMS
        .iter()
        .flat_map(|&p| SIDES.map(|side| side_counts(&read, p, side)))
        .filter(Option::is_none)
        .count()
}

/// A count, rounded, or `-`.
fn show(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.0}"))
}

/// A JSON number or null.
fn num(v: Option<f64>) -> String {
    super::bench_report::num(v.map(f64::round))
}

/// The code table and JSON array, from the callgrind outputs under `raw`.
pub fn report(raw: &Path) -> (String, String) {
    let read = |name: String| std::fs::read_to_string(raw.join(name)).unwrap_or_default();
    report_from(&read)
}

/// [`report`] from a reader of the raw files.
fn report_from(read: &dyn Fn(String) -> String) -> (String, String) {
    let mut table = format!(
        "Code per 64 B round trip (instructions, each at most once a round trip; \
         callgrind, runs of {SHORT} and {LONG})\n\
         program             client   server   both / C's   all, polls and loops counted: client / server\n"
    );
    let sides = |p| SIDES.map(|side| side_counts(read, p, side));
    let both = |s: [Option<Counts>; 2]| Some(s[0]?.code + s[1]?.code);
    let c_both = both(sides(Program::C));
    let mut json = Vec::new();
    for program in PROGRAMS {
        let s = sides(program);
        let ratio = both(s).zip(c_both).map(|(b, c)| b / c);
        let code = |i: usize| s[i].map(|c| c.code);
        let total = |i: usize| s[i].map(|c| c.total);
        let _ = writeln!(
            table,
            "{:<18} {:>7}  {:>7}   {:<10}   {} / {}",
            program.label(),
            show(code(0)),
            show(code(1)),
            ratio.map_or("-".to_string(), |r| format!("{r:.2}")),
            show(total(0)),
            show(total(1))
        );
        json.push(super::bench_report::entry(&format!(
            "\"program\": \"{}\", \"client\": {}, \"server\": {}, \
             \"client_total\": {}, \"server_total\": {}",
            program.key(),
            num(code(0)),
            num(code(1)),
            num(total(0)),
            num(total(1))
        )));
    }
    (table, format!("[\n{}\n  ]", json.join(",\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A callgrind output of a program whose start-up runs 0x10 `base` times,
    /// whose every round trip runs 0x20 once and polls `polls` times (0x30),
    /// and which calls 0x40 once a round trip (that line's cost is inclusive).
    fn out(n: u64, base: u64, polls: u64) -> String {
        format!(
            "version: 1\npositions: instr\nevents: Ir\nob=/bin/x\nfl=???\nfn=main\n\
             0x10 {base}\n0x20 {n}\n0x30 {}\ncfn=memcpy\ncalls={n} 0x40\n0x20 999999\n\
             fn=memcpy\n0x40 {}\nsummary: 1\ntotals: 1\n",
            n * polls,
            2 * n
        )
    }

    #[test]
    fn every_side_of_every_program_is_counted_twice() {
        let s = script(&Programs {
            port: "target/release/ib_send_lat",
            server: "target/release/kiara-echo-server",
            client: "target/release/kiara-echo-client",
        });
        assert_eq!(s.matches("--tool=callgrind").count(), 12);
        for program in PROGRAMS {
            for side in SIDES {
                for n in [SHORT, LONG] {
                    assert!(
                        s.contains(&out_file(program, side, n)),
                        "{program:?} {side} {n}"
                    );
                }
            }
        }
        // Both sides of a run are counted, each into its own file; the final
        // sorts are not, and KIARA spins as in the timed rows.
        let c_server = s
            .lines()
            .find(|l| l.contains(&out_file(Program::C, "server", SHORT)))
            .unwrap();
        assert!(c_server.contains("callgrind") && c_server.contains("ib_send_lat -x 1"));
        assert!(
            c_server.ends_with('&'),
            "the server runs in the background: {c_server}"
        );
        assert_eq!(s.matches("--toggle-collect=qsort_r").count(), 12);
        assert_eq!(
            s.matches("driftsort_main*' --collect-atstart=yes").count(),
            12
        );
        assert_eq!(s.matches("--busy-poll 50000").count(), 4);
        assert!(s.contains("kill $srv"));
    }

    #[test]
    fn instructions_count_once_per_round_trip_at_most() {
        // 0x20 once, 0x30 three times and 0x40 twice a round trip; the call's
        // inclusive line and the start-up do not count.
        let c = counts(&out(SHORT, 500, 3), &out(LONG, 500, 3)).unwrap();
        assert_eq!(
            c,
            Counts {
                total: 6.0,
                code: 3.0
            }
        );
        // More polls change the total, not the code.
        let more = counts(&out(SHORT, 500, 3), &out(LONG, 500, 7)).unwrap();
        assert_eq!(more.code, 3.0);
        assert!(more.total > c.total);
        assert_eq!(counts("", &out(LONG, 1, 1)), None);
        assert_eq!(
            counts(&out(SHORT, 1, 1), &out(SHORT, 1, 1)),
            None,
            "no growth"
        );
    }

    #[test]
    fn the_table_and_json_hold_every_program() {
        let read = |name: String| {
            let n = if name.contains("-3000.") { LONG } else { SHORT };
            let polls = if name.contains("kiara") { 9 } else { 1 };
            if name.contains("rust") && name.contains("server") {
                return String::new();
            }
            out(n, 100, polls)
        };
        let (table, json) = report_from(&read);
        assert!(
            table.contains("C ib_send_lat            3        3   1.00         4 / 4"),
            "{table}"
        );
        assert!(
            table.contains("KIARA echo               3        3   1.00         12 / 12"),
            "{table}"
        );
        assert!(
            table.contains("Rust ib_send_lat         3        -   -            4 / -"),
            "{table}"
        );
        crate::json::Json::parse(&json).unwrap();
        assert!(
            json.contains(
                "\"program\": \"kiara-echo\", \"client\": 3, \"server\": 3, \"client_total\": 12"
            ),
            "{json}"
        );
        assert!(json.contains("\"server\": null"));
    }
}
