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
//! another's by half (docs/performance-history.md, session 31). So the rows count each
//! instruction at most once a round trip ([`Counts::code`]): the distinct code
//! a round trip runs, its loops and its polling counted once. KIARA's repeats
//! within 1-2%; C's moves by up to 15%, since a side that never waits skips its
//! empty-poll path. The totals are in the table and the JSON too. The distinct
//! code explains most of the round trip's gap to C in this guest
//! (docs/softroce.md, "Code before a post slows the post") and weighs more on
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
pub(super) const SIDES: [&str; 2] = ["client", "server"];

/// valgrind as the code runs use it: per instruction, with every address
/// written in full and every name in plain text (simple to read back).
const VALGRIND: &str = "valgrind --tool=callgrind --dump-instr=yes --dump-line=no \
    --compress-strings=no --compress-pos=no --vgdb=no";

/// KIARA's `--busy-poll` in the code runs, µs: long enough that a side spins
/// while its peer runs under valgrind too (a wait longer than that sleeps, as
/// about one in ten of the server's did in session 31).
const KIARA_SPIN: u64 = 50_000;

/// Ports of the code runs: the one after this for the first, after those of
/// the KIARA rounds (`bench_adjacent`, at most 100 rounds of 16 ports from 61000).
const PORT_BASE: u64 = 63000;

/// Tries of the perftest script's `wait_listen` (10 s each) before a code run
/// gives up on its server, which starts slowly under valgrind.
const LISTEN_TRIES: usize = 6;

/// A program the rows count, and how it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Program {
    /// C `ib_send_lat` (Debian's perftest).
    C,
    /// The Rust `ib_send_lat` port.
    Port,
    /// `kiara-echo-client` against `kiara-echo-server`.
    Kiara,
}

pub(super) const PROGRAMS: [Program; 3] = [Program::C, Program::Port, Program::Kiara];

impl Program {
    /// Its name in file names and the JSON.
    fn key(self) -> &'static str {
        match self {
            Program::C => "c-ib_send_lat",
            Program::Port => "rust-ib_send_lat",
            Program::Kiara => "kiara-echo",
        }
    }

    /// What its runs leave out, as callgrind options: the work after the last
    /// round trip that grows with the samples, which is not the round trips'.
    /// C's sort of the latencies (`qsort_r`; the rest of its report is in a
    /// stripped binary and stays counted); the port's whole report
    /// (`print_lat`: the sort, and the statistics over every sample); the KIARA
    /// client's sort; and KIARA's poller thread (`poll_loop`): it wakes on a
    /// clock (every 2 ms while a thread spins, 10 ms while runners do), not per
    /// message, and a round trip under `callgrind` takes 20-40 times its native
    /// time, so a count with it in would hold the poller's rounds of 20-40 round
    /// trips and move with the guest's speed (docs/performance.md, session 32).
    /// A `--toggle-collect` turns collection off where it starts, for its
    /// thread (and `--collect-atstart` off: that comes after it), and a nested
    /// one would turn it on again: no toggled function calls another.
    fn left_out(self) -> &'static str {
        match self {
            Program::C => "--toggle-collect=qsort_r",
            Program::Port => "--toggle-collect=examples::perftest::run::lat::print_lat",
            Program::Kiara => {
                "'--toggle-collect=core::slice::sort::stable::driftsort_main*' \
                 --toggle-collect=kiara_ib::poller::poll_loop"
            }
        }
    }

    /// The line of its client's output that says the run went through.
    fn done_line(self) -> &'static str {
        match self {
            // perftest's results row starts with the message size.
            Program::C | Program::Port => " 64 ",
            Program::Kiara => "every echo verified",
        }
    }

    /// Its label in the table.
    pub(super) fn label(self) -> &'static str {
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
pub(super) fn out_file(program: Program, side: &str, n: u64) -> String {
    format!("code-{}-{side}-{n}.out", program.key())
}

/// Shell code that makes every run of the code rows, leaving the counts under
/// `$raw` (the perftest script's `wait_listen` waits for each server). A run
/// that fails stops its server and leaves a `.failed` mark: its counts are not
/// used.
pub fn script(p: &Programs<'_>) -> String {
    let mut body = String::from("echo '==> code per round trip (callgrind)'\n");
    let mut port = PORT_BASE;
    let listen = ["wait_listen $port"; LISTEN_TRIES].join(" || ");
    for program in PROGRAMS {
        for n in [SHORT, LONG] {
            port += 1;
            let vg = |side| {
                format!(
                    "timeout 900 {VALGRIND} {} --collect-atstart=yes --callgrind-out-file=\"$raw/{}\"",
                    program.left_out(),
                    out_file(program, side, n)
                )
            };
            let (srv, cli) = commands(program, p, n);
            let log = log_name(program, n);
            // The echo server runs until stopped (valgrind writes its count on
            // SIGTERM; a script's background job ignores SIGINT); perftest's
            // server ends with its client, unless the run failed.
            let stop = if program == Program::Kiara {
                "kill $srv 2>/dev/null; "
            } else {
                ""
            };
            let _ = writeln!(
                body,
                "port={port}\n\
                 {vs} {srv} > \"$raw/{log}.srv.txt\" 2>&1 &\n\
                 srv=$!\n\
                 if {{ {listen}; }} && {vc} {cli} > \"$raw/{log}.cli.txt\" 2>&1; then {stop}wait; \
                 else echo '  code run failed: {log}'; echo failed > \"$raw/{log}.failed\"; \
                 kill $srv 2>/dev/null; wait; fi",
                vs = vg("server"),
                vc = vg("client"),
            );
        }
    }
    body
}

