//! Device test: the Rust `ibv_devinfo` agrees with rdma-core's on every device and
//! port field. Runs in the Soft-RoCE guest (`cargo xtask test`); fails without a device.

use std::process::Command;

fn device() -> String {
    std::env::var("RDMA_DEVICE").unwrap_or_else(|_| "rxe0".to_string())
}

/// Runs a program and returns its standard output, failing the test on error.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e} (is ibverbs-utils installed?)"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn rust_tool() -> &'static str {
    env!("CARGO_BIN_EXE_ibv_devinfo")
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn plain_output_is_identical_to_c() {
    let dev = device();
    let c = run("ibv_devinfo", &["-d", &dev]);
    let rust = run(rust_tool(), &["-d", &dev]);
    assert!(c.contains(&format!("hca_id:\t{dev}\n")), "C output: {c}");
    assert!(c.contains("PORT_ACTIVE"), "port not active: {c}");
    assert_eq!(rust, c, "Rust and C ibv_devinfo differ");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn verbose_output_with_gid_table_is_identical_to_c() {
    let dev = device();
    let c = run("ibv_devinfo", &["-v", "-d", &dev]);
    let rust = run(rust_tool(), &["-v", "-d", &dev]);
    assert!(c.contains("GID["), "no GID printed: {c}");
    assert!(c.contains("max_qp_wr:"), "not verbose: {c}");
    assert_eq!(rust, c, "Rust and C ibv_devinfo -v differ");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn list_and_single_port_match_c() {
    assert_eq!(run(rust_tool(), &["-l"]), run("ibv_devinfo", &["-l"]));
    let dev = device();
    assert_eq!(
        run(rust_tool(), &["-d", &dev, "-i", "1"]),
        run("ibv_devinfo", &["-d", &dev, "-i", "1"])
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn unknown_device_is_reported_like_c() {
    let out = Command::new(rust_tool())
        .args(["-d", "no_such_dev"])
        .output()
        .expect("run the Rust tool");
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "IB device 'no_such_dev' wasn't found\n"
    );
}

/// Runs `program` (as `ibv_devinfo`, its `argv[0]`, which C's messages name):
/// its exit status, standard output and standard error.
fn outcome(program: &str, args: &[&str]) -> (Option<i32>, String, String) {
    use std::os::unix::process::CommandExt;
    let out = Command::new(program)
        .arg0("ibv_devinfo")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8 output");
    (out.status.code(), text(out.stdout), text(out.stderr))
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn exit_statuses_and_messages_match_c() {
    let dev = device();
    // A port the device lacks (rxe has one), a port that is not positive, options
    // getopt does not know (C has no -h), a missing argument, long options cut
    // short; then numbers C's strtol reads its own way: hex, trailing junk, and
    // 257 (a uint8_t 1); and words that are not options, which C ignores.
    let cases: [&[&str]; 10] = [
        &["-d", &dev, "-i", "2"],
        &["-d", &dev, "-i", "0"],
        &["-h"],
        &["--bogus"],
        &["-d"],
        &["--ib-d", &dev, "--verb"],
        &["-d", &dev, "-i", "0x1"],
        &["-d", &dev, "-i", "1abc"],
        &["-d", &dev, "-i", "257"],
        &["-d", &dev, "an", "operand"],
    ];
    let expected = [4, 1, 255, 255, 255, 0, 0, 0, 0, 0].map(Some);
    for (args, status) in cases.iter().zip(expected) {
        let c = outcome("ibv_devinfo", args);
        let rust = outcome(rust_tool(), args);
        assert_eq!(c.0, status, "C ibv_devinfo {args:?}: {c:?}");
        assert_eq!(rust, c, "ibv_devinfo {args:?}: Rust and C differ");
    }
}
