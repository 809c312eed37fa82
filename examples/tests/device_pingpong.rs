//! `ibv_rc_pingpong` (Rust) against rdma-core's C `ibv_rc_pingpong`, both ways, and
//! against itself with completion events and buffer validation.

use examples::perftest::child::{run_pair, Outcome};
use std::time::Duration;

fn gid() -> String {
    std::env::var("RDMA_GID_INDEX").unwrap_or_else(|_| "1".into())
}

fn args(port: u16, extra: &[&str], client: bool) -> Vec<String> {
    let mut v: Vec<String> = vec!["-g".into(), gid(), "-p".into(), port.to_string()];
    v.extend(extra.iter().map(|s| s.to_string()));
    if client {
        v.push(std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into()));
    }
    v
}

/// Checks the four lines of the C program: local and remote address, then bytes and
/// iterations with positive rates; returns (local QPN, remote QPN).
fn check(who: &str, o: &Outcome, size: u64, iters: u64) -> (String, String) {
    assert!(o.ok(), "{who} failed:\n{o}");
    let lines: Vec<&str> = o.stdout.lines().collect();
    let local = lines
        .iter()
        .find(|l| l.starts_with("  local address:  LID 0x"))
        .unwrap_or_else(|| panic!("{who}: no local address\n{o}"));
    let remote = lines
        .iter()
        .find(|l| l.starts_with("  remote address: LID 0x"))
        .unwrap_or_else(|| panic!("{who}: no remote address\n{o}"));
    for l in [local, remote] {
        assert!(
            l.contains(", QPN 0x") && l.contains(", PSN 0x") && l.contains(", GID ::ffff:"),
            "{who}: {l}"
        );
    }
    let bytes = lines
        .iter()
        .find(|l| l.contains(" bytes in "))
        .unwrap_or_else(|| panic!("{who}: no bytes line\n{o}"));
    let w: Vec<&str> = bytes.split_whitespace().collect();
    assert_eq!(w[0], (2 * size * iters).to_string(), "{who}: {bytes}");
    assert_eq!(&w[w.len() - 1], &"Mbit/sec", "{who}: {bytes}");
    assert!(
        w[w.len() - 2].parse::<f64>().unwrap() > 0.0,
        "{who}: {bytes}"
    );
    let it = lines
        .iter()
        .find(|l| l.contains(" iters in "))
        .unwrap_or_else(|| panic!("{who}: no iters line\n{o}"));
    let w: Vec<&str> = it.split_whitespace().collect();
    assert_eq!(w[0], iters.to_string(), "{who}: {it}");
    assert_eq!(&w[w.len() - 1], &"usec/iter", "{who}: {it}");
    assert!(w[w.len() - 2].parse::<f64>().unwrap() > 0.0, "{who}: {it}");
    let qpn = |l: &str| {
        l.split("QPN ")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .to_string()
    };
    (qpn(local), qpn(remote))
}

