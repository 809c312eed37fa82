//! perftest's command line, shared by the six tools, and the defaults each applies.

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use std::ffi::OsString;

mod refusal;
use refusal::check_options;
pub use refusal::{Refusal, PARSER_FAILED};

/// The operation a tool measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
}

impl Verb {
    /// perftest's name of the verb (`testsStr`).
    pub fn name(self) -> &'static str {
        match self {
            Verb::Send => "Send",
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
        }
    }
}

/// Bandwidth or latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestKind {
    /// Bandwidth: many requests in flight.
    Bw,
    /// Latency: one at a time.
    Lat,
}

/// The command line (perftest's option letters and long names).
#[derive(Parser, Debug, Clone)]
#[command(version = "6.06", disable_version_flag = true)]
pub struct Args {
    /// Use IB device DEV (default: RDMA_DEVICE, else the first device found)
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Use port PORT of IB device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Test uses GID with GID index (default: IB no GID; Ethernet: RDMA_GID_INDEX, else the RoCE v2 IPv4 GID)
    #[arg(short = 'x', long = "gid-index", allow_hyphen_values = true)]
    pub gid_index: Option<i32>,
    /// Size of message to exchange (default 65536 for BW, 2 for latency; a trailing K
    /// or M multiplies by 1024 or 1024*1024)
    #[arg(short = 's', long = "size", value_parser = c_size, allow_hyphen_values = true)]
    pub size: Option<u64>,
    /// Number of exchanges (5 .. 100000000; default 5000 for ib_write_bw, else 1000)
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run sizes from 2 till 2^23
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Num of qp's (bandwidth tests only; 1 .. 16384, default 1)
    #[arg(short = 'q', long = "qp")]
    pub num_qps: Option<u32>,
    /// Size of tx queue (1 .. 15000; default 128 for BW, 1 for latency)
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Generate a completion only every CQ_MOD work requests (1 .. 1024, default 100)
    #[arg(short = 'Q', long = "cq-mod")]
    pub cq_mod: Option<u32>,
    /// Post lists of LIST_SIZE send WQEs (instead of single posts)
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    pub post_list: u32,
    /// Number of outstanding reads (READ only; default: the device's maximum)
    #[arg(short = 'o', long = "outs")]
    pub outs: Option<u32>,
    /// Run the test for DURATION seconds; the middle half (margins of DURATION/4 whole
    /// seconds) is measured
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// Listen on/connect to port PORT
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// MTU size: 256 - 4096 (default port MTU)
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// Report Max/Average BW in Gbit/sec (instead of MiB/sec)
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Connect QPs with rdma_cm and run test on those QPs (the exchanges ride on an
    /// rdma_cm connection too, on the same port)
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Communicate with rdma_cm module to exchange data - use regular QPs (the
    /// exchanges ride on an rdma_cm connection, the QPs are connected as without it)
    #[arg(short = 'z', long = "comm_rdma_cm")]
    pub comm_rdma_cm: bool,
    /// Connection type (RC only in this port)
    #[arg(short = 'c', long = "connection", default_value = "RC")]
    pub connection: String,
    /// Rx queue size (SEND; default 512, at most the iterations)
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// QP timeout: 4 usec * 2^timeout
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    pub qp_timeout: u8,
    /// Service level (0 .. 15)
    #[arg(short = 'S', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// Cancel the peak bandwidth calculation
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// Do not warn when the cores' CPU frequencies in /proc/cpuinfo differ
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Max size of message to be sent inline
    #[arg(short = 'I', long = "inline_size")]
    pub inline_size: Option<u32>,
    /// Disable PCIe relaxed ordering (register the buffer without
    /// IBV_ACCESS_RELAXED_ORDERING)
    #[arg(long = "disable_pcie_relaxed")]
    pub disable_pcie_relaxed: bool,
    /// report times in cpu cycle units (default microseconds)
    #[arg(short = 'C', long = "report-cycles")]
    pub report_cycles: bool,
    /// Print out all results (default print summary only); C spells the long
    /// name `--report-histogrm`, which is taken as is
    #[arg(short = 'H', long = "report-histogrm", alias = "report-histogram")]
    pub report_histogram: bool,
    /// (implies -H) print out unsorted results (default sorted)
    #[arg(short = 'U', long = "report-unsorted")]
    pub report_unsorted: bool,
    /// Sleep on CQ events (default poll)
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Use old post send flow (ibv_post_send). The port always posts so: perftest
    /// itself does on every device but ConnectX-4 and later, BlueField and EFA
    #[arg(long = "use_old_post_send")]
    pub use_old_post_send: bool,
    /// Report RX & TX results separately on Bidirectional BW tests
    #[arg(long = "report-both")]
    pub report_both: bool,
    /// Measure bidirectional bandwidth (default unidirectional)
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Run test forever, print results every `-D` seconds (default 5;
    /// bandwidth tests only; `-a` is ignored, as perftest ignores it)
    #[arg(long = "run_infinitely")]
    pub run_infinitely: bool,
    /// Show CPU Utilization in report, valid only in Duration mode
    #[arg(long = "cpu_util")]
    pub cpu_util: bool,
    /// Save the report in a json file
    #[arg(long = "out_json")]
    pub out_json: bool,
    /// Name of the report json file (with --out_json)
    #[arg(long = "out_json_file", value_name = "file", default_value = super::json::DEFAULT_FILE)]
    pub out_json_file: String,
    /// Set verbosity output level: bandwidth , message_rate, latency
    #[arg(long = "output", value_name = "units")]
    pub output: Option<String>,
    /// Display version number
    #[arg(short = 'V', long = "version")]
    pub version: bool,
    /// Server to connect to (none: be the server)
    pub servername: Option<String>,
    /// Words after the server's name, which perftest refuses (" Invalid Command
    /// line"); taken here so that it is refused in perftest's words.
    #[arg(hide = true)]
    pub extra: Vec<String>,
    /// The ids of the options given on the command line, in its order (filled by
    /// [`Args::parse_ordered`]): perftest checks each option as it reads it, so the
    /// first bad one is the one it names. Empty: the options' own order.
    #[arg(skip)]
    pub order: Vec<String>,
}

impl Args {
    /// Parses a command line (the program's name first) as clap does, noting the
    /// order of the options given (`order`).
    pub fn parse_ordered<I, T>(words: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Args::command().try_get_matches_from(words)?;
        let mut args = Args::from_arg_matches(&matches)?;
        let mut given: Vec<(usize, String)> = matches
            .ids()
            .filter(|id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine))
            .filter_map(|id| Some((matches.index_of(id.as_str())?, id.as_str().to_owned())))
            .collect();
        given.sort();
        args.order = given.into_iter().map(|(_, id)| id).collect();
        Ok(args)
    }
}

/// `-s` as perftest reads it: a trailing `K` or `M` multiplies by 1024 or 1024*1024,
/// and the rest is read as `strtol(.., 0)` reads it; the product wraps as C's
/// `uint64_t` does. Never fails: [`Params::new`] refuses a size out of range, in
/// perftest's words.
fn c_size(word: &str) -> Result<u64, String> {
    let (digits, factor) = if let Some(d) = word.strip_suffix('K') {
        (d, 1024)
    } else if let Some(d) = word.strip_suffix('M') {
        (d, 1024 * 1024)
    } else {
        (word, 1)
    };
    Ok((crate::c_args::strtol(digits) as u64).wrapping_mul(factor))
}

/// Largest size of `-a`.
pub const MAX_SIZE: u64 = 1 << 23;

/// What a run prints (`--output`): perftest's whole report, or one figure a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The whole report (the default).
    Full,
    /// Only the average bandwidth of each size (`--output=bandwidth`).
    Bandwidth,
    /// Only the message rate of each size (`--output=message_rate`).
    MessageRate,
    /// Only the average latency of each size (`--output=latency`).
    Latency,
}

impl Output {
    /// `--output`'s value, refused as perftest's `parser()` refuses it.
    fn parse(value: Option<&str>) -> Result<Output, Refusal> {
        match value {
            None => Ok(Output::Full),
            Some("bandwidth") => Ok(Output::Bandwidth),
            Some("message_rate") => Ok(Output::MessageRate),
            Some("latency") => Ok(Output::Latency),
            Some(_) => Err(Refusal::Parse(
                " Invalid verbosity level output flag. Please use bandwidth, latency, message_rate"
                    .into(),
            )),
        }
    }

