//! `simple-rdma`: the server RDMA-WRITEs `Saluton Teewurst. UiUi` into the client's
//! buffer; the client prints exactly that text (read back from its own memory).

use examples::perftest::child::run_pair;
use std::time::Duration;

fn args(port: u16, client: bool) -> Vec<String> {
    let mut v = vec!["-p".to_string(), port.to_string()];
    if let Ok(g) = std::env::var("RDMA_GID_INDEX") {
        v.extend(["-g".to_string(), g]);
    }
    if client {
        v.push(std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into()));
    }
    v
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn client_prints_what_the_server_wrote() {
    let ours = env!("CARGO_BIN_EXE_simple-rdma");
    let port = 19301;
    let (s, c) = run_pair(
        (ours, args(port, false)),
        (ours, args(port, true)),
        port,
        Duration::from_secs(60),
    );
    assert!(s.ok(), "server failed:\n{s}");
    assert!(c.ok(), "client failed:\n{c}");
    assert!(
        c.stdout.lines().any(|l| l == "Saluton Teewurst. UiUi"),
        "client did not print the text:\n{c}"
    );
    assert!(s.stdout.contains("wrote 22 bytes"), "{s}");
    for o in [&s, &c] {
        assert!(
            o.stdout.contains("local  address: LID") && o.stdout.contains("remote address: LID"),
            "{o}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn garbage_address_is_an_error() {
    use std::io::Write;
    let port = 19302;
    let srv = examples::perftest::child::spawn_listening(
        env!("CARGO_BIN_EXE_simple-rdma"),
        &args(port, false),
        port,
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&[b'#'; 45]).unwrap();
    let o = srv.wait(Duration::from_secs(20));
    assert!(o.status.is_some(), "server hung\n{o}");
    assert!(!o.ok() && o.stderr.contains("malformed"), "{o}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn non_ascii_gid_is_an_error_not_a_panic() {
    // The 78-byte form with a two-byte character where the GID's first hex pair starts.
    let mut msg =
        b"0000:000011:abcdef:00000abc:00007f0000001000:00000000000000000000ffffc6120001\0".to_vec();
    msg[45] = b'0';
    msg[46..48].copy_from_slice("é".as_bytes());
    let port = 19303;
    let o = examples::perftest::child::feed_server(
        env!("CARGO_BIN_EXE_simple-rdma"),
        &args(port, false),
        port,
        &msg,
        Duration::from_secs(20),
    );
    assert!(o.status.is_some(), "server hung\n{o}");
    assert!(!o.stderr.contains("panicked"), "{o}");
    assert!(!o.ok() && o.stderr.contains("GID byte 0"), "{o}");
}