/// The server's and the client's command lines of `program`'s run of `n`
/// round trips on `$port`.
fn commands(program: Program, p: &Programs<'_>, n: u64) -> (String, String) {
    let perftest = |exe: &str| {
        let args = format!("{exe} -x 1 -s 64 -n {n} -p $port");
        (args.clone(), format!("{args} 198.18.0.1"))
    };
    match program {
        Program::C => perftest("ib_send_lat"),
        Program::Port => perftest(&sh_quote(p.port)),
        // Both wait by spinning, as in the timed rows, however slow the peer
        // is under valgrind.
        Program::Kiara => (
            format!(
                "{} --busy-poll {KIARA_SPIN} -a 198.18.0.1 -p $port",
                sh_quote(p.server)
            ),
            format!(
                "{} --busy-poll {KIARA_SPIN} 198.18.0.1 -p $port -c 1 -n {n} -s 64",
                sh_quote(p.client)
            ),
        ),
    }
}

/// The name of a run's logs (`.srv.txt`, `.cli.txt`) and failure mark.
fn log_name(program: Program, n: u64) -> String {
    format!("code-{}-{n}", program.key())
}

/// An instruction: its object (the `ob=` it is listed under) and its address
/// there (callgrind writes addresses relative to each library).
pub(super) type Instr = (String, u64);

/// What a callgrind output says of each instruction run.
pub(super) struct Output {
    /// How often it ran.
    pub(super) counts: HashMap<Instr, u64>,
    /// The function it is in (its last `fn=` line), after its object's file
    /// name: `libc.so.6 memcpy`.
    pub(super) functions: HashMap<Instr, String>,
}

/// Reads a callgrind output written with `--dump-instr=yes --dump-line=no
/// --compress-strings=no --compress-pos=no`: every cost line is an address and
/// its count, but the line after a `calls=` line is the call's inclusive cost,
/// not the instruction's own. `None` unless the header says so and the counts
/// add up to the file's `totals:`.
pub(super) fn read_output(text: &str) -> Option<Output> {
    let has = |line: &str| text.lines().any(|l| l.trim() == line);
    if !has("positions: instr") || !has("events: Ir") {
        return None;
    }
    let (mut counts, mut functions) = (HashMap::new(), HashMap::new());
    let (mut object, mut function) = (String::new(), String::new());
    let (mut after_call, mut sum, mut totals) = (false, 0, None);
    for line in text.lines() {
        if let Some(ob) = line.strip_prefix("ob=") {
            object = ob.to_string();
        } else if let Some(f) = line.strip_prefix("fn=") {
            function = f.to_string();
        } else if line.starts_with("calls=") {
            after_call = true;
        } else if let Some(t) = line.strip_prefix("totals:") {
            totals = t.trim().parse::<u64>().ok();
        } else if let Some(hex) = line.strip_prefix("0x") {
            if std::mem::take(&mut after_call) {
                continue;
            }
            let mut parts = hex.split_whitespace();
            let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
            let n = parts.next()?.parse::<u64>().ok()?;
            sum += n;
            let instr = (object.clone(), addr);
            functions.entry(instr.clone()).or_insert_with(|| {
                let file = object.rsplit('/').next().unwrap_or(&object);
                format!("{file} {function}")
            });
            *counts.entry(instr).or_insert(0) += n;
        }
    }
    (totals == Some(sum) && sum > 0).then_some(Output { counts, functions })
}

/// Instructions run, each with its count ([`read_output`]).
fn per_instruction(text: &str) -> Option<HashMap<Instr, u64>> {
    read_output(text).map(|o| o.counts)
}

/// Counts per round trip, of a side or of a part of it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Counts {
    /// Every instruction as often as it ran: polls and loops included.
    pub(super) total: f64,
    /// Every instruction at most once a round trip: the code a round trip runs.
    pub(super) code: f64,
}

impl Counts {
    /// Adds an instruction that ran `grew` times a round trip.
    pub(super) fn add(&mut self, grew: f64) {
        self.total += grew;
        self.code += grew.min(1.0);
    }
}