    /// Refuses an output of the other kind of test, as perftest's
    /// `force_dependecies` does.
    fn check_kind(self, kind: TestKind) -> Result<Output, Refusal> {
        match (kind, self) {
            (TestKind::Bw, Output::Latency) => Err(Refusal::Depend(
                " Output verbosity level for BW can be: bandwidth, message_rate".into(),
            )),
            (TestKind::Lat, Output::Bandwidth | Output::MessageRate) => Err(Refusal::Depend(
                " Output verbosity level for LAT can be: latency".into(),
            )),
            _ => Ok(self),
        }
    }
}

/// The settled parameters of one run, after defaults and perftest's dependencies.
#[derive(Clone, Debug)]
pub struct Params {
    /// The verb.
    pub verb: Verb,
    /// Bandwidth or latency.
    pub kind: TestKind,
    /// The raw command line.
    pub args: Args,
    /// Message size (the largest with `-a`).
    pub size: u64,
    /// Iterations per QP.
    pub iters: u64,
    /// Queue pairs (`-q`, else 1).
    pub num_qps: u32,
    /// Requests in flight per QP.
    pub tx_depth: u32,
    /// Receives posted per QP (SEND).
    pub rx_depth: u32,
    /// Every cq_mod-th request is signaled.
    pub cq_mod: u32,
    /// Requests per post call.
    pub post_list: u32,
    /// Inline size: `-I` here; settled for the device by `inline::max_inline`
    /// once it is open.
    pub inline_size: u32,
    /// Peak bandwidth is not computed.
    pub no_peak: bool,
    /// True on the client.
    pub is_client: bool,
    /// `-b`: both sides send (bandwidth tests only).
    pub duplex: bool,
    /// `--output`: what the run prints.
    pub output: Output,
    /// `--out_json`: the file each result also goes to, once the device is open.
    pub json: Option<super::json::JsonOut>,
    /// `--cpu_util` in a `-D` run: the reports add the CPU's use.
    pub cpu_util: bool,
}

impl Params {
    /// Applies perftest's checks, defaults and dependencies, in its order: first the
    /// checks of its `parser()` (each option's, in the command line's order), then
    /// those of its `force_dependecies` (whose warnings are printed here, on stdout,
    /// as it prints them). An impossible combination is refused in perftest's words
    /// and way ([`Refusal`]).
    pub fn new(verb: Verb, kind: TestKind, mut args: Args) -> Result<Params, Refusal> {
        // perftest's `--run_infinitely` replaces the method `-a` chose.
        args.all = args.all && !args.run_infinitely;
        check_options(verb, kind, &args)?;
        let bw = kind == TestKind::Bw;
        let output = Output::parse(args.output.as_deref())?;
        let size = if args.all {
            MAX_SIZE
        } else {
            args.size.unwrap_or(if bw { 65536 } else { 2 })
        };
        // perftest's DEF_ITERS_WB for WRITE bandwidth only, DEF_ITERS for the rest: the
        // count is not exchanged, so a default that differs from C's leaves one side
        // waiting for messages the other never sends.
        let iters = args.iters.unwrap_or(if bw && verb == Verb::Write {
            5000
        } else {
            1000
        });
        // force_dependecies from here on, in its order.
        let (tx_depth, mut rx_depth) = depths(verb, bw, iters, &args);
        let post_list = args.post_list.max(1);
        let cq_mod = cq_moderation(bw, size, iters, post_list, tx_depth, &args)?;
        if args.duration.is_some() {
            if args.events {
                return Err(Refusal::Depend(
                    "Duration mode doesn't work with events.".into(),
                ));
            }
            if args.all {
                return Err(Refusal::Depend(
                    "Duration mode currently doesn't support running on all sizes.".into(),
                ));
            }
        }
        if args.cpu_util && args.duration.is_none() {
            // perftest's warning; the run goes on.
            println!("{}", super::report::RESULT_LINE);
            eprintln!(" CPU Utilization works only with Duration mode.");
        }
        refuse_endless(verb, kind, &args)?;
        let output = output.check_kind(kind)?;
        // perftest's "WA for a bug when rx_depth is odd in SEND" (only when running
        // one size a fixed time: not with -a or --run_infinitely).
        if verb == Verb::Send && rx_depth % 2 == 1 && !args.all && !args.run_infinitely {
            rx_depth += 1;
        }
        let inline_size = if verb == Verb::Read {
            0
        } else {
            args.inline_size.unwrap_or(0)
        };
        let is_client = args.servername.is_some();
        let duplex = args.bidirectional;
        let no_peak = args.no_peak
            || args.duration.is_some()
            || args.run_infinitely
            || (bw && iters > 20000)
            || (verb == Verb::Send && bw && !is_client && !duplex);
        Ok(Params {
            verb,
            kind,
            size,
            iters,
            num_qps: args.num_qps.unwrap_or(1),
            tx_depth,
            rx_depth,
            cq_mod,
            post_list,
            inline_size,
            no_peak,
            is_client,
            duplex,
            output,
            json: None,
            cpu_util: args.cpu_util && args.duration.is_some(),
            args,
        })
    }

