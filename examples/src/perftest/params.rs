//! perftest's command line, shared by the six tools, and the defaults each applies.

use clap::Parser;

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
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<i32>,
    /// Size of message to exchange (default 65536 for BW, 2 for latency)
    #[arg(short = 's', long = "size")]
    pub size: Option<u64>,
    /// Number of exchanges (at least 5; default 5000 for ib_write_bw, else 1000)
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run sizes from 2 till 2^23
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Num of qp's
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub num_qps: u32,
    /// Size of tx queue (default 128 for BW, 1 for latency)
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Generate a completion only every CQ_MOD work requests (default 100)
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
    /// Connection type (RC only)
    #[arg(short = 'c', long = "connection", default_value = "RC")]
    pub connection: String,
    /// Rx queue size (SEND; default 512, at most the iterations)
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// QP timeout: 4 usec * 2^timeout
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    pub qp_timeout: u8,
    /// Service level
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
    /// `--output`'s value for a test of `kind`, refused in perftest's words where
    /// perftest refuses it.
    fn parse(value: Option<&str>, kind: TestKind) -> Result<Output, String> {
        let out = match value {
            None => return Ok(Output::Full),
            Some("bandwidth") => Output::Bandwidth,
            Some("message_rate") => Output::MessageRate,
            Some("latency") => Output::Latency,
            Some(_) => return Err(
                " Invalid verbosity level output flag. Please use bandwidth, latency, message_rate"
                    .into(),
            ),
        };
        match (kind, out) {
            (TestKind::Bw, Output::Latency) => {
                Err(" Output verbosity level for BW can be: bandwidth, message_rate".into())
            }
            (TestKind::Lat, Output::Bandwidth | Output::MessageRate) => {
                Err(" Output verbosity level for LAT can be: latency".into())
            }
            _ => Ok(out),
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
    /// Applies perftest's defaults and dependencies; an impossible combination is an
    /// error with perftest's wording where it has one.
    pub fn new(verb: Verb, kind: TestKind, mut args: Args) -> Result<Params, String> {
        // perftest's `--run_infinitely` replaces the method `-a` chose.
        args.all = args.all && !args.run_infinitely;
        if !args.connection.eq_ignore_ascii_case("RC") {
            return Err(format!(
                "connection type {} is not supported by this port (RC only)",
                args.connection
            ));
        }
        check_ranges(&args)?;
        refuse_for_the_verb(verb, &args)?;
        let bw = kind == TestKind::Bw;
        if args.bidirectional && !bw {
            return Err(" Bidirectional is only available in BW test".into());
        }
        if !bw && args.no_peak {
            return Err(" NoPeak only valid for BW tests".into());
        }
        if bw && (args.report_cycles || args.report_histogram) {
            return Err(" Available only on Latency tests".into());
        }
        if bw && args.report_unsorted {
            return Err(" is Available only on Latency tests".into());
        }
        if args.events && verb == Verb::Write {
            return Err(" Events feature not available on WRITE verb".into());
        }
        if args.events && args.duration.is_some() {
            return Err("Duration mode doesn't work with events.".into());
        }
        let duplex = args.bidirectional;
        let (size, iters) = sizes_and_counts(verb, kind, &args)?;
        let (tx_depth, rx_depth, post_list) = depths(verb, bw, iters, &args)?;
        let cq_mod = cq_moderation(bw, size, post_list, tx_depth, &args)?;
        if args.cpu_util && args.duration.is_none() {
            // perftest's warning, where it checks its options; the run goes on.
            println!("{}", super::report::RESULT_LINE);
            eprintln!(" CPU Utilization works only with Duration mode.");
        }
        // perftest's order: the post list's rules, then these, then the output's.
        refuse_endless(verb, kind, &args)?;
        let output = Output::parse(args.output.as_deref(), kind)?;
        let inline_size = if verb == Verb::Read {
            0
        } else {
            args.inline_size.unwrap_or(0)
        };
        let is_client = args.servername.is_some();
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

/// The ranges perftest checks each of these options' values in as it parses it,
/// before any rule of the verb: `-I` and `-r`.
fn check_ranges(args: &Args) -> Result<(), String> {
    if args
        .inline_size
        .is_some_and(|i| i > super::inline::MAX_INLINE)
    {
        return Err(format!(
            " Max inline should be between 0 and {}",
            super::inline::MAX_INLINE
        ));
    }
    if args.rx_depth.is_some_and(|r| !(1..=16384).contains(&r)) {
        return Err("  Rx depth should be between 1 and 16384".into());
    }
    Ok(())
}

/// Options perftest refuses for the verb as it parses them, in its words: inline
/// data on READ, outstanding reads but on READ, a receive queue deeper than one
/// but on SEND. (Taken and ignored, they would run what the user did not ask.)
fn refuse_for_the_verb(verb: Verb, args: &Args) -> Result<(), String> {
    if verb == Verb::Read && args.inline_size.is_some() {
        return Err(" Inline feature not available on READ/Atomic verbs".into());
    }
    if verb != Verb::Read && args.outs.is_some() {
        return Err(" Setting Outstanding reads only available on READ verb".into());
    }
    if verb != Verb::Send && args.rx_depth.is_some_and(|r| r > 1) {
        return Err(" On RDMA verbs rx depth can be only 1".into());
    }
    Ok(())
}

/// perftest's `DEF_DURATION`, in seconds.
const DEFAULT_DURATION: u64 = 5;

/// `--run_infinitely`'s refusals, in perftest's words and order.
fn refuse_endless(verb: Verb, kind: TestKind, args: &Args) -> Result<(), String> {
    if !args.run_infinitely {
        return Ok(());
    }
    if args.events {
        return Err(" run_infinitely does not support events feature yet.".into());
    }
    if kind == TestKind::Lat {
        return Err(" run_infinitely exists only in BW tests for now.".into());
    }
    if args.bidirectional && verb == Verb::Send {
        return Err(" run_infinitely mode is not supported in SEND Bidirectional BW test".into());
    }
    Ok(())
}

/// The message size and iterations (perftest's defaults: 64 KiB for bandwidth and
/// 2 B for latency; 5,000 iterations for WRITE bandwidth and 1,000 for the rest),
/// checked with the queue pair count and the duration.
fn sizes_and_counts(verb: Verb, kind: TestKind, args: &Args) -> Result<(u64, u64), String> {
    let bw = kind == TestKind::Bw;
    let size = if args.all {
        MAX_SIZE
    } else {
        args.size.unwrap_or(if bw { 65536 } else { 2 })
    };
    if size == 0 || size > (1 << 31) {
        return Err(format!(" Size {size} is out of range (1 .. 2^31)"));
    }
    // perftest's DEF_ITERS_WB for WRITE bandwidth only, DEF_ITERS for the rest: the
    // count is not exchanged, so a default that differs from C's leaves one side
    // waiting for messages the other never sends.
    let iters = args.iters.unwrap_or(if bw && verb == Verb::Write {
        5000
    } else {
        1000
    });
    if iters < 5 {
        return Err(" Iteration num must be at least 5".into());
    }
    // perftest keeps it in an `int`; larger counts wrapped there, and here they
    // would overflow the count of all queue pairs' iterations.
    if iters > i32::MAX as u64 {
        return Err(format!(" Iteration num must be at most {}", i32::MAX));
    }
    if args.num_qps == 0 || args.num_qps > 64 {
        return Err(" Number of QPs must be 1 .. 64".into());
    }
    if kind == TestKind::Lat && args.num_qps != 1 {
        return Err(" Latency tests use one QP".into());
    }
    if args.duration == Some(0) {
        return Err(" Duration period must be positive".into());
    }
    if args.duration.is_some() && args.all {
        return Err("Duration mode currently doesn't support running on all sizes.".into());
    }
    Ok((size, iters))
}

/// The send and receive queue depths and the post list, as perftest sizes them:
/// no deeper than the iterations (unless timed by duration).
fn depths(verb: Verb, bw: bool, iters: u64, args: &Args) -> Result<(u32, u32, u32), String> {
    let mut tx_depth = args.tx_depth.unwrap_or(if bw { 128 } else { 1 });
    if tx_depth == 0 {
        return Err(" TX depth must be at least 1".into());
    }
    let mut rx_depth = args
        .rx_depth
        .unwrap_or(if verb == Verb::Send { 512 } else { 1 });
    if args.duration.is_none() {
        // Iterations beyond 2^32 - 1 cap nothing here (not a wrapped count).
        let iters = u32::try_from(iters).unwrap_or(u32::MAX);
        tx_depth = tx_depth.min(iters);
        if verb == Verb::Send {
            rx_depth = rx_depth.min(iters);
        }
    }
    let post_list = args.post_list.max(1);
    if !bw && post_list > 1 {
        return Err("Post list is supported in BW tests only".into());
    }
    if post_list > tx_depth {
        return Err(format!(
            " Post list size {post_list} is larger than the TX depth {tx_depth}"
        ));
    }
    // Iterations only: with -D the count is the run's own.
    if args.duration.is_none() && iters % post_list as u64 != 0 {
        // perftest's words.
        return Err("Number of iterations must be a multiple of post list size".into());
    }
    // perftest's "WA for a bug when rx_depth is odd in SEND" (only when running
    // one size a fixed time: not with -a or --run_infinitely).
    if verb == Verb::Send && rx_depth % 2 == 1 && !args.all && !args.run_infinitely {
        rx_depth += 1;
    }
    Ok((tx_depth, rx_depth, post_list))
}

/// Sends per signaled completion (`--cq-mod`): perftest's 100, the post list when
/// one is used, 1 for latency tests and (unless asked for) above 8 KiB, never more
/// than the send queue holds.
fn cq_moderation(
    bw: bool,
    size: u64,
    post_list: u32,
    tx_depth: u32,
    args: &Args,
) -> Result<u32, String> {
    let mut cq_mod = args.cq_mod.unwrap_or(100).max(1);
    // perftest's force_dependencies, in its order and with its lines on stdout.
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
    // Then a post list (BW only: `depths` refused it otherwise), which moderates
    // by its size unless -Q was given.
    if bw && post_list > 1 {
        if args.cq_mod.is_none() {
            cq_mod = post_list;
            println!("{}", super::report::RESULT_LINE);
            println!("Post List requested - CQ moderation will be the size of the post list");
        } else if post_list % cq_mod != 0 {
            return Err(" Post list size must be a multiple of CQ moderation".into());
        }
    }
    if !bw {
        cq_mod = 1;
    }
    // Within the TX depth: cut above, and a post list is no longer than it (`depths`).
    Ok(cq_mod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("t").chain(v.iter().copied())).unwrap()
    }

    #[test]
    fn iterations_and_depths_past_an_int_are_refused_not_wrapped() {
        let p = |v: &[&str]| Params::new(Verb::Write, TestKind::Bw, parse(v));
        let why = p(&["-n", "4294967296"]).map(|p| p.iters).unwrap_err();
        assert!(why.contains("at most 2147483647"), "{why}");
        let p = p(&["-n", "2147483647", "-l", "1"]).unwrap();
        assert_eq!((p.iters, p.tx_depth), (2147483647, 128));
    }

    #[test]
    fn bidirectional_and_output_follow_perftest() {
        let p = |verb, kind, v: &[&str]| Params::new(verb, kind, parse(v));
        let why = p(Verb::Send, TestKind::Lat, &["-b"]).unwrap_err();
        assert_eq!(why, " Bidirectional is only available in BW test");
        let server = p(Verb::Send, TestKind::Bw, &["-b"]).unwrap();
        assert!(
            server.duplex && !server.no_peak,
            "a duplex SEND server times its sends"
        );
        assert!(p(Verb::Send, TestKind::Bw, &[]).unwrap().no_peak);
        let long = p(Verb::Write, TestKind::Bw, &["--bidirectional", "h"]).unwrap();
        assert!(long.duplex && long.full());
        let out = |kind, v: &str| p(Verb::Read, kind, &["--output", v]).map(|p| p.output);
        assert_eq!(out(TestKind::Bw, "bandwidth"), Ok(Output::Bandwidth));
        assert_eq!(out(TestKind::Bw, "message_rate"), Ok(Output::MessageRate));
        assert_eq!(out(TestKind::Lat, "latency"), Ok(Output::Latency));
        assert_eq!(
            out(TestKind::Bw, "latency"),
            Err(" Output verbosity level for BW can be: bandwidth, message_rate".into())
        );
        assert_eq!(
            out(TestKind::Lat, "bandwidth"),
            Err(" Output verbosity level for LAT can be: latency".into())
        );
        let why = out(TestKind::Bw, "bw").unwrap_err();
        assert!(why.contains("Invalid verbosity level output flag"), "{why}");
        let eq = Params::new(Verb::Write, TestKind::Bw, parse(&["--output=bandwidth"])).unwrap();
        assert!(!eq.full());
    }

    #[test]
    fn no_peak_and_odd_receive_depths_follow_perftest() {
        let why = Params::new(Verb::Send, TestKind::Lat, parse(&["-N"])).unwrap_err();
        assert_eq!(why, " NoPeak only valid for BW tests");
        let depth = |v: &[&str]| {
            Params::new(Verb::Send, TestKind::Bw, parse(v))
                .unwrap()
                .rx_depth
        };
        assert_eq!(depth(&["-n", "201"]), 202);
        assert_eq!(depth(&["-r", "7"]), 8);
        assert_eq!(depth(&["-r", "7", "-a"]), 7);
        assert_eq!(depth(&["-n", "200"]), 200);
        let write = Params::new(Verb::Write, TestKind::Bw, parse(&["-r", "1"])).unwrap();
        assert_eq!(write.rx_depth, 1);
        let hist = Params::new(Verb::Send, TestKind::Lat, parse(&["--report-histogrm"])).unwrap();
        assert!(hist.args.report_histogram);
    }

    #[test]
    fn a_post_list_is_checked_as_perftest_checks_it() {
        let p = |v: &[&str]| Params::new(Verb::Write, TestKind::Bw, parse(v));
        // -Q is first cut to the TX depth, then the post list must be a multiple.
        let q = p(&["-n", "160", "-t", "16", "-l", "16", "-Q", "32"]).unwrap();
        assert_eq!((q.post_list, q.cq_mod), (16, 16));
        // With -D the iterations need not be a multiple of the post list.
        assert!(p(&["-D", "2", "-l", "3"]).is_ok());
        assert!(p(&["-n", "10", "-l", "3"]).is_err());
    }

    #[test]
    fn default_iterations_are_perftests() {
        let iters = |verb, kind| Params::new(verb, kind, parse(&[])).unwrap().iters;
        assert_eq!(iters(Verb::Write, TestKind::Bw), 5000);
        for (verb, kind) in [
            (Verb::Send, TestKind::Bw),
            (Verb::Read, TestKind::Bw),
            (Verb::Send, TestKind::Lat),
            (Verb::Write, TestKind::Lat),
            (Verb::Read, TestKind::Lat),
        ] {
            assert_eq!(iters(verb, kind), 1000, "{verb:?} {kind:?}");
        }
    }

    #[test]
    fn options_of_another_verb_are_refused_in_perftests_words() {
        let p = |verb, v: &[&str]| Params::new(verb, TestKind::Bw, parse(v)).map(|_| ());
        let inline = " Inline feature not available on READ/Atomic verbs";
        let outs = " Setting Outstanding reads only available on READ verb";
        let rx = " On RDMA verbs rx depth can be only 1";
        assert_eq!(p(Verb::Read, &["-I", "0"]), Err(inline.into()));
        assert_eq!(p(Verb::Write, &["-o", "4"]), Err(outs.into()));
        assert_eq!(p(Verb::Send, &["-o", "4"]), Err(outs.into()));
        assert_eq!(p(Verb::Write, &["-r", "2"]), Err(rx.into()));
        assert_eq!(p(Verb::Read, &["-r", "2"]), Err(rx.into()));
        // The value's range first, as perftest checks it while parsing the option.
        let range = "  Rx depth should be between 1 and 16384";
        assert_eq!(p(Verb::Write, &["-r", "20000"]), Err(range.into()));
        assert_eq!(p(Verb::Send, &["-r", "0"]), Err(range.into()));
        let big = p(Verb::Read, &["-I", "1000"]).unwrap_err();
        assert!(
            big.starts_with(" Max inline should be between 0 and"),
            "{big}"
        );
        for (verb, v) in [
            (Verb::Send, &["-I", "0"][..]),
            (Verb::Read, &["-o", "4"]),
            (Verb::Send, &["-r", "2"]),
            (Verb::Read, &["-r", "1"]),
        ] {
            assert_eq!(p(verb, v), Ok(()), "{verb:?} {v:?}");
        }
    }

    #[test]
    fn latency_reports_are_refused_on_bandwidth_tests() {
        let p = |v: &[&str]| Params::new(Verb::Send, TestKind::Bw, parse(v)).map(|_| ());
        assert_eq!(p(&["-C"]), Err(" Available only on Latency tests".into()));
        assert_eq!(p(&["-H"]), Err(" Available only on Latency tests".into()));
        assert_eq!(
            p(&["-U"]),
            Err(" is Available only on Latency tests".into())
        );
        let lat = Params::new(Verb::Read, TestKind::Lat, parse(&["-C", "-H", "-U"])).unwrap();
        assert!(lat.args.report_cycles && lat.args.report_histogram && lat.args.report_unsorted);
    }

    #[test]
    fn events_follow_perftest() {
        let p = |verb, kind, v: &[&str]| Params::new(verb, kind, parse(v));
        for kind in [TestKind::Bw, TestKind::Lat] {
            let why = p(Verb::Write, kind, &["-e"]).unwrap_err();
            assert_eq!(why, " Events feature not available on WRITE verb");
        }
        let why = p(Verb::Send, TestKind::Bw, &["-e", "-D", "4"]).unwrap_err();
        assert_eq!(why, "Duration mode doesn't work with events.");
        // Moderation stays on for large messages when waiting on events.
        let p = |v: &[&str]| Params::new(Verb::Read, TestKind::Bw, parse(v)).unwrap();
        assert_eq!(p(&["--events", "-n", "500"]).cq_mod, 100);
        assert_eq!(p(&["-n", "500"]).cq_mod, 1);
    }

    #[test]
    fn run_infinitely_follows_perftest() {
        let p = |verb, kind, v: &[&str]| Params::new(verb, kind, parse(v));
        let why = p(Verb::Send, TestKind::Bw, &["--run_infinitely", "-e"]).unwrap_err();
        assert_eq!(why, " run_infinitely does not support events feature yet.");
        for verb in [Verb::Send, Verb::Write, Verb::Read] {
            let why = p(verb, TestKind::Lat, &["--run_infinitely"]).unwrap_err();
            assert_eq!(why, " run_infinitely exists only in BW tests for now.");
        }
        let why = p(Verb::Send, TestKind::Bw, &["--run_infinitely", "-b"]).unwrap_err();
        assert_eq!(
            why,
            " run_infinitely mode is not supported in SEND Bidirectional BW test"
        );
        let plain = p(Verb::Write, TestKind::Bw, &["--run_infinitely"]).unwrap();
        assert_eq!(plain.endless_every(), Some(5));
        assert!(plain.no_peak && plain.args.duration.is_none());
        // -a is ignored, with -D too; both directions of WRITE and READ run.
        let all = p(
            Verb::Read,
            TestKind::Bw,
            &["--run_infinitely", "-a", "-D", "2", "-b"],
        )
        .unwrap();
        assert_eq!((all.endless_every(), all.sizes()), (Some(2), vec![65536]));
        // Depths follow the iterations, and an odd receive depth stays odd.
        let send = p(Verb::Send, TestKind::Bw, &["--run_infinitely", "-n", "9"]).unwrap();
        assert_eq!((send.tx_depth, send.rx_depth), (9, 9));
        assert_eq!(
            p(Verb::Send, TestKind::Bw, &[]).unwrap().endless_every(),
            None
        );
    }

    #[test]
    fn defaults_follow_perftest() {
        let p = Params::new(Verb::Write, TestKind::Bw, parse(&["-n", "200"])).unwrap();
        assert_eq!(
            (p.size, p.iters, p.tx_depth, p.cq_mod),
            (65536, 200, 128, 1)
        );
        let p = Params::new(Verb::Write, TestKind::Bw, parse(&["-s", "64", "-n", "50"])).unwrap();
        assert_eq!((p.tx_depth, p.cq_mod), (50, 50));
        let p = Params::new(Verb::Send, TestKind::Lat, parse(&["-n", "200"])).unwrap();
        assert_eq!((p.size, p.tx_depth, p.rx_depth, p.cq_mod), (2, 1, 200, 1));
        let p = Params::new(Verb::Send, TestKind::Bw, parse(&["-l", "4", "-s", "64"])).unwrap();
        assert_eq!((p.post_list, p.cq_mod), (4, 4));
        assert!(p.no_peak, "a SEND server computes no peak");
        let p = Params::new(Verb::Read, TestKind::Bw, parse(&["-R", "-n", "100"])).unwrap();
        assert!(p.args.rdma_cm);
        let p = Params::new(Verb::Send, TestKind::Lat, parse(&["--rdma_cm"])).unwrap();
        assert!(p.args.rdma_cm && p.rdma_cm_link());
        let p = Params::new(Verb::Write, TestKind::Lat, parse(&["-z"])).unwrap();
        assert!(!p.args.rdma_cm && p.rdma_cm_link());
        let p = Params::new(Verb::Write, TestKind::Lat, parse(&[])).unwrap();
        assert!(!p.rdma_cm_link());
        assert!(!p.relaxed_ordering(), "ib_write_lat polls the last byte");
        for (verb, kind) in [
            (Verb::Write, TestKind::Bw),
            (Verb::Read, TestKind::Lat),
            (Verb::Send, TestKind::Lat),
        ] {
            let p = Params::new(verb, kind, parse(&[])).unwrap();
            assert!(p.relaxed_ordering(), "{verb:?} {kind:?}");
            let off = Params::new(verb, kind, parse(&["--disable_pcie_relaxed"])).unwrap();
            assert!(!off.relaxed_ordering(), "{verb:?} {kind:?} disabled");
        }
        assert!(Params::new(Verb::Write, TestKind::Bw, parse(&["-R", "-c", "UC"])).is_err());
        assert!(Params::new(Verb::Write, TestKind::Bw, parse(&["-n", "3"])).is_err());
        for (verb, kind) in [
            (Verb::Send, TestKind::Bw),
            (Verb::Send, TestKind::Lat),
            (Verb::Read, TestKind::Lat),
        ] {
            let p = Params::new(verb, kind, parse(&["-D", "4"])).unwrap();
            assert_eq!(p.args.duration, Some(4));
            assert!(p.no_peak);
        }
        assert!(Params::new(Verb::Send, TestKind::Bw, parse(&["-D", "2", "-a"])).is_err());
        assert!(Params::new(Verb::Write, TestKind::Lat, parse(&["-D", "0"])).is_err());
    }
}
