//! Two hosts, one wire: the KIARA echo server on host b, concurrent clients (one
//! session each) on host a, every echo checked by the client (bytes and checksum):
//! - four clients, messages of 64 B, 4 KiB (eager), 64 KiB and 1 MiB (read by the
//!   peer with RDMA READ through a window bound for the message);
//! - two clients of 64 KiB messages while netem loses 2% of the packets in both
//!   directions: every read message needs RC retransmission, which used to fail
//!   the queue pair on Soft-RoCE (`kiara-ib/src/sq_gate.rs`);
//! - a client host cut off (its link down) in the middle of 64 KiB echoes, for
//!   longer than the server's acknowledgement timeout: the server closes that
//!   session naming the cause, releases its buffers and serves a client of its
//!   own host with the same size (so the released buffers are used again), every
//!   echo verified; when the link is back, the cut-off client fails with a named
//!   cause and never receives a byte that is not its own echo.
//!
//! Run by `cargo xtask test` on its two guests (`docs/two-hosts.md`); it fails
//! anywhere else.

use examples::cm::child::spawn;
use examples::perftest::child::listening;
use examples::twohost::fault::{link_down_until, recreate_rxe, what_rxe_saw, Counters, Netem};
use examples::twohost::{side, within, Case, Role};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(300);
const SERVER: &str = env!("CARGO_BIN_EXE_kiara-echo-server");
const CLIENT: &str = env!("CARGO_BIN_EXE_kiara-echo-client");

/// Runs the echo server (host b) or `clients` clients sending `messages`
/// messages of each of `sizes` (host a), and checks every echo arrived intact and
/// the server served to the end.
fn echo(case: &Case, port: u16, sizes: &[usize], clients: usize, messages: usize) {
    echo_with(case, port, sizes, clients, messages, &[]);
}

