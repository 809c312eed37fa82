//! perftest's report formats and the arithmetic behind them (pure code).

use super::params::{Params, TestKind, Verb};
use super::protocol::{BwReport, KeyData};

/// The dashed line perftest prints around its tables.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// Bandwidth table header (`RESULT_FMT`, or `RESULT_FMT_G` with `--report_gbits`).
pub fn bw_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// Latency table header (`RESULT_FMT_LAT`).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// Latency table header of duration mode (`RESULT_FMT_LAT_DUR`).
pub const LAT_DUR_HEADER: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// What `--cpu_util` adds to a table's header (`RESULT_EXT_CPU_UTIL`).
pub const CPU_HEADER: &str = "    CPU_Util[%]";

/// What `--cpu_util` adds to a row (`REPORT_EXT_CPU_UTIL`): the CPU's use in percent.
pub fn cpu_column(percent: f64) -> String {
    format!("\t    {percent:<3.2}")
}

/// The latency header of a run: `LAT_DUR_HEADER` with `-D`, else `LAT_HEADER`.
pub fn lat_header(duration: bool) -> &'static str {
    if duration {
        LAT_DUR_HEADER
    } else {
        LAT_HEADER
    }
}

/// One row of duration mode (`REPORT_FMT_LAT_DUR`): iterations of the sampled window,
/// average one-way latency in microseconds, transactions per second.
pub fn lat_dur_row(size: u64, iters: u64, t_avg: f64, tps: f64) -> String {
    format!(" {size:<7}       {iters}            {t_avg:<7.2}        {tps:<7.2}")
}

/// One bandwidth row, as `REPORT_FMT` (or `REPORT_FMT_EXT` for tiny Gb/s figures).
pub fn bw_row(rep: &BwReport, gbits: bool) -> String {
    bw_row_of(rep, gbits && rep.bw_avg < 0.1)
}

/// The row of a bidirectional run (`print_full_bw_report` given the peer's
/// report): both sides' peaks, averages and message rates summed, with this side's
/// size and iterations, and the precision this side's own average calls for.
pub fn bw_duplex_row(mine: &BwReport, rem: &BwReport, gbits: bool) -> String {
    bw_row_of(&bw_sum(mine, rem), gbits && mine.bw_avg < 0.1)
}

/// Both sides' figures summed, with this side's size and iterations.
pub fn bw_sum(mine: &BwReport, rem: &BwReport) -> BwReport {
    BwReport {
        bw_peak: mine.bw_peak + rem.bw_peak,
        bw_avg: mine.bw_avg + rem.bw_avg,
        msg_rate: mine.msg_rate + rem.msg_rate,
        ..*mine
    }
}

/// One figure alone, as `--output` prints it (C's `"%lf\n"`: six decimals).
pub fn figure(value: f64) -> String {
    format!("{value:.6}")
}

/// `REPORT_FMT`, or with `ext` the six-decimal `REPORT_FMT_EXT`.
fn bw_row_of(rep: &BwReport, ext: bool) -> String {
    if ext {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            rep.size, rep.iters, rep.bw_peak, rep.bw_avg, rep.msg_rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            rep.size, rep.iters, rep.bw_peak, rep.bw_avg, rep.msg_rate
        )
    }
}

/// The statistics of a latency run, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct LatStats {
    /// Smallest sample.
    pub min: f64,
    /// Largest sample kept (perftest drops the two largest).
    pub max: f64,
    /// The median ("typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation (perftest truncates each difference to an integer).
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// perftest's latency statistics of the gaps between consecutive posts (`posted` in
/// nanoseconds), each divided by `rtt_factor` (2 for SEND/WRITE ping-pong, 1 for READ).
pub fn lat_stats(posted: &[f64], rtt_factor: f64) -> Option<LatStats> {
    lat_stats_per(posted, 1000.0 * rtt_factor) // ns -> us and round trip
}

