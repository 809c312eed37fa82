//! The Rust `rdma-server` and `rdma-client` ("RDMA read and write with IB verbs")
//! against each other in the Soft-RoCE guest, in both modes: each side must print
//! the other's message as `remote buffer: ...`, and the expected lines in order.
//!
//! Run by `cargo xtask test`; they fail without a device.

use examples::cm::child::{port, run_client, spawn};
use std::time::Duration;

const SERVER: &str = env!("CARGO_BIN_EXE_rdma-server");
const CLIENT: &str = env!("CARGO_BIN_EXE_rdma-client");
const T: Duration = Duration::from_secs(60);

fn ip() -> String {
    std::env::var("RDMA_IP").expect(
        "RDMA_IP is not set: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    )
}

fn exchange(mode: &str, slot: u16) {
    let p = port(7700, slot).to_string();
    let mut server = spawn(SERVER, &[mode, &p]);
    let server_pid = server.id();
    let client = run_client(CLIENT, &[mode, &ip(), &p], T, Duration::from_secs(20));
    // Let the server print its last line, then stop it (it serves forever). The
    // line is checked below, with everything the server printed.
    server.wait_for_stdout("peer disconnected.", T);
    let server = server.kill();
    assert!(client.success(), "client:\n{client}\nserver:\n{server}");
    let announce = if mode == "read" {
        "received MSG_MR. reading message from remote memory..."
    } else {
        "received MSG_MR. writing message to remote memory..."
    };
    let lines: Vec<&str> = client.stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"address resolved."), "{client}");
    assert_eq!(lines.get(1), Some(&"route resolved."), "{client}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| **l == "send completed successfully.")
            .count(),
        3,
        "MR, the RDMA operation and DONE:\n{client}"
    );
    assert!(lines.contains(&announce), "{client}");
    let want = format!("remote buffer: message from passive/server side with pid {server_pid}");
    assert!(
        lines.contains(&want.as_str()),
        "{client}\nserver:\n{server}"
    );
    assert_eq!(lines.last(), Some(&"disconnected."), "{client}");

    let slines: Vec<&str> = server.stdout.lines().collect();
    assert_eq!(
        slines.first().copied(),
        Some(format!("listening on port {p}.").as_str()),
        "{server}"
    );
    assert!(slines.contains(&"received connection request."), "{server}");
    assert!(slines.contains(&announce), "{server}");
    assert!(
        slines
            .iter()
            .any(|l| l.starts_with("remote buffer: message from active/client side with pid ")),
        "{server}"
    );
    assert_eq!(slines.last(), Some(&"peer disconnected."), "{server}");
    assert!(!server.stderr.contains("panicked") && !client.stderr.contains("panicked"));
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_mode() {
    exchange("read", 1);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn write_mode() {
    exchange("write", 2);
}