/// [`echo`], both programs given `extra` options too.
fn echo_with(
    case: &Case,
    port: u16,
    sizes: &[usize],
    clients: usize,
    messages: usize,
    extra: &[&str],
) {
    let ip = case.server_ip();
    let p = port.to_string();
    // A failure names what rxe saw on this host (a queue pair that went to the
    // error state without a completion saying why, say a responder's key check).
    let before = Counters::read();
    match case.role() {
        Role::Server => {
            // It serves until killed: side::server ends it once the client left.
            let args = [&["-a", ip.as_str(), "-p", &p][..], extra].concat();
            let out = side::server(case, SERVER, &args, || listening(port), T);
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
                assert!(
                    !failed,
                    "a session failed:\n{out}\n{}",
                    what_rxe_saw(&before)
                );
            }
        }
        Role::Client => {
            let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
            let list = list.join(",");
            let (c, n) = (clients.to_string(), messages.to_string());
            let args = [ip.as_str(), "-p", &p, "-c", &c, "-n", &n, "-s", &list];
            let out = side::client(case, CLIENT, &[&args[..], extra].concat(), T);
            assert!(out.success(), "client:\n{out}\n{}", what_rxe_saw(&before));
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
    // A local ACK timeout of about 1 s (`-u 18`), not perftest's 67 ms: on a clean
    // wire, four concurrent 1 MiB READs between two one-vCPU guests outlast 67 ms
    // and are retransmitted (about 100 times a run of 160 echoes), and rxe 6.1 can
    // report a READ cut short by a retransmission as successful; kiara-ib then
    // closes the session rather than deliver the message (docs/faults.md). With
    // 1 s the same runs retransmitted 0-3 times; those few were packets dropped
    // by the hosts' FIFO, now deep enough that none are. Retransmission itself
    // is exercised under loss below and by twohost_faults.
    echo_with(
        &case,
        19701,
        &[64, 4096, 65536, 1 << 20],
        4,
        10,
        &["-u", "18"],
    );
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

/// The server's acknowledgement and keepalive timeouts in the cut-off case.
const ACK_TIMEOUT: &str = "10";
const PEER_TIMEOUT: &str = "15";

/// How long the server may take to close the cut-off session: the longer of
/// its two timeouts (keepalive: a third of it idle, then probes), and room.
const CLOSE_WITHIN: Duration = Duration::from_secs(45);

/// The causes a cut-off client's close may name: an echo of the server's it had
/// not acknowledged, a message of its that the server was still reading, a
/// control message of the server's it never took, or none in flight (keepalive).
const CUT_OFF_CAUSES: [&str; 4] = [
    "did not acknowledge",
    "could not be read",
    "did not take a control message of ours",
    "keepalive",
];

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn client_cut_off_longer_than_ack_timeout() {
    let case = Case::start("client_cut_off_longer_than_ack_timeout");
    let (port, p) = (19703u16, "19703");
    let ip = case.server_ip();
    match case.role() {
        Role::Server => {
            let args = ["-a", &ip, "-p", p, "--ack-timeout", ACK_TIMEOUT];
            let mut srv = spawn(
                SERVER,
                &[&args[..], &["--peer-timeout", PEER_TIMEOUT]].concat(),
            );
            case.server_ready(1, || listening(port), || srv.exited());
            case.wait_for("cut", T);
            let closed = within(CLOSE_WITHIN, || srv.stderr_so_far().contains("closed: "));
            let log = srv.stderr_so_far();
            assert!(
                closed.is_some(),
                "a's session still open {CLOSE_WITHIN:?} after the cut:\n{log}"
            );
            let reason = log
                .lines()
                .find(|l| l.contains("closed: "))
                .unwrap_or("")
                .to_string();
            // Which timeout closes the session depends on where the cut lands.
            let named = CUT_OFF_CAUSES.iter().any(|c| reason.contains(c));
            assert!(named, "the close names no cause: {reason}");
            // A client of b's own: the same size, so the buffers a's session
            // released serve it; every echo is checked.
            let local = ["-p", p, "-c", "1", "-n", "30", "-s", "65536"];
            let out = spawn(CLIENT, &[&[ip.as_str()][..], &local].concat()).wait(T);
            assert!(out.success(), "b's own client, after the close:\n{out}");
            assert!(out.stdout.ends_with("every echo verified\n"), "{out}");
            let after = closed.unwrap_or_default().as_secs_f64();
            case.publish("served", &format!("{reason} ({after:.1} s after the cut)"));
            case.wait_for("client-ended", T);
            assert!(!srv.exited(), "the server ended:\n{}", srv.stderr_so_far());
            let out = srv.kill();
            assert!(!out.stderr.contains("panicked"), "{out}");
        }
        Role::Client => {
            case.await_server(1);
            let before = Counters::read();
            let args = [
                ip.as_str(),
                "-p",
                p,
                "-c",
                "1",
                "-n",
                "100000",
                "-s",
                "65536",
            ];
            let mut cli = spawn(CLIENT, &args);
            let going = within(T, || {
                Counters::read().since(&before).get("rdma_sends") >= 20
            });
            assert!(going.is_some(), "no echoes under way");
            case.publish("cut", "");
            let (down, _) = link_down_until(Duration::from_secs(120), || case.peer_has("served"));
            let served = case.wait_for("served", T);
            let ended = within(Duration::from_secs(90), || cli.exited());
            let out = cli.wait(Duration::from_secs(1));
            case.publish("client-ended", "");
            assert!(
                ended.is_some(),
                "the cut-off client still ran 90 s after the link came back:\n{out}"
            );
            assert!(
                !out.success(),
                "the cut-off client reported success:\n{out}"
            );
            let line = out.stderr.lines().last().unwrap_or("").to_string();
            assert!(
                !line.contains("differs"),
                "the cut-off client got bytes not its own: {line}"
            );
            let named = ["closed", "gone", "no echo", "RDMA failed", "acknowledge"]
                .iter()
                .any(|w| line.contains(w));
            assert!(named, "the cut-off client's error names no cause:\n{out}");
            case.publish(
                "measured",
                &format!(
                    "a's link down {:.0} s mid-echo: b closed a's session: {served}; b's own client: 30 echoes of 64 KiB verified; a's client failed {:.1} s after link up: {line}",
                    down.as_secs_f64(),
                    ended.unwrap_or_default().as_secs_f64()
                ),
            );
        }
    }
    recreate_rxe();
}
