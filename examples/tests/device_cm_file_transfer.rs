//! `rdma-file-transfer` in the Soft-RoCE guest: a real file of an odd size stored
//! byte for byte, and a stream larger than 2 GiB (and, when the guest has less
//! memory than that, larger than its memory) whose checksums must match on both
//! sides. Nothing huge lands on disk: the client generates the content, the server
//! checksums it.
//!
//! Run by `cargo xtask test`; they fail without a device.

use examples::cm::child::{port, run_client, spawn, Finished};
use std::path::PathBuf;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_rdma-file-transfer");

fn ip() -> String {
    std::env::var("RDMA_IP").expect(
        "RDMA_IP is not set: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    )
}

/// The `<n> bytes, checksum <x>` part of a `sent`/`received` line.
fn summary(out: &Finished, word: &str) -> String {
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(word))
        .and_then(|l| l.split_once(": ").map(|(_, s)| s.to_owned()))
        .unwrap_or_else(|| panic!("no `{word}` line:\n{out}"))
}

fn transfer(
    slot: u16,
    server_args: &[&str],
    client_args: &[&str],
    timeout: Duration,
) -> (Finished, Finished) {
    let p = port(7900, slot).to_string();
    let mut sargs = vec!["server", "-p", &p];
    sargs.extend_from_slice(server_args);
    let server = spawn(BIN, &sargs);
    let ip = ip();
    let mut cargs = vec!["client", &ip];
    cargs.extend_from_slice(client_args);
    cargs.extend_from_slice(&["-p", &p]);
    // Retried while the server does not listen yet.
    let client = run_client(BIN, &cargs, timeout, Duration::from_secs(30));
    let server = server.wait(Duration::from_secs(60));
    assert!(client.success(), "client:\n{client}\nserver:\n{server}");
    assert!(server.success(), "server:\n{server}");
    (client, server)
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn real_file_arrives_byte_for_byte() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ft-{}", std::process::id()));
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let src = dir.join("odd-size.bin");
    // 25 MiB + 3 bytes: three chunks, the last one short.
    let mut data = vec![0u8; 25 * 1024 * 1024 + 3];
    let mut x = 0x1234_5678_9abc_def0u64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&src, &data).unwrap();
    let (client, server) = transfer(
        1,
        &["-o", out_dir.to_str().unwrap()],
        &[src.to_str().unwrap()],
        Duration::from_secs(300),
    );
    assert_eq!(summary(&client, "sent "), summary(&server, "received "));
    let got = std::fs::read(out_dir.join("odd-size.bin")).unwrap();
    assert!(got == data, "the stored file differs from the sent one");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn stream_larger_than_2_gib_and_than_guest_memory_checksums_match() {
    // More than 2 GiB and more than the guest's memory (4 GiB by default): the
    // stream goes through one 10 MiB buffer, so memory does not limit it.
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    assert!(mem > 0, "no MemTotal in /proc/meminfo");
    let size = ((2u64 << 30) + (37 << 20))
        .max(mem + (64 << 20))
        .min(6 << 30)
        + 12345;
    assert!(size > 2 << 30 && size > mem);
    let size_s = size.to_string();
    let (client, server) = transfer(
        2,
        &["--discard"],
        &["--generate", &size_s, "--name", "big.bin"],
        Duration::from_secs(1500),
    );
    let sent = summary(&client, "sent ");
    assert!(
        sent.starts_with(&format!("{size} bytes, checksum ")),
        "{client}"
    );
    assert_eq!(sent, summary(&server, "received "));
    eprintln!("{} bytes (guest memory {mem} bytes): {sent}", size);
}