/// [`lat_stats`] of post times in any unit, each gap divided by `q` (perftest's
/// `cycles_rtt_quotient`: with `-C` the post times are cycles and `q` is the
/// round-trip factor alone).
pub fn lat_stats_per(posted: &[f64], q: f64) -> Option<LatStats> {
    if posted.len() < 4 {
        return None;
    }
    let mut delta: Vec<f64> = posted.windows(2).map(|w| w[1] - w[0]).collect();
    delta.sort_by(|a, b| a.total_cmp(b));
    let n = delta.len() - 2; // LAT_MEASURE_TAIL
    let median = if (n - 1) % 2 == 1 {
        let mid = (delta[n / 2] + delta[n / 2 - 1]) / 2.0;
        // C averages two integer cycle counts: with -C (whole cycles) the half
        // is dropped as there.
        if delta[n / 2].fract() == 0.0 && delta[n / 2 - 1].fract() == 0.0 {
            mid.floor()
        } else {
            mid
        }
    } else {
        delta[n / 2]
    };
    let avg = delta[..n].iter().map(|d| d / q).sum::<f64>() / n as f64;
    let var = delta[..n]
        .iter()
        .map(|d| {
            let t = (avg - d / q).trunc();
            (t * t).trunc()
        })
        .sum::<f64>()
        / n as f64;
    let i99 = ((n as f64) * 0.99).ceil() as usize;
    let i999 = ((n as f64) * 0.999).ceil() as usize;
    Some(LatStats {
        min: delta[0] / q,
        max: delta[n] / q,
        typical: median / q,
        avg,
        stdev: var.sqrt(),
        p99: delta[i99.min(delta.len() - 1)] / q,
        p999: delta[i999.min(delta.len() - 1)] / q,
    })
}

/// The samples `-U` and `-H` print before a latency row (`print_report_lat`):
/// with `unsorted` every gap between posts in order, with `histogram` the gaps
/// sorted without the two largest; each list under `#, <units>`, one
/// `<n>, <gap / q>` line a sample, as C's `"%d, %g"`.
pub fn lat_samples(posted: &[f64], q: f64, unsorted: bool, histogram: bool, units: &str) -> String {
    let mut delta: Vec<f64> = posted.windows(2).map(|w| w[1] - w[0]).collect();
    let mut out = String::new();
    let mut list = |delta: &[f64]| {
        out.push_str(&format!("#, {units}\n"));
        for (i, d) in delta.iter().enumerate() {
            out.push_str(&format!("{}, {}\n", i + 1, fmt_g(d / q)));
        }
    };
    if unsorted {
        list(&delta);
    }
    if histogram && delta.len() >= 2 {
        delta.sort_by(|a, b| a.total_cmp(b));
        list(&delta[..delta.len() - 2]);
    }
    out
}

/// A number as C's `%g`: six significant digits, trailing zeros dropped, in
/// exponent form below 1e-4 or from 1e6.
pub fn fmt_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else {
            format!("{v}")
        };
    }
    let exp = v.abs().log10().floor() as i32;
    // Rounding to six digits may carry into the next power of ten.
    let rounded: f64 = format!("{v:.5e}").parse().unwrap_or(v);
    let exp = if rounded.abs() >= 10f64.powi(exp + 1) {
        exp + 1
    } else {
        exp
    };
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if !(-4..6).contains(&exp) {
        let m = format!("{:.5e}", v);
        let (mant, e) = m.split_once('e').unwrap_or((&m, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        let sign = if e < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim(mant.to_string()), e.abs());
    }
    let decimals = (5 - exp).max(0) as usize;
    trim(format!("{v:.decimals$}"))
}

/// One latency row, as `REPORT_FMT_LAT`.
pub fn lat_row(size: u64, iters: u64, s: &LatStats) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        size, iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

