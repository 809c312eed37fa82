//! perftest-compatible tools: `ib_write_bw`, `ib_read_bw`, `ib_send_bw`,
//! `ib_write_lat`, `ib_read_lat`, `ib_send_lat`.
//!
//! [`protocol`] is the wire format as pure code (version, system data, MTU, key
//! strings, results), [`connect`] the exchanges (over TCP, or with `-R`/`-z` over the
//! RDMA CM link of [`rdma_cm`], which also connects `-R`'s queue pairs), [`params`]
//! the command line, [`inline`] how much is sent inline on which device, [`report`]
//! the output formats and arithmetic, [`json`] the `--out_json` file, [`run`] the program the six binaries share,
//! and [`child`] helps the interop tests run peers with timeouts.
//!
//! # The command line
//! perftest's own letters and long names (`--help` lists them), for RC:
//! `-d -i -x -s -n -a -q -t -Q -l -o -D -p -m -R -z -c -r -u -S -N -F -I -V`,
//! `-b` (bidirectional, with `--report-both`), `-e` (completion events), `-C -H
//! -U` (latency in cycles, the samples sorted and unsorted; `-H`'s long name is
//! C's `--report-histogrm`), `--output=bandwidth|message_rate|latency`,
//! `--report_gbits`, `--disable_pcie_relaxed`, `--use_old_post_send`,
//! `--run_infinitely` (bandwidth tests: a row every `-D` seconds until killed),
//! `--out_json`/`--out_json_file` ([`json`]) and `--cpu_util` ([`cpu`]).
//! The ports always post with `ibv_post_send`, as perftest does on devices it
//! does not list for the `ibv_wr_*` interface (Soft-RoCE among them), and send
//! inline as its `ctx_set_max_inline` decides ([`inline`]). Not taken: UC, UD,
//! XRC, DC, SRQ, multicast, atomics, rate limits, dual port and the raw Ethernet
//! tools.

pub mod child;
pub mod connect;
pub mod cpu;
pub mod inline;
pub mod json;
pub mod legacy;
pub mod params;
pub mod protocol;
pub mod rdma_cm;
pub mod report;
pub mod run;

pub use params::{TestKind, Verb};
pub use run::main;
