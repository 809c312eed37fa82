//! Two hosts, one wire: the KIARA echo server on host b, concurrent clients (one
//! session each) on host a, every echo checked by the client (bytes and checksum):
//! - four clients, messages of 64 B, 4 KiB (eager), 64 KiB and 1 MiB (read by the
//!   peer with RDMA READ through a window bound for the message);
//! - two clients of 64 KiB messages while netem loses 2% of the packets in both
//!   directions: every read message needs RC retransmission, which used to fail
//!   the queue pair on Soft-RoCE (`kiara-ib/src/sq_gate.rs`).
//!
//! Run by `cargo xtask test` on its two guests (`docs/two-hosts.md`); it fails
//! anywhere else.

use examples::perftest::child::listening;
use examples::twohost::fault::{Counters, Netem};
use examples::twohost::{side, Case, Role};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(300);
const SERVER: &str = env!("CARGO_BIN_EXE_kiara-echo-server");
const CLIENT: &str = env!("CARGO_BIN_EXE_kiara-echo-client");

/// Runs the echo server (host b) or `clients` clients sending `messages`
/// messages of each of `sizes` (host a), and checks every echo arrived intact and
/// the server served to the end.
fn echo(case: &Case, port: u16, sizes: &[usize], clients: usize, messages: usize) {
    let ip = case.server_ip();
    let p = port.to_string();
    match case.role() {
        Role::Server => {
            // It serves until killed: side::server ends it once the client left.
            let out = side::server(case, SERVER, &["-a", &ip, "-p", &p], || listening(port), T);
            assert!(
                out.stdout.starts_with("kiara-echo-server: listening on "),
                "{out}"
            );
            let killed = out.status.and_then(|s| s.signal()) == Some(libc::SIGKILL);
            assert!(
                killed,
                "the server ended by itself, not killed after its client:\n{out}"
            );
            assert!(!out.stderr.contains("panicked"), "{out}");
            for line in out.stderr.lines() {
                assert!(!line.contains("reply to session"), "a reply failed:\n{out}");
                // A client leaving closes its session; any other reason is a failure.
                let failed =
                    line.contains("closed:") && !line.contains("the peer closed the connection");
                assert!(!failed, "a session failed:\n{out}");
            }
        }
        Role::Client => {
            let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
            let list = list.join(",");
            let (c, n) = (clients.to_string(), messages.to_string());
            let args = [ip.as_str(), "-p", &p, "-c", &c, "-n", &n, "-s", &list];
            let out = side::client(case, CLIENT, &args, T);
            assert!(out.success(), "client:\n{out}");
            assert!(
                out.stdout
                    .ends_with("kiara-echo-client: every echo verified\n"),
                "{out}"
            );
            let rows: Vec<Vec<String>> = out
                .stdout
                .lines()
                .skip(1)
                .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
                .map(|l| l.split_whitespace().map(str::to_string).collect())
                .collect();
            let got: Vec<(String, String)> =
                rows.iter().map(|r| (r[0].clone(), r[1].clone())).collect();
            let want: Vec<(String, String)> = sizes
                .iter()
                .map(|s| (s.to_string(), (clients * messages).to_string()))
                .collect();
            assert_eq!(got, want, "one row per size, every message echoed:\n{out}");
        }
    }
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn echo_four_clients_every_reply_verified() {
    let case = Case::start("echo_four_clients_every_reply_verified");
    echo(&case, 19701, &[64, 4096, 65536, 1 << 20], 4, 10);
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn echo_read_messages_under_2_percent_loss() {
    let case = Case::start("echo_read_messages_under_2_percent_loss");
    let netem = Netem::apply("loss 2%");
    case.publish("netem", "");
    case.wait_for("netem", T);
    let before = Counters::read();
    echo(&case, 19702, &[65536], 2, 20);
    drop(netem);
    let grown = Counters::read().since(&before);
    // The loss was there and RC repaired it: this host retransmitted or saw
    // requests out of sequence.
    let repaired = grown.get("completer_retry_err")
        + grown.get("rcvd_seq_err")
        + grown.get("out_of_seq_request")
        + grown.get("duplicate_request");
    assert!(
        repaired > 0,
        "no retransmission counted: {}",
        grown.summary()
    );
    if case.role() == Role::Client {
        case.publish(
            "measured",
            &format!(
                "netem loss 2% both ways: 2 clients x 20 echoes of 64 KiB verified; a: {}",
                grown.summary()
            ),
        );
    }
}