/// Bandwidth figures from post and completion times in nanoseconds (`posted[i]` set
/// at each post call, `completed[j]` at each counted completion), as
/// `print_report_bw`: average over the whole run, peak over the best window.
pub fn bw_report(
    size: u64,
    posted: &[f64],
    completed: &[f64],
    cq_mod: usize,
    post_list: usize,
    no_peak: bool,
    gbits: bool,
) -> BwReport {
    let n = completed.len();
    let factor = if gbits { 125e6 } else { 1048576.0 };
    if n == 0 {
        return BwReport::default();
    }
    let total_ns = (completed[n - 1] - posted[0]).max(1.0);
    let secs = total_ns / 1e9;
    let mut peak = 0.0;
    if !no_peak {
        let mut opt = total_ns;
        let cq_mod = cq_mod.max(1);
        let mut i = 0;
        while i < n {
            let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
            while j < n {
                let t = (completed[j] - posted[i]) / (j - i + 1) as f64;
                if t < opt && t > 0.0 {
                    opt = t;
                }
                j += cq_mod;
            }
            if n % cq_mod != 0 {
                let j = n - 1;
                let t = (completed[j] - posted[i]) / (j - i + 1) as f64;
                if t < opt && t > 0.0 {
                    opt = t;
                }
            }
            i += post_list.max(1);
        }
        peak = size as f64 * 1e9 / (opt * factor);
    }
    BwReport {
        size,
        iters: n as u64,
        bw_peak: peak,
        bw_avg: size as f64 * n as f64 / (secs * factor),
        msg_rate: n as f64 / secs / 1e6,
    }
}

/// The test description block (`ctx_print_test_info`).
pub fn test_info(
    p: &Params,
    dev: &str,
    mtu_bytes: u32,
    ethernet: bool,
    gid_index: Option<u32>,
) -> String {
    let mut s = String::new();
    s.push_str(RESULT_LINE);
    s.push('\n');
    s.push_str("                    ");
    s.push_str(p.verb.name());
    s.push(' ');
    if p.kind == TestKind::Bw {
        if p.duplex {
            s.push_str("Bidirectional ");
        }
        if p.post_list > 1 {
            s.push_str("Post List ");
        }
        s.push_str("BW ");
    } else {
        s.push_str("Latency ");
    }
    s.push_str("Test\n");
    if p.args.events {
        s.push_str(&format!(" Test with events. Using {dev}_comp0\n"));
    }
    s.push_str(&format!(
        " Dual-port       : OFF\t\tDevice         : {dev}\n"
    ));
    s.push_str(&format!(
        " Number of qps   : {}\t\tTransport type : IB\n",
        p.num_qps
    ));
    s.push_str(" Connection type : RC\t\tUsing SRQ      : OFF\n");
    let relaxed = if p.relaxed_ordering() { "ON" } else { "OFF" };
    s.push_str(&format!(" PCIe relax order: {relaxed}\n"));
    // The port posts with ibv_post_send, as perftest does on every device but
    // ConnectX-4 and later, BlueField and EFA (where it prints ON).
    s.push_str(" ibv_wr* API     : OFF\n");
    if p.is_client || p.duplex {
        s.push_str(&format!(" TX depth        : {}\n", p.tx_depth));
    }
    if p.post_list > 1 {
        s.push_str(&format!(" Post List       : {}\n", p.post_list));
    }
    if p.verb == Verb::Send && (!p.is_client || p.duplex) {
        s.push_str(&format!(" RX depth        : {}\n", p.rx_depth));
    }
    if p.kind == TestKind::Bw {
        s.push_str(&format!(" CQ Moderation   : {}\n", p.cq_mod));
    }
    s.push_str(&format!(" Mtu             : {mtu_bytes}[B]\n"));
    s.push_str(&format!(
        " Link type       : {}\n",
        if ethernet { "Ethernet" } else { "IB" }
    ));
    if let Some(g) = gid_index {
        s.push_str(&format!(" GID index       : {g}\n"));
    }
    let on_off = if p.args.rdma_cm { "ON" } else { "OFF" };
    s.push_str(&format!(" rdma_cm QPs\t : {on_off}\n"));
    let method = if p.rdma_cm_link() {
        "rdma_cm"
    } else {
        "Ethernet"
    };
    s.push_str(&format!(" Data ex. method : {method}\n"));
    if p.args.rdma_cm && !p.is_client {
        s.push_str(RESULT_LINE);
        s.push('\n');
        s.push_str(" Waiting for client rdma_cm QP to connect\n");
        s.push_str(" Please run the same command with the IB/RoCE interface IP\n");
    }
    s.push_str(RESULT_LINE);
    s
}