/// Each instruction of the longer run (`b`) with how many times more it ran
/// than in the shorter (`a`), over the extra round trips: its count per round
/// trip. What one instruction ran less in the longer run (a rare path) counts
/// as nothing.
pub(super) fn growth<'a>(
    a: &'a HashMap<Instr, u64>,
    b: &'a HashMap<Instr, u64>,
) -> impl Iterator<Item = (&'a Instr, f64)> + 'a {
    let extra = (LONG - SHORT) as f64;
    b.iter().map(move |(instr, &n)| {
        let before = a.get(instr).copied().unwrap_or(0);
        (instr, n.saturating_sub(before) as f64 / extra)
    })
}

/// The counts per round trip from the outputs of the two runs.
fn counts(short: &str, long: &str) -> Option<Counts> {
    let (a, b) = (per_instruction(short)?, per_instruction(long)?);
    let mut c = Counts::default();
    for (_, grew) in growth(&a, &b) {
        c.add(grew);
    }
    Some(c).filter(|c| c.code > 0.0)
}

/// The callgrind outputs of `program`'s `side`, its shorter run's and its
/// longer's; `None` if either run failed (its mark) or its client did not
/// finish.
pub(super) fn side_outputs(
    read: &dyn Fn(String) -> String,
    program: Program,
    side: &str,
) -> Option<(String, String)> {
    let went_through = |n| {
        read(format!("{}.failed", log_name(program, n))).is_empty()
            && read(format!("{}.cli.txt", log_name(program, n))).contains(program.done_line())
    };
    if !(went_through(SHORT) && went_through(LONG)) {
        return None;
    }
    Some((
        read(out_file(program, side, SHORT)),
        read(out_file(program, side, LONG)),
    ))
}

/// The counts of `program`'s `side`, from its two runs (see [`side_outputs`]).
fn side_counts(read: &dyn Fn(String) -> String, program: Program, side: &str) -> Option<Counts> {
    let (short, long) = side_outputs(read, program, side)?;
    counts(&short, &long)
}

/// How many of the code runs left no count (for the exit status).
pub fn missing(raw: &Path) -> usize {
    let read = raw_reader(raw);
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
    report_from(&raw_reader(raw))
}

/// Reads a file of `raw` by name; empty if it is missing or unreadable.
pub(super) fn raw_reader(raw: &Path) -> impl Fn(String) -> String + '_ {
    move |name| std::fs::read_to_string(raw.join(name)).unwrap_or_default()
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

/// A callgrind output of a program whose start-up runs 0x10 `base` times,
/// whose every round trip runs 0x20 once and polls `polls` times (0x30),
/// calls 0x40 in a library once (0x40 twice a call; the call line's cost,
/// `5n` at 0x50, is inclusive), and runs the same address 0x20 of the
/// library on every other round trip.
#[cfg(test)]
pub(super) fn sample_output(n: u64, base: u64, polls: u64) -> String {
    let body = format!(
        "ob=/bin/x\nfl=???\nfn=main\n0x10 {base}\n0x20 {n}\n0x30 {}\n0x50 1\n\
         cob=/lib/y.so\ncfn=memcpy\ncalls={n} 0x40\n0x50 {}\n\
         ob=/lib/y.so\nfn=memcpy\n0x40 {}\n0x20 {}\n",
        n * polls,
        5 * n,
        2 * n,
        n / 2
    );
    let total = base + n + n * polls + 1 + 2 * n + n / 2;
    format!("version: 1\npositions: instr\nevents: Ir\n{body}summary: {total}\n\ntotals: {total}\n")
}

#[cfg(test)]
mod tests {
    use super::sample_output as out;
    use super::*;

    fn the_script() -> String {
        script(&Programs {
            port: "target/release/ib_send_lat",
            server: "target/release/kiara-echo-server",
            client: "target/release/kiara-echo-client",
        })
    }

    #[test]
    fn every_side_of_every_program_is_counted_twice() {
        let s = the_script();
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
        // Both sides of a run are counted, each into its own file, the server in
        // the background; KIARA spins as in the timed rows.
        let c_server = s
            .lines()
            .find(|l| l.contains(&out_file(Program::C, "server", SHORT)))
            .unwrap();
        assert!(c_server.contains("callgrind") && c_server.contains("ib_send_lat -x 1"));
        assert!(c_server.ends_with('&'), "{c_server}");
        assert_eq!(s.matches("--busy-poll 50000").count(), 4);
    }

    #[test]
    fn each_program_leaves_out_one_thing_and_collects_the_rest() {
        let s = the_script();
        for program in PROGRAMS {
            // Collection on from the start comes after the toggles, which would
            // turn it off.
            let on = format!("{} --collect-atstart=yes", program.left_out());
            assert_eq!(s.matches(&on).count(), 4, "{program:?}");
        }
        // One toggle for each perftest program (its report); two for KIARA, the
        // client's sort and the poller thread, which never call one another.
        assert_eq!(s.matches("--toggle-collect").count(), 16);
        assert_eq!(
            s.matches("--toggle-collect=kiara_ib::poller::poll_loop")
                .count(),
            4
        );
    }

    #[test]
    fn a_failed_run_stops_its_server_and_is_marked() {
        let s = the_script();
        let log = log_name(Program::Port, LONG);
        let line = s
            .lines()
            .find(|l| l.contains(&format!("{log}.cli.txt")))
            .unwrap();
        assert!(line.starts_with("if { wait_listen $port || "), "{line}");
        assert!(
            line.contains(&format!("else echo '  code run failed: {log}'; echo failed > \"$raw/{log}.failed\"; kill $srv")),
            "{line}"
        );
        let kiara = s
            .lines()
            .find(|l| l.contains(&format!("{}.cli.txt", log_name(Program::Kiara, SHORT))))
            .unwrap();
        assert!(
            kiara.contains("then kill $srv 2>/dev/null; wait; else"),
            "{kiara}"
        );
    }

    #[test]
    fn instructions_count_once_per_round_trip_at_most() {
        // 0x20 once, 0x30 three times, 0x40 of the library twice and its 0x20
        // every other round trip; the call's inclusive line and the start-up do
        // not count.
        let c = counts(&out(SHORT, 500, 3), &out(LONG, 500, 3)).unwrap();
        assert_eq!(
            c,
            Counts {
                total: 6.5,
                code: 3.5
            }
        );
        // More polls change the total, not the code.
        let more = counts(&out(SHORT, 500, 3), &out(LONG, 500, 7)).unwrap();
        assert_eq!(more.code, 3.5);
        assert!(more.total > c.total);
        assert_eq!(counts("", &out(LONG, 1, 1)), None);
        assert_eq!(
            counts(&out(SHORT, 1, 1), &out(SHORT, 1, 1)),
            None,
            "no growth"
        );
    }

    #[test]
    fn a_file_that_does_not_add_up_is_refused() {
        let good = out(SHORT, 5, 1);
        assert!(per_instruction(&good).is_some());
        let cut = good.replace("totals: ", "totals: 1");
        assert_eq!(per_instruction(&cut), None, "totals differ");
        let lines = good.replace("positions: instr", "positions: instr line");
        assert_eq!(
            per_instruction(&lines),
            None,
            "line numbers in the cost lines"
        );
        assert_eq!(per_instruction(""), None);
    }

    /// A reader of a whole set of runs, `polls` a round trip per program; the
    /// port's server has no output, and the KIARA client's longer run `failed`.
    fn runs(failed: bool) -> impl Fn(String) -> String {
        move |name: String| {
            let n = if name.contains("-3000") { LONG } else { SHORT };
            let polls = if name.contains("kiara") { 9 } else { 1 };
            if name.ends_with(".failed") {
                let hit = failed && name == format!("{}.failed", log_name(Program::Kiara, LONG));
                return if hit {
                    "failed\n".into()
                } else {
                    String::new()
                };
            }
            if name.ends_with(".cli.txt") {
                return " 64 1000 1.0 every echo verified\n".into();
            }
            if name.contains("rust") && name.contains("server") {
                return String::new();
            }
            out(n, 100, polls)
        }
    }

    /// Fails, showing the table, unless it has this row.
    fn assert_row(table: &str, row: &str) {
        assert!(table.contains(row), "no row `{row}` in\n{table}");
    }

    #[test]
    fn the_table_and_json_hold_every_program() {
        let (table, json) = report_from(&runs(false));
        assert_row(
            &table,
            "C ib_send_lat            4        4   1.00         4 / 4",
        );
        assert_row(
            &table,
            "KIARA echo               4        4   1.00         12 / 12",
        );
        assert_row(
            &table,
            "Rust ib_send_lat         4        -   -            4 / -",
        );
        crate::json::Json::parse(&json).unwrap();
        assert!(
            json.contains(
                "\"program\": \"kiara-echo\", \"client\": 4, \"server\": 4, \"client_total\": 13"
            ),
            "{json}"
        );
        assert!(json.contains("\"server\": null"));
    }

    #[test]
    fn a_failed_or_unfinished_run_gives_no_count() {
        let (table, _) = report_from(&runs(true));
        assert_row(
            &table,
            "KIARA echo               -        -   -            - / -",
        );
        let unfinished = |name: String| {
            if name.ends_with(".cli.txt") {
                "Couldn't connect\n".into()
            } else {
                runs(false)(name)
            }
        };
        let (table, _) = report_from(&unfinished);
        assert_row(
            &table,
            "C ib_send_lat            -        -   -            - / -",
        );
    }
}
