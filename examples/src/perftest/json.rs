//! perftest's `--out_json` file (`--out_json_file`, default `perftest_out.json`
//! in the working directory): the test's description and the result last
//! printed, rewritten with every result row as perftest rewrites it. The format
//! is perftest's own, not JSON: keys are bare and every line ends in a comma.
//! Scripts that read perftest's file read the port's the same way.

use super::params::{Output, Params, TestKind, Verb};
use super::protocol::BwReport;
use super::report::LatStats;

/// perftest's `DEFAULT_JSON_FILE_NAME`.
pub const DEFAULT_FILE: &str = "perftest_out.json";

/// Where the file goes and the test's description in it, settled once the
/// device is open.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonOut {
    path: String,
    info: String,
}

/// What the description says about the device and the link.
#[derive(Clone, Copy, Debug)]
pub struct Link<'a> {
    /// The device's name.
    pub dev: &'a str,
    /// The path MTU in bytes.
    pub mtu_bytes: u32,
    /// RoCE (Ethernet) rather than InfiniBand.
    pub ethernet: bool,
    /// The GID index, when one is used.
    pub gid_index: Option<u32>,
    /// RDMA READs in flight (READ tests).
    pub out_reads: u32,
}

impl JsonOut {
    /// The file of a run with `p` on `link`, or `None` without `--out_json`.
    pub fn new(p: &Params, link: &Link<'_>) -> Option<JsonOut> {
        p.args.out_json.then(|| JsonOut {
            path: p.args.out_json_file.clone(),
            info: test_info(p, link),
        })
    }

    /// Writes the file anew with `results` (perftest's `open_file_write`: made
    /// or truncated, readable and writable by the owner alone). A file that
    /// cannot be opened is reported as perftest reports it, and the run goes on;
    /// a failed write, which perftest does not check, is said too.
    pub fn write(&self, results: &str) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&self.path);
        let mut file = match file {
            Ok(f) => f,
            Err(_) => return eprintln!("failed to open {}", self.path),
        };
        if let Err(e) = write!(file, "{{\n{}{results}}}\n", self.info) {
            eprintln!("failed to write {}: {e}", self.path);
        }
    }
}

/// The description (`write_test_info_to_file`), for the tests and options the
/// port takes.
fn test_info(p: &Params, link: &Link<'_>) -> String {
    let on_off = |on: bool| if on { "ON" } else { "OFF" };
    let mut s = String::from("test_info: {\n");
    s += &format!("test: {}_", p.verb.name());
    if p.kind == TestKind::Bw {
        if p.duplex {
            s += "Bidirectional_";
        }
        if p.post_list > 1 {
            s += "Post_List_";
        }
        s += "BW_";
    } else {
        s += "Latency_";
    }
    s += "Test,\n";
    if p.args.events {
        s += &format!("Test with events: Using_{}_comp0,\n", link.dev);
    }
    s += &format!("Dual_port: OFF,\nDevice: \"{}\",\n", link.dev);
    s += &format!("Number_of_qps: {},\nTransport_type: IB,\n", p.num_qps);
    s += "Connection_type: RC,\nUsing_SRQ: OFF,\n";
    s += &format!("PCIe_relax_order: {},\n", on_off(p.relaxed_ordering()));
    s += "ibv_wr_API: OFF,\n";
    if p.is_client || p.duplex {
        s += &format!("TX_depth : {},\n", p.tx_depth);
    }
    if p.post_list > 1 {
        s += &format!("Post_List: {},\n", p.post_list);
    }
    if p.verb == Verb::Send && (!p.is_client || p.duplex) {
        s += &format!("RX_depth: {},\n", p.rx_depth);
    }
    if p.kind == TestKind::Bw {
        s += &format!("CQ_Moderation: {},\n", p.cq_mod);
    }
    s += &format!("Mtu: {},\n", link.mtu_bytes);
    let link_type = if link.ethernet { "Ethernet" } else { "IB" };
    s += &format!("Link_type: {link_type},\n");
    if let Some(g) = link.gid_index {
        s += &format!("GID_index: {g},\n");
    }
    if p.verb == Verb::Read {
        s += &format!("Outstand_reads: {},\n", link.out_reads);
    } else {
        s += &format!("Max_inline_data: {},\n", p.inline_size);
    }
    s += &format!("rdma_cm_QPs: {},\n", on_off(p.args.rdma_cm));
    let method = if p.rdma_cm_link() {
        "rdma_cm"
    } else {
        "Ethernet"
    };
    s += &format!("Data_ex_method: {method},\n");
    s += "},\n";
    s
}

/// A bandwidth result (`write_bw_report_to_file`): `sum` as printed (both sides'
/// figures with `-b`), six decimals where the row prints them (`ext`).
pub fn bw_results(p: &Params, sum: &BwReport, ext: bool) -> String {
    let body = match p.output {
        Output::Bandwidth => format!("bw_avg: {:.6},\n", sum.bw_avg),
        Output::MessageRate => format!("msgRate_avg: {:.6},\n", sum.msg_rate),
        _ => {
            let d = if ext { 6 } else { 2 };
            format!(
                "MsgSize: {},\nn_iterations: {},\nBW_peak: {:.d$},\nBW_average: {:.d$},\nMsgRate: {:.6},\n",
                sum.size, sum.iters, sum.bw_peak, sum.bw_avg, sum.msg_rate
            )
        }
    };
    format!("results: {{\n{body}{}}},\n", cpu_line(p))
}

/// With `--cpu_util`, the line the results add (`REPORT_EXT_CPU_UTIL_JSON`).
fn cpu_line(p: &Params) -> String {
    if p.cpu_util {
        format!("CPU_util: {:.2},\n", super::cpu::utilization())
    } else {
        String::new()
    }
}

