//! Two hosts, one wire: the RDMA CM programs, each server on host b and its
//! client on host a: `rping` and the endpoint-API pingpong both ways against the
//! C tools (rdmacm-utils' `rping`, `rdma_server`, `rdma_client`), and
//! `rdma-file-transfer` moving a 64 MiB file whose SHA-256 must be the same on
//! both hosts.
//!
//! Run by `cargo xtask test` on its two guests (`docs/two-hosts.md`); they fail
//! anywhere else.

use examples::cm::child::Finished;
use examples::perftest::child::cm_listening;
use examples::twohost::files::{sha256, write_random_file};
use examples::twohost::{side, Case, Role};
use std::path::PathBuf;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
const RPING: &str = env!("CARGO_BIN_EXE_rping");
const PP_SERVER: &str = env!("CARGO_BIN_EXE_rdma-pingpong-server");
const PP_CLIENT: &str = env!("CARGO_BIN_EXE_rdma-pingpong-client");
const FILE_TRANSFER: &str = env!("CARGO_BIN_EXE_rdma-file-transfer");

/// The ping lines `rping -v` prints: `rdma-ping-N: <rotating text>`.
fn expected_pings(count: usize, size: usize) -> Vec<String> {
    let mut start = 65u8;
    (0..count)
        .map(|n| {
            let mut s = format!("rdma-ping-{n}: ").into_bytes();
            let mut c = start;
            while s.len() < size - 1 {
                s.push(c);
                c = if c >= 122 { 65 } else { c + 1 };
            }
            start = if start >= 122 { 65 } else { start + 1 };
            String::from_utf8(s).unwrap()
        })
        .collect()
}

fn no_panic(who: &str, out: &Finished) {
    assert!(!out.stderr.contains("panicked"), "{who}:\n{out}");
}

