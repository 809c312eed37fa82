//! How perftest refuses a command line ([`Refusal`]), and the checks its
//! `parser()` makes of each option as it reads it.

use super::{Args, Output, TestKind, Verb};
use std::fmt;

/// Why perftest refuses a command line, in its words (without the last newline), and
/// so how a tool reports it: each variant is one of perftest's ways.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Refused in `parser()` as it reads an option (or the words after them): the
    /// message on stderr, then each tool's `main` adds [`PARSER_FAILED`] there.
    Parse(String),
    /// Refused in `force_dependecies`: [`RESULT_LINE`](crate::perftest::report::RESULT_LINE)
    /// on stdout, then the message on stderr.
    Depend(String),
    /// Refused by a bare `exit(1)` while parsing (`change_conn_type`), and the port's
    /// own limits: the message on stderr alone.
    Exit(String),
}

/// The line each tool's `main` adds on stderr when perftest's `parser()` fails.
pub const PARSER_FAILED: &str = " Parser function exited with Error";

impl Refusal {
    /// The message, as perftest writes it (without the last newline).
    pub fn message(&self) -> &str {
        match self {
            Refusal::Parse(m) | Refusal::Depend(m) | Refusal::Exit(m) => m,
        }
    }

    /// Prints the refusal as perftest does, on stdout and stderr.
    pub fn report(&self) {
        use std::io::Write;
        match self {
            Refusal::Parse(m) => eprintln!("{m}\n{PARSER_FAILED}"),
            Refusal::Depend(m) => {
                println!("{}", crate::perftest::report::RESULT_LINE);
                let _ = std::io::stdout().flush();
                eprintln!("{m}");
            }
            Refusal::Exit(m) => eprintln!("{m}"),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Refusal {}

/// The options whose values perftest's `parser()` checks as it reads them, in the
/// order of [`Args`]' fields (the order checked when the command line's is unknown).
const CHECKED: [&str; 20] = [
    "ib_port",
    "gid_index",
    "size",
    "iters",
    "num_qps",
    "tx_depth",
    "cq_mod",
    "outs",
    "duration",
    "connection",
    "rx_depth",
    "sl",
    "no_peak",
    "inline_size",
    "report_cycles",
    "report_histogram",
    "report_unsorted",
    "events",
    "bidirectional",
    "output",
];

/// perftest's `parser()`: each option checked as it is read (so the first bad one
/// on the command line is named), then the words after the server's name.
pub(super) fn check_options(verb: Verb, kind: TestKind, args: &Args) -> Result<(), Refusal> {
    let order: Vec<&str> = if args.order.is_empty() {
        CHECKED.to_vec()
    } else {
        args.order.iter().map(String::as_str).collect()
    };
    for id in order {
        check_option(id, verb, kind, args)?;
    }
    if !args.extra.is_empty() {
        return Err(Refusal::Parse(
            " Invalid Command line. Please check command rerun ".into(),
        ));
    }
    Ok(())
}

/// perftest's `CHECK_VALUE_IN_RANGE`: `value` within `min ..= max`, else its words.
fn in_range<T: Into<i64> + Copy>(
    value: Option<T>,
    min: i64,
    max: i64,
    name: &str,
) -> Result<(), Refusal> {
    match value.map(Into::into) {
        Some(v) if v < min || v > max => Err(Refusal::Parse(format!(
            " {name} should be between {min} and {max}"
        ))),
        _ => Ok(()),
    }
}

/// The check perftest's `parser()` makes of the option `id` (a field of [`Args`]) as
/// it reads it, in its words: ranges, and options refused for the verb or the kind
/// of test. (Taken and ignored, the latter would run what the user did not ask.)
fn check_option(id: &str, verb: Verb, kind: TestKind, args: &Args) -> Result<(), Refusal> {
    let parse = |why: &str| Err(Refusal::Parse(why.into()));
    let (bw, lat) = (kind == TestKind::Bw, kind == TestKind::Lat);
    match id {
        "ib_port" if args.ib_port < 1 => parse("IB Port can't be less than 1"),
        "gid_index" => in_range(args.gid_index, 0, 64, "Gid index"),
        "size" => in_range(
            args.size.map(|s| s.min(i64::MAX as u64) as i64),
            1,
            i32::MAX as i64,
            "Message Size",
        ),
        "iters" => in_range(
            args.iters.map(|n| n.min(i64::MAX as u64) as i64),
            5,
            100_000_000,
            "Iteration num",
        ),
        "num_qps" if lat && args.num_qps.is_some() => {
            parse(" Multiple QPs only available on bw tests")
        }
        "num_qps" => in_range(args.num_qps, 1, 16384, "num of Qps"),
        "tx_depth" => in_range(args.tx_depth, 1, 15000, "Tx depth"),
        "cq_mod" => in_range(args.cq_mod, 1, 1024, "CQ moderation"),
        "outs" if verb != Verb::Read && args.outs.is_some() => {
            parse(" Setting Outstanding reads only available on READ verb")
        }
        "duration" if args.duration == Some(0) => parse(" Duration period must be positive"),
        "connection" => connection(verb, &args.connection),
        "rx_depth" => {
            // perftest names it " Rx depth", hence two spaces.
            in_range(args.rx_depth, 1, 16384, " Rx depth")?;
            if verb != Verb::Send && args.rx_depth.is_some_and(|r| r > 1) {
                return parse(" On RDMA verbs rx depth can be only 1");
            }
            Ok(())
        }
        "sl" if args.sl > 15 => parse(" Only 15 Service levels"),
        "no_peak" if lat && args.no_peak => parse(" NoPeak only valid for BW tests"),
        "inline_size" => {
            let max = crate::perftest::inline::MAX_INLINE;
            in_range(args.inline_size, 0, max.into(), "Max inline")?;
            if verb == Verb::Read && args.inline_size.is_some() {
                return parse(" Inline feature not available on READ/Atomic verbs");
            }
            Ok(())
        }
        "report_cycles" if bw && args.report_cycles => parse(" Available only on Latency tests"),
        "report_histogram" if bw && args.report_histogram => {
            parse(" Available only on Latency tests")
        }
        "report_unsorted" if bw && args.report_unsorted => {
            parse(" is Available only on Latency tests")
        }
        "events" if verb == Verb::Write && args.events => {
            parse(" Events feature not available on WRITE verb")
        }
        "bidirectional" if lat && args.bidirectional => {
            parse(" Bidirectional is only available in BW test")
        }
        "output" => Output::parse(args.output.as_deref()).map(|_| ()),
        _ => Ok(()),
    }
}

/// `-c` as perftest's `change_conn_type` reads it (names are case sensitive; a bad
/// one exits at once, with no more words), then the port's limit: RC only.
fn connection(verb: Verb, name: &str) -> Result<(), Refusal> {
    let exit = |why: String| Err(Refusal::Exit(why));
    match name {
        "RC" => Ok(()),
        "UC" if verb == Verb::Read => {
            exit(" UC connection not possible in READ/ATOMIC verbs".into())
        }
        "UD" if verb != Verb::Send => exit(" UD connection only possible in SEND verb".into()),
        "UC" | "UD" | "RawEth" | "XRC" | "DC" | "SRD" => exit(format!(
            " Connection type {name} is not supported by this port (RC only)"
        )),
        _ => exit(" Invalid Connection type. Please choose from {RC,UC,UD,XRC,DC,SRD}".into()),
    }
}
