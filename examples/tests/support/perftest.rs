//! What the perftest interop tests share: the Rust port of each C tool, one
//! side's command line (the test's GID and port, then the options, then the
//! server's address for a client), and a pair run with the C tool on the other
//! side. Each test binary includes this module (`#[path]`) and uses part of it.

#![allow(dead_code)]

use examples::perftest::child::{run_pair, server_and_client, Outcome};
use std::time::Duration;

/// The Rust port of the C tool `tool`.
pub fn ours(tool: &str) -> &'static str {
    match tool {
        "ib_write_bw" => env!("CARGO_BIN_EXE_ib_write_bw"),
        "ib_read_bw" => env!("CARGO_BIN_EXE_ib_read_bw"),
        "ib_send_bw" => env!("CARGO_BIN_EXE_ib_send_bw"),
        "ib_write_lat" => env!("CARGO_BIN_EXE_ib_write_lat"),
        "ib_read_lat" => env!("CARGO_BIN_EXE_ib_read_lat"),
        "ib_send_lat" => env!("CARGO_BIN_EXE_ib_send_lat"),
        _ => panic!("no Rust port of {tool}"),
    }
}

/// The GID index the tests use: `RDMA_GID_INDEX`, else 1 (the guest's RoCE v2).
pub fn gid() -> String {
    std::env::var("RDMA_GID_INDEX").unwrap_or_else(|_| "1".into())
}

/// The server's address: `RDMA_IP`, else the guest's.
pub fn server_ip() -> String {
    std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

/// One side's command line: `-x GID -p PORT`, `extra`, and for a client the
/// server's address.
pub fn args(port: u16, extra: &[&str], client: bool) -> Vec<String> {
    let mut v: Vec<String> = vec!["-x".into(), gid(), "-p".into(), port.to_string()];
    v.extend(extra.iter().map(|s| s.to_string()));
    if client {
        v.push(server_ip());
    }
    v
}

/// Runs the C tool and its port as server and client with the same options
/// (the port is the client if `rust_is_client`), each given 120 s; returns
/// (server, client).
pub fn pair(tool: &str, rust_is_client: bool, port: u16, extra: &[&str]) -> (Outcome, Outcome) {
    let (srv, cli) = server_and_client(tool, ours(tool), rust_is_client);
    run_pair(
        (srv, args(port, extra, false)),
        (cli, args(port, extra, true)),
        port,
        Duration::from_secs(120),
    )
}