fn rping(name: &str, server: &str, client: &str, port: u16) {
    let case = Case::start(name);
    let (ip, p) = (case.server_ip(), port.to_string());
    let want = expected_pings(10, 64);
    match case.role() {
        Role::Server => {
            let args = ["-s", "-v", "-a", &ip, "-p", &p, "-S", "64"];
            let out = side::server(&case, server, &args, || cm_listening(port), T);
            assert!(out.success(), "server:\n{out}");
            no_panic("server", &out);
            assert_eq!(
                out.lines_after("server ping data: "),
                want,
                "server:\n{out}"
            );
        }
        Role::Client => {
            let args = [
                "-c", "-v", "-V", "-a", &ip, "-p", &p, "-C", "10", "-S", "64",
            ];
            let out = side::client(&case, client, &args, T);
            assert!(out.success(), "client:\n{out}");
            no_panic("client", &out);
            assert_eq!(out.lines_after("ping data: "), want, "client:\n{out}");
        }
    }
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn rping_rust_server_c_client() {
    rping("rping_rust_server_c_client", RPING, "rping", 19601);
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn rping_c_server_rust_client() {
    rping("rping_c_server_rust_client", "rping", RPING, 19602);
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn cm_pingpong_rust_server_c_client() {
    let case = Case::start("cm_pingpong_rust_server_c_client");
    let (ip, p) = (case.server_ip(), "19611");
    match case.role() {
        Role::Server => {
            let args = ["-s", &ip, "-p", p, "-v", "--timeout", "60"];
            let out = side::server(&case, PP_SERVER, &args, || cm_listening(19611), T);
            assert!(out.success(), "server:\n{out}");
            assert!(
                out.stdout.contains("rdma-pingpong-server: 1 rounds, end 0"),
                "{out}"
            );
        }
        Role::Client => {
            let out = side::client(&case, "rdma_client", &["-s", &ip, "-p", p], T);
            assert!(out.success(), "client:\n{out}");
            assert!(out.stdout.contains("rdma_client: end 0"), "{out}");
        }
    }
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn cm_pingpong_c_server_rust_client() {
    let case = Case::start("cm_pingpong_c_server_rust_client");
    let (ip, p) = (case.server_ip(), "19612");
    match case.role() {
        Role::Server => {
            let args = ["-s", &ip, "-p", p];
            let out = side::server(&case, "rdma_server", &args, || cm_listening(19612), T);
            assert!(out.success(), "server:\n{out}");
            assert!(out.stdout.contains("rdma_server: end 0"), "{out}");
        }
        Role::Client => {
            let out = side::client(&case, PP_CLIENT, &["-s", &ip, "-p", p, "-v"], T);
            assert!(out.success(), "client:\n{out}");
            assert!(
                out.stdout.contains("rdma-pingpong-client: 1 rounds, end 0"),
                "{out}"
            );
            // The C server answers with its own 16 bytes (zeros): an empty string.
            assert_eq!(out.lines_after("reply 0: "), vec![""], "{out}");
        }
    }
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn cm_pingpong_rust_both_many_rounds() {
    let case = Case::start("cm_pingpong_rust_both_many_rounds");
    let (ip, p) = (case.server_ip(), "19613");
    match case.role() {
        Role::Server => {
            let args = ["-s", &ip, "-p", p, "--timeout", "60"];
            let out = side::server(&case, PP_SERVER, &args, || cm_listening(19613), T);
            assert!(out.success(), "server:\n{out}");
            assert!(
                out.stdout
                    .ends_with("rdma-pingpong-server: 300 rounds, end 0\n"),
                "{out}"
            );
        }
        Role::Client => {
            let args = ["-s", &ip, "-p", p, "-n", "300", "-v", "--expect-pong"];
            let out = side::client(&case, PP_CLIENT, &args, T);
            assert!(out.success(), "client:\n{out}");
            let replies = out.lines_after("reply ");
            let want: Vec<String> = (0..300).map(|i| format!("{i}: pong {i}")).collect();
            assert_eq!(replies, want, "{out}");
        }
    }
}

/// 64 MiB and a few bytes: seven chunks of the 10 MiB buffer, the last one short.
const FILE_SIZE: usize = (64 << 20) + 12345;

/// The `<n> bytes, checksum <x>` part of the `sent`/`received` line.
fn summary(out: &Finished, word: &str) -> String {
    let line = out.stdout.lines().find_map(|l| l.strip_prefix(word));
    let sum = line.and_then(|l| l.split_once(": ").map(|(_, s)| s.to_owned()));
    sum.unwrap_or_else(|| panic!("no `{word}` line:\n{out}"))
}

#[test]
#[ignore = "needs two hosts: run `cargo xtask test`"]
fn file_transfer_64_mib_sha256_matches() {
    let case = Case::start("file_transfer_64_mib_sha256_matches");
    let (ip, p) = (case.server_ip(), "19621");
    // Each host's own /tmp: the file really crosses the wire.
    let dir = PathBuf::from(format!("/tmp/twohost-ft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = "sixty-four-mib.bin";
    match case.role() {
        Role::Server => {
            let args = ["server", "-p", p, "-o", dir.to_str().unwrap()];
            let out = side::server(&case, FILE_TRANSFER, &args, || cm_listening(19621), T);
            assert!(out.success(), "server:\n{out}");
            let stored = dir.join(name);
            let len = std::fs::metadata(&stored).map(|m| m.len() as usize);
            assert_eq!(len.ok(), Some(FILE_SIZE), "the stored file's size\n{out}");
            case.publish("received", &summary(&out, "received "));
            case.publish("sha256", &sha256(&stored));
        }
        Role::Client => {
            let src = dir.join(name);
            write_random_file(&src, FILE_SIZE);
            let sum = sha256(&src);
            let args = ["client", &ip, src.to_str().unwrap(), "-p", p];
            let out = side::client(&case, FILE_TRANSFER, &args, T);
            assert!(out.success(), "client:\n{out}");
            let sent = summary(&out, "sent ");
            assert!(
                sent.starts_with(&format!("{FILE_SIZE} bytes, checksum ")),
                "{out}"
            );
            assert_eq!(
                case.wait_for("received", T),
                sent,
                "the tool's own checksums"
            );
            assert_eq!(
                case.wait_for("sha256", T),
                sum,
                "SHA-256 on host b vs host a"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