/// The "Max inline data" / "Outstand reads" line belongs between GID index and
/// rdma_cm; `test_info` leaves it out, this returns it.
pub fn inline_or_reads_line(p: &Params, out_reads: u32) -> String {
    if p.verb == Verb::Read {
        format!(" Outstand reads  : {out_reads}")
    } else {
        format!(" Max inline data : {}[B]", p.inline_size)
    }
}

/// C's `%#0Nx`: `0x` and zero padding to N characters, but a bare zero for 0.
pub fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{:#0width$x}", v)
    }
}

/// A QP's address lines (`ctx_print_pingpong_data`).
pub fn address_lines(side: &str, key: &KeyData, verb: Verb) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_alt_hex(key.lid as u64, 4),
        c_alt_hex(key.qpn as u64, 6),
        c_alt_hex(key.psn as u64, 6)
    );
    if verb == Verb::Read {
        s.push_str(&format!(" OUT {}", c_alt_hex(key.out_reads as u64, 4)));
    }
    if verb != Verb::Send {
        s.push_str(&format!(
            " RKey {} VAddr {}",
            c_alt_hex(key.rkey as u64, 8),
            c_alt_hex(key.vaddr, 16)
        ));
    }
    if let Some(gid) = key.gid {
        s.push_str("\n GID: ");
        let parts: Vec<String> = gid.iter().map(|b| format!("{b:02}")).collect();
        s.push_str(&parts.join(":"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C's own `%g` of `v`.
    fn c_g(v: f64) -> String {
        let mut buf = [0u8; 64];
        // SAFETY: the buffer is 64 bytes and snprintf writes at most that many,
        // NUL included; the format takes one double.
        let n = unsafe { libc::snprintf(buf.as_mut_ptr().cast(), buf.len(), c"%g".as_ptr(), v) };
        String::from_utf8_lossy(&buf[..n as usize]).into_owned()
    }

    #[test]
    fn fmt_g_is_cs_percent_g() {
        let mut values = vec![
            0.0,
            1.0,
            0.5,
            100.0,
            12.3456789,
            999999.4,
            999999.5,
            1234567.0,
            0.0001,
            0.00012345678,
            0.000099999,
            45000.5,
            7.25,
            123456.0,
            1e-7,
            2.5e12,
            9.999995,
        ];
        // And a spread of gaps as latency runs print them.
        let mut x = 0.37_f64;
        for _ in 0..2000 {
            x = (x * 7919.0 + 0.123).fract();
            values.push(x * 10f64.powi((x * 14.0) as i32 - 5));
        }
        for v in values {
            assert_eq!(fmt_g(v), c_g(v), "{v:e}");
        }
    }

    #[test]
    fn latency_samples_follow_print_report_lat() {
        let posted = [0.0, 10_000.0, 40_000.0, 60_000.0, 100_000.0];
        let q = 2000.0; // ns -> us, a round trip's half
        assert_eq!(
            lat_samples(&posted, q, true, false, "usec"),
            "#, usec\n1, 5\n2, 15\n3, 10\n4, 20\n"
        );
        // Sorted, without the two largest (LAT_MEASURE_TAIL).
        assert_eq!(
            lat_samples(&posted, q, false, true, "usec"),
            "#, usec\n1, 5\n2, 10\n"
        );
        let both = lat_samples(&posted, 1.0, true, true, "cycles");
        assert!(
            both.starts_with("#, cycles\n1, 10000\n2, 30000\n"),
            "{both}"
        );
        assert!(both.ends_with("#, cycles\n1, 10000\n2, 20000\n"), "{both}");
        assert_eq!(lat_samples(&posted, q, false, false, "usec"), "");
    }

    #[test]
    fn rows_match_perftest() {
        let r = BwReport {
            size: 65536,
            iters: 200,
            bw_peak: 58.85,
            bw_avg: 55.4,
            msg_rate: 0.000886,
        };
        assert_eq!(
            bw_row(&r, false),
            " 65536      200              58.85              55.40  \t\t   0.000886"
        );
        let s = LatStats {
            min: 10.72,
            max: 155.75,
            typical: 11.26,
            avg: 13.48,
            stdev: 9.72,
            p99: 102.48,
            p999: 155.75,
        };
        assert_eq!(
            lat_row(2, 200, &s),
            " 2       200          10.72          155.75       11.26    \t       13.48       \t9.72   \t\t102.48  \t\t155.75 "
        );
    }

    #[test]
    fn relaxed_ordering_line_follows_perftest() {
        use super::super::params::Args;
        use clap::Parser;
        let info = |verb, kind| {
            let args = Args::try_parse_from(["t"]).unwrap();
            test_info(
                &Params::new(verb, kind, args).unwrap(),
                "rxe0",
                1024,
                true,
                None,
            )
        };
        let write_lat = info(Verb::Write, TestKind::Lat);
        assert!(
            write_lat.contains(" PCIe relax order: OFF\n"),
            "{write_lat}"
        );
        let read_bw = info(Verb::Read, TestKind::Bw);
        assert!(read_bw.contains(" PCIe relax order: ON\n"), "{read_bw}");
    }

    #[test]
    fn bidirectional_rows_and_info_follow_perftest() {
        use super::super::params::Args;
        use clap::Parser;
        let mine = BwReport {
            size: 65536,
            iters: 200,
            bw_peak: 30.5,
            bw_avg: 20.25,
            msg_rate: 0.000324,
        };
        let rem = BwReport {
            size: 65536,
            iters: 190,
            bw_peak: 29.5,
            bw_avg: 19.75,
            msg_rate: 0.000316,
        };
        // print_full_bw_report: the figures summed, this side's size and iterations.
        assert_eq!(
            bw_duplex_row(&mine, &rem, false),
            " 65536      200              60.00              40.00  \t\t   0.000640"
        );
        // The six-decimal form goes by this side's own average, as C decides it.
        let tiny = BwReport {
            bw_avg: 0.06,
            ..mine
        };
        let big = BwReport {
            bw_avg: 0.06,
            ..rem
        };
        assert!(bw_duplex_row(&tiny, &big, true).contains("0.120000"));
        assert_eq!(figure(40.0), "40.000000");
        assert_eq!(figure(0.000640), "0.000640");
        let args = |v: &[&str]| {
            Args::try_parse_from(std::iter::once("t").chain(v.iter().copied())).unwrap()
        };
        let server = Params::new(Verb::Send, TestKind::Bw, args(&["-b"])).unwrap();
        let info = test_info(&server, "rxe0", 1024, true, Some(1));
        assert!(info.contains("  Send Bidirectional BW Test\n"), "{info}");
        assert!(info.contains(" TX depth        : 128\n"), "{info}");
        assert!(info.contains(" RX depth        : 512\n"), "{info}");
        let client = Params::new(Verb::Send, TestKind::Bw, args(&["-b", "-l", "2", "h"])).unwrap();
        let info = test_info(&client, "rxe0", 1024, true, Some(1));
        assert!(
            info.contains("  Send Bidirectional Post List BW Test\n"),
            "{info}"
        );
        assert!(info.contains(" RX depth        : 512\n"), "{info}");
        let one_way = Params::new(Verb::Write, TestKind::Bw, args(&[])).unwrap();
        let info = test_info(&one_way, "rxe0", 1024, true, Some(1));
        assert!(!info.contains("TX depth") && !info.contains("Bidirectional"));
    }

    #[test]
    fn rdma_cm_info_lines() {
        use super::super::params::Args;
        use clap::Parser;
        let args = |v: &[&str]| {
            Args::try_parse_from(std::iter::once("t").chain(v.iter().copied())).unwrap()
        };
        let server = Params::new(Verb::Write, TestKind::Bw, args(&["-R"])).unwrap();
        let info = test_info(&server, "rxe0", 1024, true, Some(1));
        assert!(info.contains(" rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n"));
        assert!(info.ends_with(&format!(
            "{RESULT_LINE}\n Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n{RESULT_LINE}"
        )));
        let client = Params::new(Verb::Write, TestKind::Bw, args(&["-R", "h"])).unwrap();
        let info = test_info(&client, "rxe0", 1024, true, Some(1));
        assert!(info.ends_with(&format!(" Data ex. method : rdma_cm\n{RESULT_LINE}")));
        let z = Params::new(Verb::Write, TestKind::Bw, args(&["-z"])).unwrap();
        let info = test_info(&z, "rxe0", 1024, true, Some(1));
        assert!(info.ends_with(&format!(
            " rdma_cm QPs\t : OFF\n Data ex. method : rdma_cm\n{RESULT_LINE}"
        )));
        let tcp = Params::new(Verb::Write, TestKind::Bw, args(&[])).unwrap();
        let info = test_info(&tcp, "rxe0", 1024, true, Some(1));
        assert!(info.contains(" rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n"));
    }

    #[test]
    fn duration_rows_match_perftest() {
        // ib_send_lat -D 2 of perftest 6.06 in the guest.
        assert_eq!(
            lat_dur_row(2, 362, 2766.77, 180.72),
            " 2             362            2766.77        180.72 "
        );
        assert_eq!(lat_header(true), LAT_DUR_HEADER);
    }

    #[test]
    fn addresses_match_perftest() {
        let mut gid = [0u8; 16];
        gid[10] = 255;
        gid[11] = 255;
        gid[12] = 198;
        gid[13] = 18;
        gid[15] = 1;
        let k = KeyData {
            lid: 0,
            out_reads: 1,
            qpn: 0x12,
            psn: 0x38c7,
            rkey: 0x227,
            vaddr: 0x55829c734000,
            gid: Some(gid),
            srqn: 0,
        };
        assert_eq!(
            address_lines("local", &k, Verb::Write),
            " local address: LID 0000 QPN 0x0012 PSN 0x38c7 RKey 0x000227 VAddr 0x0055829c734000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:01"
        );
    }

    #[test]
    fn bandwidth_and_latency_math() {
        // 10 messages of 1 MiB, one every ms: 1000 MiB/s average and peak.
        let posted: Vec<f64> = (0..10).map(|i| i as f64 * 1e6).collect();
        let completed: Vec<f64> = (0..10).map(|i| (i + 1) as f64 * 1e6).collect();
        let r = bw_report(1 << 20, &posted, &completed, 1, 1, false, false);
        assert!((r.bw_avg - 1000.0).abs() < 1e-6);
        assert!((r.bw_peak - 1000.0).abs() < 1e-6);
        assert!((r.msg_rate - 0.001).abs() < 1e-9);
        // Posts 10 us apart, halved for the round trip: 5 us each.
        let posted: Vec<f64> = (0..100).map(|i| i as f64 * 10_000.0).collect();
        let s = lat_stats(&posted, 2.0).unwrap();
        assert_eq!(
            (s.min, s.max, s.typical, s.avg, s.stdev),
            (5.0, 5.0, 5.0, 5.0, 0.0)
        );
        // In whole cycles (-C) the median of an even count drops the half, as C's
        // integer average: gaps 10..15, the two largest dropped, (11 + 12) / 2.
        let cycles = [0.0, 10.0, 21.0, 33.0, 46.0, 60.0, 75.0];
        assert_eq!(lat_stats_per(&cycles, 1.0).unwrap().typical, 11.0);
    }
}
