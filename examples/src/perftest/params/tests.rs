//! Unit tests of the command line: defaults, dependencies and refusals in
//! perftest's words.
use super::*;
use crate::c_args::strtol;

fn parse(v: &[&str]) -> Args {
    Args::parse_ordered(std::iter::once("t").chain(v.iter().copied())).unwrap()
}

fn parse_err(why: &str) -> Refusal {
    Refusal::Parse(why.into())
}

fn depend(why: &str) -> Refusal {
    Refusal::Depend(why.into())
}

#[test]
fn iterations_follow_perftests_range() {
    let p = |v: &[&str]| Params::new(Verb::Write, TestKind::Bw, parse(v));
    let why = parse_err(" Iteration num should be between 5 and 100000000");
    for n in ["4", "100000001", "4294967296", "18446744073709551615"] {
        assert_eq!(p(&["-n", n]).unwrap_err(), why, "-n {n}");
    }
    let p = p(&["-n", "100000000", "-l", "1"]).unwrap();
    assert_eq!((p.iters, p.tx_depth), (100000000, 128));
}

#[test]
fn bidirectional_and_output_follow_perftest() {
    let p = |verb, kind, v: &[&str]| Params::new(verb, kind, parse(v));
    let why = p(Verb::Send, TestKind::Lat, &["-b"]).unwrap_err();
    assert_eq!(
        why,
        parse_err(" Bidirectional is only available in BW test")
    );
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
        Err(depend(
            " Output verbosity level for BW can be: bandwidth, message_rate"
        ))
    );
    assert_eq!(
        out(TestKind::Lat, "bandwidth"),
        Err(depend(" Output verbosity level for LAT can be: latency"))
    );
    assert_eq!(
        out(TestKind::Bw, "bw"),
        Err(parse_err(
            " Invalid verbosity level output flag. Please use bandwidth, latency, message_rate"
        ))
    );
    let eq = Params::new(Verb::Write, TestKind::Bw, parse(&["--output=bandwidth"])).unwrap();
    assert!(!eq.full());
}

#[test]
fn no_peak_and_odd_receive_depths_follow_perftest() {
    let why = Params::new(Verb::Send, TestKind::Lat, parse(&["-N"])).unwrap_err();
    assert_eq!(why, parse_err(" NoPeak only valid for BW tests"));
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
    let why = "Number of iterations must be a multiple of post list size";
    assert_eq!(p(&["-n", "10", "-l", "3"]).unwrap_err(), depend(why));
    let why = "Post list size must be a multiple of CQ moderation";
    assert_eq!(
        p(&["-n", "12", "-l", "4", "-Q", "3"]).unwrap_err(),
        depend(why)
    );
    let why = "Post list is supported in BW tests only";
    let lat = Params::new(Verb::Send, TestKind::Lat, parse(&["-l", "2"]));
    assert_eq!(lat.unwrap_err(), depend(why));
    // The port's own refusal (perftest's client would never post): a dependency.
    let why = p(&["-n", "40", "-t", "10", "-l", "20"]).unwrap_err();
    assert!(
        matches!(&why, Refusal::Depend(m) if m.starts_with(" Post list size 20 is larger than the TX depth 10")),
        "{why:?}"
    );
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
    let inline = parse_err(" Inline feature not available on READ/Atomic verbs");
    let outs = parse_err(" Setting Outstanding reads only available on READ verb");
    let rx = parse_err(" On RDMA verbs rx depth can be only 1");
    assert_eq!(p(Verb::Read, &["-I", "0"]), Err(inline));
    assert_eq!(p(Verb::Write, &["-o", "4"]), Err(outs.clone()));
    assert_eq!(p(Verb::Send, &["-o", "4"]), Err(outs.clone()));
    assert_eq!(p(Verb::Write, &["-r", "2"]), Err(rx.clone()));
    assert_eq!(p(Verb::Read, &["-r", "2"]), Err(rx.clone()));
    // The value's range first, as perftest checks it while parsing the option.
    let range = parse_err("  Rx depth should be between 1 and 16384");
    assert_eq!(p(Verb::Write, &["-r", "20000"]), Err(range.clone()));
    assert_eq!(p(Verb::Send, &["-r", "0"]), Err(range));
    let big = parse_err(" Max inline should be between 0 and 912");
    assert_eq!(p(Verb::Read, &["-I", "1000"]), Err(big));
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
    let only = parse_err(" Available only on Latency tests");
    assert_eq!(p(&["-C"]), Err(only.clone()));
    assert_eq!(p(&["-H"]), Err(only));
    assert_eq!(
        p(&["-U"]),
        Err(parse_err(" is Available only on Latency tests"))
    );
    let lat = Params::new(Verb::Read, TestKind::Lat, parse(&["-C", "-H", "-U"])).unwrap();
    assert!(lat.args.report_cycles && lat.args.report_histogram && lat.args.report_unsorted);
}

