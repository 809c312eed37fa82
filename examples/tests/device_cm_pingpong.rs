//! The `rdma_verbs.h` endpoint-API ports in the Soft-RoCE guest: Rust server with
//! Rust client over many rounds, and each against rdmacm-utils' C counterpart
//! (`rdma_server` / `rdma_client`, one 16-byte exchange).
//!
//! Run by `cargo xtask test`; they fail without a device.

use examples::cm::child::{port, run_client, spawn};
use std::time::Duration;

const SERVER: &str = env!("CARGO_BIN_EXE_rdma-pingpong-server");
const CLIENT: &str = env!("CARGO_BIN_EXE_rdma-pingpong-client");
const T: Duration = Duration::from_secs(90);
const STARTUP: Duration = Duration::from_secs(20);

fn ip() -> String {
    std::env::var("RDMA_IP").expect(
        "RDMA_IP is not set: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    )
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_server_rust_client_many_rounds() {
    let p = port(7800, 1).to_string();
    let server = spawn(SERVER, &[&p, "--timeout", "60"]);
    let client = run_client(
        CLIENT,
        &[&ip(), &p, "-n", "300", "-v", "--expect-pong"],
        T,
        STARTUP,
    );
    let server = server.wait(T);
    assert!(client.success(), "client:\n{client}\nserver:\n{server}");
    assert!(server.success(), "server:\n{server}");
    let replies = client.lines_after("reply ");
    assert_eq!(replies.len(), 300, "{client}");
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r, &format!("{i}: pong {i}"));
    }
    assert!(
        client
            .stdout
            .ends_with("rdma-pingpong-client: 300 rounds, end 0\n"),
        "{client}"
    );
    assert!(
        server
            .stdout
            .ends_with("rdma-pingpong-server: 300 rounds, end 0\n"),
        "{server}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_server_c_client() {
    let p = port(7800, 2).to_string();
    // rdma_server's own command line.
    let server = spawn(SERVER, &["-s", &ip(), "-p", &p, "-v", "--timeout", "60"]);
    let client = run_client("rdma_client", &["-s", &ip(), "-p", &p], T, STARTUP);
    let server = server.wait(T);
    assert!(client.success(), "client:\n{client}\nserver:\n{server}");
    assert!(client.stdout.contains("rdma_client: end 0"), "{client}");
    assert!(server.success(), "server:\n{server}");
    assert!(
        server
            .stdout
            .contains("rdma-pingpong-server: 1 rounds, end 0"),
        "{server}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn c_server_rust_client() {
    let p = port(7800, 3).to_string();
    let server = spawn("rdma_server", &["-s", &ip(), "-p", &p]);
    // rdma_client's command line, nothing more: one exchange, any 16-byte reply.
    let client = run_client(CLIENT, &["-s", &ip(), "-p", &p, "-v"], T, STARTUP);
    let server = server.wait(T);
    assert!(client.success(), "client:\n{client}\nserver:\n{server}");
    assert!(
        client
            .stdout
            .contains("rdma-pingpong-client: 1 rounds, end 0"),
        "{client}"
    );
    // The C server answers with its own 16 bytes (zeros): an empty string.
    assert_eq!(client.lines_after("reply 0: "), vec![""], "{client}");
    assert!(server.stdout.contains("rdma_server: end 0"), "{server}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn c_server_rust_client_default_port() {
    // Neither side given a port: both default to 7471, as the C pair does.
    let server = spawn("rdma_server", &["-s", &ip()]);
    let client = run_client(CLIENT, &["-s", &ip()], T, STARTUP);
    let server = server.wait(T);
    assert!(client.success(), "client:\n{client}\nserver:\n{server}");
    assert!(server.stdout.contains("rdma_server: end 0"), "{server}");
}
