//! perftest-compatible tools: `ib_write_bw`, `ib_read_bw`, `ib_send_bw`,
//! `ib_write_lat`, `ib_read_lat`, `ib_send_lat`.
//!
//! [`protocol`] is the wire format as pure code (version, system data, MTU, key
//! strings, results), [`connect`] the exchanges (over TCP, or with `-R`/`-z` over the
//! RDMA CM link of [`rdma_cm`], which also connects `-R`'s queue pairs), [`params`]
//! the command line, [`inline`] how much is sent inline on which device, [`report`] the output formats and arithmetic, [`run`] the
//! program the six binaries share, and [`child`] helps the interop tests run peers
//! with timeouts.

pub mod child;
pub mod connect;
pub mod inline;
pub mod legacy;
pub mod params;
pub mod protocol;
pub mod rdma_cm;
pub mod report;
pub mod run;

pub use params::{TestKind, Verb};
pub use run::main;