/// A latency result (`write_report_lat_to_file`).
pub fn lat_results(p: &Params, size: u64, iters: u64, s: &LatStats) -> String {
    let body = if p.output == Output::Latency {
        format!("avg_lat: {:.6},\n", s.avg)
    } else {
        format!(
            "MsgSize: {size},\nn_iterations: {iters},\nt_min: {:.2},\nt_max: {:.2},\n\
             t_typical: {:.2},\nt_avg: {:.2},\nt_stdev: {:.2},\npercentile_99: {:.2},\n\
             percentile_99.9: {:.2},\n{}",
            s.min,
            s.max,
            s.typical,
            s.avg,
            s.stdev,
            s.p99,
            s.p999,
            cpu_line(p)
        )
    };
    format!("results: {{\n{body}}},\n")
}

/// A latency result of a `-D` run (`write_report_lat_duration_to_file`; its
/// `--output` line ends without a comma, as perftest's does).
pub fn lat_dur_results(p: &Params, size: u64, iters: u64, t_avg: f64, tps: f64) -> String {
    let body = if p.output == Output::Latency {
        format!("t_avg: {t_avg:.6}\n")
    } else {
        format!(
            "MsgSize: {size},\nn_iterations: {iters},\nt_avg: {t_avg:.2},\ntps_average: {tps:.2},\n{}",
            cpu_line(p)
        )
    };
    format!("results: {{\n{body}}},\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn params(verb: Verb, kind: TestKind, v: &[&str]) -> Params {
        let args = super::super::params::Args::try_parse_from(
            std::iter::once("t").chain(v.iter().copied()),
        )
        .unwrap();
        Params::new(verb, kind, args).unwrap()
    }

    const LINK: Link<'static> = Link {
        dev: "rxe0",
        mtu_bytes: 1024,
        ethernet: true,
        gid_index: Some(1),
        out_reads: 16,
    };

    /// The whole file of a bidirectional WRITE client, line by line as
    /// perftest v4.5-0.17 writes it.
    #[test]
    fn a_bandwidth_file_is_perftests() {
        let p = params(Verb::Write, TestKind::Bw, &["--out_json", "-b", "h"]);
        let j = JsonOut::new(&p, &LINK).unwrap();
        let rep = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 0.0,
            bw_avg: 70.5,
            msg_rate: 0.001128,
        };
        let text = format!("{{\n{}{}}}\n", j.info, bw_results(&p, &rep, false));
        let want = "{\ntest_info: {\ntest: RDMA_Write_Bidirectional_BW_Test,\n\
            Dual_port: OFF,\nDevice: \"rxe0\",\nNumber_of_qps: 1,\nTransport_type: IB,\n\
            Connection_type: RC,\nUsing_SRQ: OFF,\nPCIe_relax_order: ON,\nibv_wr_API: OFF,\n\
            TX_depth : 128,\nCQ_Moderation: 1,\nMtu: 1024,\nLink_type: Ethernet,\n\
            GID_index: 1,\nMax_inline_data: 0,\nrdma_cm_QPs: OFF,\nData_ex_method: Ethernet,\n\
            },\nresults: {\nMsgSize: 65536,\nn_iterations: 5000,\nBW_peak: 0.00,\n\
            BW_average: 70.50,\nMsgRate: 0.001128,\n},\n}\n";
        assert_eq!(text, want);
        assert_eq!(j.path, DEFAULT_FILE);
    }

    #[test]
    fn latency_and_output_results_are_perftests() {
        let p = params(
            Verb::Read,
            TestKind::Lat,
            &["--out_json_file=x.json", "--out_json"],
        );
        let j = JsonOut::new(&p, &LINK).unwrap();
        assert_eq!(j.path, "x.json");
        assert!(j
            .info
            .starts_with("test_info: {\ntest: RDMA_Read_Latency_Test,\n"));
        assert!(
            j.info.contains("\nOutstand_reads: 16,\nrdma_cm_QPs"),
            "{}",
            j.info
        );
        assert!(
            !j.info.contains("TX_depth"),
            "a server has no TX depth line"
        );
        let s = LatStats {
            min: 1.0,
            max: 9.0,
            typical: 2.5,
            avg: 3.25,
            stdev: 0.5,
            p99: 8.0,
            p999: 9.0,
        };
        assert_eq!(
            lat_results(&p, 2, 1000, &s),
            "results: {\nMsgSize: 2,\nn_iterations: 1000,\nt_min: 1.00,\nt_max: 9.00,\n\
             t_typical: 2.50,\nt_avg: 3.25,\nt_stdev: 0.50,\npercentile_99: 8.00,\n\
             percentile_99.9: 9.00,\n},\n"
        );
        let out = params(Verb::Send, TestKind::Lat, &["--output=latency"]);
        assert_eq!(
            lat_results(&out, 2, 1000, &s),
            "results: {\navg_lat: 3.250000,\n},\n"
        );
        assert_eq!(
            lat_dur_results(&out, 2, 7, 1.5, 9.0),
            "results: {\nt_avg: 1.500000\n},\n"
        );
        let bw = params(Verb::Send, TestKind::Bw, &["--output=message_rate"]);
        let rep = BwReport {
            msg_rate: 0.25,
            ..BwReport::default()
        };
        assert_eq!(
            bw_results(&bw, &rep, false),
            "results: {\nmsgRate_avg: 0.250000,\n},\n"
        );
        assert!(
            JsonOut::new(&bw, &LINK).is_none(),
            "no file without --out_json"
        );
    }
}