#[test]
fn events_follow_perftest() {
    let p = |verb, kind, v: &[&str]| Params::new(verb, kind, parse(v));
    for kind in [TestKind::Bw, TestKind::Lat] {
        let why = p(Verb::Write, kind, &["-e"]).unwrap_err();
        assert_eq!(
            why,
            parse_err(" Events feature not available on WRITE verb")
        );
    }
    let why = p(Verb::Send, TestKind::Bw, &["-e", "-D", "4"]).unwrap_err();
    assert_eq!(why, depend("Duration mode doesn't work with events."));
    // Moderation stays on for large messages when waiting on events.
    let p = |v: &[&str]| Params::new(Verb::Read, TestKind::Bw, parse(v)).unwrap();
    assert_eq!(p(&["--events", "-n", "500"]).cq_mod, 100);
    assert_eq!(p(&["-n", "500"]).cq_mod, 1);
}

#[test]
fn run_infinitely_follows_perftest() {
    let p = |verb, kind, v: &[&str]| Params::new(verb, kind, parse(v));
    let why = p(Verb::Send, TestKind::Bw, &["--run_infinitely", "-e"]).unwrap_err();
    assert_eq!(
        why,
        depend(" run_infinitely does not support events feature yet.")
    );
    for verb in [Verb::Send, Verb::Write, Verb::Read] {
        let why = p(verb, TestKind::Lat, &["--run_infinitely"]).unwrap_err();
        assert_eq!(
            why,
            depend(" run_infinitely exists only in BW tests for now.")
        );
    }
    let why = p(Verb::Send, TestKind::Bw, &["--run_infinitely", "-b"]).unwrap_err();
    assert_eq!(
        why,
        depend(" run_infinitely mode is not supported in SEND Bidirectional BW test")
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
    for (verb, kind) in [
        (Verb::Send, TestKind::Bw),
        (Verb::Send, TestKind::Lat),
        (Verb::Read, TestKind::Lat),
    ] {
        let p = Params::new(verb, kind, parse(&["-D", "4"])).unwrap();
        assert_eq!(p.args.duration, Some(4));
        assert!(p.no_peak);
    }
    let why = Params::new(Verb::Send, TestKind::Bw, parse(&["-D", "2", "-a"])).unwrap_err();
    assert_eq!(
        why,
        depend("Duration mode currently doesn't support running on all sizes.")
    );
    let why = Params::new(Verb::Write, TestKind::Lat, parse(&["-D", "0"])).unwrap_err();
    assert_eq!(why, parse_err(" Duration period must be positive"));
}

#[test]
fn ranges_follow_perftests_parser() {
    let p = |kind, v: &[&str]| Params::new(Verb::Send, kind, parse(v)).map(|_| ());
    let bw = |v: &[&str]| p(TestKind::Bw, v);
    let tx = parse_err(" Tx depth should be between 1 and 15000");
    assert_eq!(bw(&["-t", "0"]), Err(tx.clone()));
    assert_eq!(bw(&["-t", "15001"]), Err(tx));
    assert_eq!(bw(&["-t", "15000"]), Ok(()));
    let gid = parse_err(" Gid index should be between 0 and 64");
    assert_eq!(bw(&["-x", "65"]), Err(gid.clone()));
    assert_eq!(bw(&["-x", "-1"]), Err(gid));
    assert_eq!(bw(&["-x", "64"]), Ok(()));
    let qps = parse_err(" num of Qps should be between 1 and 16384");
    assert_eq!(bw(&["-q", "0"]), Err(qps.clone()));
    assert_eq!(bw(&["-q", "16385"]), Err(qps));
    let many = Params::new(Verb::Write, TestKind::Bw, parse(&["-q", "16384"])).unwrap();
    assert_eq!(many.num_qps, 16384);
    let lat = parse_err(" Multiple QPs only available on bw tests");
    assert_eq!(p(TestKind::Lat, &["-q", "1"]), Err(lat));
    let cq = parse_err(" CQ moderation should be between 1 and 1024");
    assert_eq!(bw(&["-Q", "0"]), Err(cq.clone()));
    assert_eq!(bw(&["-Q", "1025"]), Err(cq));
    assert_eq!(bw(&["-S", "16"]), Err(parse_err(" Only 15 Service levels")));
    assert_eq!(bw(&["-S", "15"]), Ok(()));
    assert_eq!(
        bw(&["-i", "0"]),
        Err(parse_err("IB Port can't be less than 1"))
    );
    let words = parse_err(" Invalid Command line. Please check command rerun ");
    assert_eq!(bw(&["host", "more"]), Err(words));
}

#[test]
fn sizes_are_read_as_perftest_reads_them() {
    let size = |v: &str| Params::new(Verb::Write, TestKind::Bw, parse(&["-s", v])).map(|p| p.size);
    assert_eq!(size("4K"), Ok(4096));
    assert_eq!(size("2M"), Ok(2 << 20));
    assert_eq!(size("0x10"), Ok(16));
    assert_eq!(size("010"), Ok(8));
    assert_eq!(size("12abc"), Ok(12));
    assert_eq!(size("2147483647"), Ok(2147483647));
    let why = parse_err(" Message Size should be between 1 and 2147483647");
    for bad in [
        "0",
        "abc",
        "2147483648",
        "2048M",
        "-1",
        "99999999999999999999",
    ] {
        assert_eq!(size(bad), Err(why.clone()), "-s {bad}");
    }
    assert_eq!(strtol("  -0x1f"), -31);
    assert_eq!(strtol("-99999999999999999999"), i64::MIN);
}

#[test]
fn connection_types_follow_change_conn_type() {
    let c = |verb, name: &str| Params::new(verb, TestKind::Bw, parse(&["-c", name])).map(|_| ());
    assert_eq!(c(Verb::Write, "RC"), Ok(()));
    let invalid =
        Refusal::Exit(" Invalid Connection type. Please choose from {RC,UC,UD,XRC,DC,SRD}".into());
    assert_eq!(c(Verb::Write, "rc"), Err(invalid.clone()));
    assert_eq!(c(Verb::Send, "XX"), Err(invalid));
    let uc = Refusal::Exit(" UC connection not possible in READ/ATOMIC verbs".into());
    assert_eq!(c(Verb::Read, "UC"), Err(uc));
    let ud = Refusal::Exit(" UD connection only possible in SEND verb".into());
    assert_eq!(c(Verb::Write, "UD"), Err(ud));
    let port = c(Verb::Send, "UD").unwrap_err();
    assert!(
        port.message().contains("not supported by this port"),
        "{port:?}"
    );
}

#[test]
fn the_first_bad_option_on_the_command_line_is_named() {
    let p = |v: &[&str]| Params::new(Verb::Send, TestKind::Lat, parse(v)).unwrap_err();
    let bidi = parse_err(" Bidirectional is only available in BW test");
    let peak = parse_err(" NoPeak only valid for BW tests");
    assert_eq!(p(&["-b", "-N"]), bidi);
    assert_eq!(p(&["-N", "-b"]), peak);
    assert_eq!(p(&["-Nb"]), peak);
    // Parsing first, then the dependencies, whatever the order.
    assert_eq!(p(&["-l", "2", "-b"]), bidi);
    // Without the command line's order (Args built by clap alone), the fields'.
    let plain = Args::try_parse_from(["t", "-b", "-N"]).unwrap();
    let why = Params::new(Verb::Send, TestKind::Lat, plain).unwrap_err();
    assert_eq!(why, peak);
    // A warning of force_dependecies comes before a later refusal of it.
    let why = Params::new(
        Verb::Write,
        TestKind::Bw,
        parse(&["-n", "10", "-l", "3", "-Q", "2"]),
    );
    assert_eq!(
        why.unwrap_err(),
        depend("Number of iterations must be a multiple of post list size")
    );
}

#[test]
fn refusals_say_their_message() {
    let r = Refusal::Depend("x".into());
    assert_eq!((r.message(), r.to_string()), ("x", "x".to_string()));
}