    /// Whether the whole report is printed (no `--output`): the banners, the test's
    /// description, the addresses, the tables' headers and lines.
    pub fn full(&self) -> bool {
        self.output == Output::Full
    }

    /// True when the exchanges ride on an rdma_cm connection (`-R` or `-z`: perftest's
    /// `use_rdma_cm`); `args.rdma_cm` alone (`work_rdma_cm`) also connects the QPs.
    pub fn rdma_cm_link(&self) -> bool {
        self.args.rdma_cm || self.args.comm_rdma_cm
    }

    /// Whether the buffer is registered with PCIe relaxed ordering, as perftest
    /// registers it (`IBV_ACCESS_RELAXED_ORDERING`, "PCIe relax order: ON"): every
    /// tool but `ib_write_lat`, which polls the last byte of the peer's write and so
    /// needs the bytes to land in order, and never with `--disable_pcie_relaxed`
    /// (both perftest's `disable_pcir`).
    pub fn relaxed_ordering(&self) -> bool {
        let write_lat = self.verb == Verb::Write && self.kind == TestKind::Lat;
        !(self.args.disable_pcie_relaxed || write_lat)
    }

    /// With `--run_infinitely`: the seconds between two rows (`-D`, else
    /// perftest's default duration, 5).
    pub fn endless_every(&self) -> Option<u64> {
        self.args
            .run_infinitely
            .then(|| self.args.duration.unwrap_or(DEFAULT_DURATION))
    }