fn pair(server: &str, client: &str, port: u16, extra: &[&str], size: u64, iters: u64) {
    let (s, c) = run_pair(
        (server, args(port, extra, false)),
        (client, args(port, extra, true)),
        port,
        Duration::from_secs(120),
    );
    let (sl, sr) = check("server", &s, size, iters);
    let (cl, cr) = check("client", &c, size, iters);
    assert_eq!(
        (sl, sr),
        (cr, cl),
        "each side's remote QPN is the other's local one"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_client_c_server() {
    pair(
        "ibv_rc_pingpong",
        env!("CARGO_BIN_EXE_ibv_rc_pingpong"),
        19001,
        &[],
        4096,
        1000,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn c_client_rust_server() {
    pair(
        env!("CARGO_BIN_EXE_ibv_rc_pingpong"),
        "ibv_rc_pingpong",
        19002,
        &[],
        4096,
        1000,
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn c_client_rust_server_options() {
    let extra = [
        "-s", "8192", "-n", "200", "-m", "2048", "-r", "50", "-l", "0", "-i", "1", "-c",
    ];
    pair(
        env!("CARGO_BIN_EXE_ibv_rc_pingpong"),
        "ibv_rc_pingpong",
        19003,
        &extra,
        8192,
        200,
    );
}

/// `-N` (the extended send interface, `ibv_wr_*`) against C's `-N`, both ways,
/// with `-c` validating every buffer: 64 bytes (sent inline) and 8 KiB (from the
/// registered buffer).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn new_send_api_both_ways() {
    let ours = env!("CARGO_BIN_EXE_ibv_rc_pingpong");
    for (size, port) in [(64, 19008), (8192, 19009)] {
        let size_arg = size.to_string();
        let extra = ["-N", "-c", "-n", "300", "-s", size_arg.as_str()];
        pair("ibv_rc_pingpong", ours, port, &extra, size, 300);
        pair(ours, "ibv_rc_pingpong", port + 10, &extra, size, 300);
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rust_pair_with_events_and_validation() {
    let ours = env!("CARGO_BIN_EXE_ibv_rc_pingpong");
    let dev = std::env::var("RDMA_DEVICE").unwrap_or_else(|_| "rxe0".into());
    let extra = ["-e", "-c", "-n", "300", "-s", "100", "-d", dev.as_str()];
    pair(ours, ours, 19004, &extra, 100, 300);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn malformed_address_is_an_error() {
    use std::io::Write;
    let port = 19005;
    let srv = examples::perftest::child::spawn_listening(
        env!("CARGO_BIN_EXE_ibv_rc_pingpong"),
        &args(port, &[], false),
        port,
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&[b'z'; 52]).unwrap();
    let o = srv.wait(Duration::from_secs(20));
    assert!(o.status.is_some(), "server hung\n{o}");
    assert!(!o.ok() && o.stderr.contains("malformed"), "{o}");
}

/// Runs the C program and the port with the same options as servers that must stop
/// before listening; returns (C, Rust).
fn refused_by_both(port: u16, extra: &[&str]) -> (Outcome, Outcome) {
    // Watched while it runs: a program that listened and then failed would pass a
    // look taken after its exit.
    let run = |prog: &str| {
        let mut child = examples::perftest::child::spawn(prog, &args(port, extra, false))
            .unwrap_or_else(|e| panic!("cannot start {prog}: {e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut listened = false;
        while child.running() && std::time::Instant::now() < deadline {
            listened |= examples::perftest::child::listening(port);
            std::thread::sleep(Duration::from_millis(2));
        }
        (child.wait(Duration::from_secs(1)), listened)
    };
    let (c, c_listened) = run("ibv_rc_pingpong");
    let (rust, rust_listened) = run(env!("CARGO_BIN_EXE_ibv_rc_pingpong"));
    for (who, o, listened) in [("C", &c, c_listened), ("Rust", &rust, rust_listened)] {
        assert!(o.status.is_some(), "{who} waited instead of failing:\n{o}");
        assert!(!o.ok(), "{who} succeeded:\n{o}");
        assert!(!listened, "{who} listened before refusing:\n{o}");
    }
    (c, rust)
}

fn device_attr() -> rdma_safe::context::DeviceAttr {
    let name = std::env::var("RDMA_DEVICE").ok();
    rdma_safe::Context::open(name.as_deref())
        .expect("no RDMA device: run `cargo xtask test`")
        .query_device()
        .expect("ibv_query_device_ex")
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn completion_timestamps_as_the_c_program() {
    let port = 19006;
    if device_attr().completion_timestamp_mask() != 0 {
        // A device that timestamps: a real run, with the three cycle lines.
        let rust = env!("CARGO_BIN_EXE_ibv_rc_pingpong");
        let (s, c) = run_pair(
            (rust, args(port, &["-t", "-n", "100"], false)),
            (rust, args(port, &["-t", "-n", "100"], true)),
            port,
            Duration::from_secs(60),
        );
        for (who, o) in [("server", &s), ("client", &c)] {
            check(who, o, 4096, 100);
            assert!(
                o.stdout
                    .contains("Average receive completion clock cycles = "),
                "{who}\n{o}"
            );
        }
        return;
    }
    // rxe: no completion timestamps. Both refuse with the same words, before
    // listening; the port names the attribute.
    let (c, rust) = refused_by_both(port, &["-t"]);
    let words = "The device isn't completion timestamp capable";
    assert!(c.stderr.contains(words), "C:\n{c}");
    assert!(rust.stderr.contains(words), "Rust:\n{rust}");
    assert!(
        rust.stderr.contains("completion_timestamp_mask 0"),
        "Rust does not name the cause:\n{rust}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn device_memory_as_the_c_program() {
    let port = 19007;
    let (c, rust) = refused_by_both(port, &["-j", "-o"]);
    let words = "DM memory region can't be on demand";
    assert!(
        c.stderr.contains(words) && rust.stderr.contains(words),
        "{c}\n{rust}"
    );
    if device_attr().max_dm_size() == 0 {
        let (c, rust) = refused_by_both(port, &["-j"]);
        let words = "Device doesn't support dm allocation";
        assert!(c.stderr.contains(words), "C:\n{c}");
        assert!(rust.stderr.contains(words), "Rust:\n{rust}");
        assert!(
            rust.stderr.contains("max_dm_size 0"),
            "Rust does not name the cause:\n{rust}"
        );
    } else {
        // The C program would run; the port says it does not use device memory.
        let rust = examples::perftest::child::spawn(
            env!("CARGO_BIN_EXE_ibv_rc_pingpong"),
            &args(port, &["-j"], false),
        )
        .expect("start the port")
        .wait(Duration::from_secs(30));
        assert!(rust.status.is_some() && !rust.ok(), "{rust}");
        assert!(rust.stderr.contains("device memory"), "{rust}");
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn non_ascii_gid_is_an_error_not_a_panic() {
    // The 52-byte message that used to kill the server ("end byte index 2 is not a
    // char boundary"): a two-byte character where the GID's first hex pair starts.
    let mut msg = *b"0000:000011:abcdef:00000000000000000000ffffc6120001\0";
    msg[19] = b'0';
    msg[20..22].copy_from_slice("é".as_bytes());
    let port = 19006;
    let o = examples::perftest::child::feed_server(
        env!("CARGO_BIN_EXE_ibv_rc_pingpong"),
        &args(port, &[], false),
        port,
        &msg,
        Duration::from_secs(20),
    );
    assert!(o.status.is_some(), "server hung\n{o}");
    assert!(!o.stderr.contains("panicked"), "{o}");
    assert!(
        !o.ok() && o.stderr.contains("GID") && o.stderr.contains("not a hex digit"),
        "{o}"
    );
}

/// `-o`, `-O` and `-P` (on-demand paging, implicit, prefetch) as the C program
/// takes them: `-P` alone is refused in C's words; on a device without ODP for RC
/// (Soft-RoCE in Linux 6.1) `-o` and `-O` are refused in C's words, before
/// listening, and the port names what the device reports; on one with it, a pair
/// of ports runs on an ODP buffer fetched in beforehand.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn on_demand_paging_as_the_c_program() {
    let port = 19010;
    let (c, rust) = refused_by_both(port, &["-P"]);
    let words = "prefetch is valid only with on-demand memory region";
    assert!(
        c.stderr.contains(words) && rust.stderr.contains(words),
        "{c}\n{rust}"
    );
    let odp = device_attr().0.odp_caps;
    let rc = rdma_safe::sys::IBV_ODP_SUPPORT_SEND | rdma_safe::sys::IBV_ODP_SUPPORT_RECV;
    if odp.general_caps & u64::from(rdma_safe::sys::IBV_ODP_SUPPORT) == 0
        || odp.per_transport_caps.rc_odp_caps & rc != rc
    {
        for flags in [&["-o"][..], &["-O"], &["-o", "-P"]] {
            let (c, rust) = refused_by_both(port, flags);
            let words = "The device isn't ODP capable or does not support RC send and receive";
            assert!(c.stderr.contains(words), "C {flags:?}:\n{c}");
            assert!(rust.stderr.contains(words), "Rust {flags:?}:\n{rust}");
            assert!(
                rust.stderr.contains("rc_odp_caps"),
                "Rust {flags:?}:\n{rust}"
            );
        }
        return;
    }
    // A device with ODP: both ports run on an on-demand buffer, prefetched.
    let rust = env!("CARGO_BIN_EXE_ibv_rc_pingpong");
    let (s, c) = run_pair(
        (rust, args(port, &["-o", "-P", "-n", "200"], false)),
        (rust, args(port, &["-o", "-P", "-n", "200"], true)),
        port,
        Duration::from_secs(60),
    );
    assert!(s.ok() && c.ok(), "{s}\n{c}");
    assert!(c.stdout.contains("200 iters in"), "{c}");
}

/// An option the C program does not know (it has no `-h` either) prints its usage
/// and exits 1; the port exits the same.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn unknown_options_exit_as_the_c_program() {
    for flags in [&["-h"][..], &["--no-such-option"]] {
        for prog in ["ibv_rc_pingpong", env!("CARGO_BIN_EXE_ibv_rc_pingpong")] {
            let out = std::process::Command::new(prog)
                .args(flags)
                .output()
                .expect(prog);
            assert_eq!(out.status.code(), Some(1), "{prog} {flags:?}: {out:?}");
        }
    }
}
