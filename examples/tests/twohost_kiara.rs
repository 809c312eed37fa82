//! Two hosts, one wire: the KIARA echo server on host b, four concurrent clients
//! (one session each) on host a, messages of 64 B, 4 KiB (eager) and 64 KiB (read
//! by the peer with RDMA READ), every echo checked by the client (bytes and
//! checksum).
//!
//! Not 1 MiB: four concurrent 1 MiB echoes over the emulated wire (about 3 MB/s)
//! leave some READ's responder silent for longer than the RC timeout (67 ms), so
//! READs are retransmitted, and the sessions then stall with no traffic until
//! KIARA's 120 s acknowledgement timeout (see `docs/two-hosts.md`).
//!
//! Run by `cargo xtask test` on its two guests (`docs/two-hosts.md`); it fails
//! anywhere else.

use examples::perftest::child::listening;
use examples::twohost::{side, Case, Role};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(300);
const SERVER: &str = env!("CARGO_BIN_EXE_kiara-echo-server");
const CLIENT: &str = env!("CARGO_BIN_EXE_kiara-echo-client");
const SIZES: [usize; 3] = [64, 4096, 65536];
const CLIENTS: usize = 4;
const MESSAGES: usize = 10;

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn echo_four_clients_every_reply_verified() {
    let case = Case::start("echo_four_clients_every_reply_verified");
    let (ip, port) = (case.server_ip(), 19701u16);
    let p = port.to_string();
    match case.role() {
        Role::Server => {
            // It serves until killed: side::server ends it once the client left.
            let out = side::server(&case, SERVER, &["-a", &ip, "-p", &p], || listening(port), T);
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
            }
        }
        Role::Client => {
            let sizes = SIZES.map(|s| s.to_string()).join(",");
            let (c, n) = (CLIENTS.to_string(), MESSAGES.to_string());
            let args = [ip.as_str(), "-p", &p, "-c", &c, "-n", &n, "-s", &sizes];
            let out = side::client(&case, CLIENT, &args, T);
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
            let want: Vec<(String, String)> = SIZES
                .iter()
                .map(|s| (s.to_string(), (CLIENTS * MESSAGES).to_string()))
                .collect();
            assert_eq!(got, want, "one row per size, every message echoed:\n{out}");
        }
    }
}