    /// The message sizes to run: 2^1 .. 2^23 with `-a`, else the one size.
    pub fn sizes(&self) -> Vec<u64> {
        if self.args.all {
            (1..24).map(|i| 1u64 << i).collect()
        } else {
            vec![self.size]
        }
    }
}

/// perftest's `DEF_DURATION`, in seconds.
const DEFAULT_DURATION: u64 = 5;

/// `--run_infinitely`'s refusals, in perftest's words and order.
fn refuse_endless(verb: Verb, kind: TestKind, args: &Args) -> Result<(), Refusal> {
    if !args.run_infinitely {
        return Ok(());
    }
    let depend = |why: &str| Err(Refusal::Depend(why.into()));
    if args.events {
        return depend(" run_infinitely does not support events feature yet.");
    }
    if kind == TestKind::Lat {
        return depend(" run_infinitely exists only in BW tests for now.");
    }
    if args.bidirectional && verb == Verb::Send {
        return depend(" run_infinitely mode is not supported in SEND Bidirectional BW test");
    }
    Ok(())
}

/// The send and receive queue depths, as perftest sizes them: no deeper than the
/// iterations (unless timed by duration). perftest's odd receive depth fix comes
/// later, in [`Params::new`].
fn depths(verb: Verb, bw: bool, iters: u64, args: &Args) -> (u32, u32) {
    let mut tx_depth = args.tx_depth.unwrap_or(if bw { 128 } else { 1 });
    let mut rx_depth = args
        .rx_depth
        .unwrap_or(if verb == Verb::Send { 512 } else { 1 });
    if args.duration.is_none() {
        // At most 100000000 iterations (checked): the cast does not cut.
        let iters = u32::try_from(iters).unwrap_or(u32::MAX);
        tx_depth = tx_depth.min(iters);
        if verb == Verb::Send {
            rx_depth = rx_depth.min(iters);
        }
    }
    (tx_depth, rx_depth)
}

/// Sends per signaled completion (`--cq-mod`): perftest's 100, the post list when
/// one is used, 1 for latency tests and (unless asked for) above 8 KiB, never more
/// than the send queue holds; with the post list's refusals, in perftest's order.
fn cq_moderation(
    bw: bool,
    size: u64,
    iters: u64,
    post_list: u32,
    tx_depth: u32,
    args: &Args,
) -> Result<u32, Refusal> {
    let depend = |why: String| Err(Refusal::Depend(why));
    let mut cq_mod = args.cq_mod.unwrap_or(100);
    // Large messages first: moderation off unless asked for (or waiting on
    // events), and a warning when it was.
    if size > 8192 && !args.all && !args.events {
        match args.cq_mod {
            None => cq_mod = 1,
            Some(asked) if asked > 1 => {
                println!("{}", super::report::RESULT_LINE);
                println!("Warning: Large message requested and CQ moderation enabled");
                println!("Warning: It can lead to inaccurate results");
            }
            Some(_) => {}
        }
    }
    // No more than the send queue holds, before the post list is checked against
    // it (so -Q 32 with -t 16 -l 16 runs, as in C).
    cq_mod = cq_mod.min(tx_depth);
    if post_list > 1 {
        if !bw {
            return depend("Post list is supported in BW tests only".into());
        }
        // Iterations only: with -D the count is the run's own.
        if args.duration.is_none() && iters % post_list as u64 != 0 {
            return depend("Number of iterations must be a multiple of post list size".into());
        }
        if args.cq_mod.is_none() {
            cq_mod = post_list;
            println!("{}", super::report::RESULT_LINE);
            println!("Post List requested - CQ moderation will be the size of the post list");
        } else if post_list % cq_mod != 0 {
            return depend("Post list size must be a multiple of CQ moderation".into());
        }
        // The port's own: perftest takes it, and its client never posts (a list
        // never fits in the send queue) and so waits forever.
        if post_list > tx_depth {
            return depend(format!(
                " Post list size {post_list} is larger than the TX depth {tx_depth}: \
                 perftest would never post it, this port refuses it"
            ));
        }
    }
    if !bw {
        cq_mod = 1;
    }
    Ok(cq_mod)
}

#[cfg(test)]
mod tests;
