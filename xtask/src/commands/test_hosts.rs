//! The two-host tier of `cargo xtask test`: every `tests/twohost_*.rs` binary runs
//! on both guests of a pair ([`crate::pair`]), in the same order, as
//! `<exe> --include-ignored --test-threads=1`; its tests (cases) keep in lockstep
//! through the shared directory (`examples::twohost`), host b serving and host a
//! the client. Afterwards the shared directory holds, per binary and host, its
//! exit status (`done-<binary>-<host>`) and, per case and host, how it ended
//! (`cases/<binary>/<case>/<host>.end`): the summary is made from those.

use std::time::{Duration, Instant};

use super::hosts_report::Report;
use super::test::DeviceTest;
use crate::cargo::{self, Artifact};
use crate::error::{Error, Result};
use crate::guest::Assets;
use crate::pair::{HostEnd, Pair};
use crate::process::{sh_join, sh_quote};
use crate::workspace::Workspace;
use crate::{step, GuestOptions, HOST_MEM_MIB};

/// The binary that has host b killed (`tests/twohost_peer_killed.rs`): it runs
/// last, and host b's missing results in it are expected.
pub const PEER_KILLED: &str = "twohost_peer_killed";

/// Hard limit of the two-host run, for each guest.
pub const TIMEOUT: Duration = Duration::from_secs(1500);

/// The two-host test binaries among `artifacts`, sorted by name.
pub fn two_host_tests(ws: &Workspace, artifacts: &[Artifact]) -> Vec<DeviceTest> {
    let mut tests: Vec<DeviceTest> = artifacts
        .iter()
        .filter(|a| a.is_two_host_test())
        .map(|a| DeviceTest {
            name: format!("{}/{}", ws.display(a.package_dir()), a.target_name),
            exe: a
                .executable
                .clone()
                .expect("two-host tests have executables"),
            package_dir: a.package_dir().to_path_buf(),
        })
        .collect();
    tests.sort_by(|a, b| a.name.cmp(&b.name).then(a.exe.cmp(&b.exe)));
    tests.dedup_by(|a, b| a.exe == b.exe);
    // It ends host b: nothing can run on two hosts after it.
    tests.sort_by_key(|t| target(t) == PEER_KILLED);
    tests
}

/// The two-host stage of `cargo xtask test`: with guests (`assets`), runs the
/// two-host binaries among `artifacts` and returns whether all passed; with
/// `--no-vm` (no `assets`) says why it does not run (one device, no second host).
pub fn stage(ws: &Workspace, assets: Option<&Assets>, artifacts: &[Artifact]) -> Result<bool> {
    let Some(assets) = assets else {
        // Said as the summary line a run of the tier ends with, so that a reader
        // of the log (or a script) cannot take the missing tier for a passed one.
        println!(
            "two-host-tests: NOT RUN (--no-vm or {}=1: this host's one device is not two \
             hosts; run without it to test the two-host tier)",
            super::test::NO_VM_ENV
        );
        return Ok(true);
    };
    let started = Instant::now();
    let result = run(ws, assets, &two_host_tests(ws, artifacts));
    step!(
        "two-host stage took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    result
}

/// Environment variable that narrows `--two-hosts-only` to some binaries, by
/// target name, comma-separated (e.g. `twohost_kiara,twohost_cm`).
pub const ONLY_ENV: &str = "XTASK_TWO_HOSTS";

/// `cargo xtask test --two-hosts-only`: builds the tests and runs only the
/// two-host tier (only the binaries [`ONLY_ENV`] names, if set); returns the
/// exit code for xtask.
pub fn run_only() -> Result<i32> {
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    step!("building the tests: cargo test --workspace --no-run");
    let artifacts = cargo::build_artifacts(&ws.root, &["test", "--workspace", "--no-run"])?;
    let mut tests = two_host_tests(&ws, &artifacts);
    if let Ok(only) = std::env::var(ONLY_ENV) {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        tests.retain(|t| names.contains(&target(t)));
        if tests.is_empty() {
            return Err(Error::new(format!(
                "{ONLY_ENV}={only} names no two-host test binary"
            )));
        }
    }
    let started = Instant::now();
    let passed = run(&ws, &assets, &tests)?;
    step!(
        "two-host stage took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(if passed { 0 } else { 1 })
}

/// The binary's target name: `twohost_cm` for `examples/twohost_cm`.
pub fn target(t: &DeviceTest) -> &str {
    t.name.rsplit('/').next().unwrap_or(&t.name)
}

/// Runs every binary on both hosts and prints the summary; returns whether
/// every case and binary passed on both.
pub fn run(ws: &Workspace, assets: &Assets, tests: &[DeviceTest]) -> Result<bool> {
    if tests.is_empty() {
        return Err(Error::new(
            "no two-host test executables found: they are integration tests named \
             tests/twohost_*.rs in a workspace package",
        ));
    }
    step!(
        "two-host tests ({} binaries): host b serves, host a is the client",
        tests.len()
    );
    let pair = Pair::new(ws)?;
    let body = guest_body(tests);
    let opts = GuestOptions {
        timeout: TIMEOUT,
        mem_mib: HOST_MEM_MIB,
    };
    let ends = pair.run(
        assets,
        &opts,
        [&body, &body],
        [&mut |_, _| {}, &mut |_, _| {}],
    );
    let report = Report::read(pair.shared(), tests);
    let passed = report.print();
    // A host killed on request (by the peer-killed case) has no exit status;
    // the report says whether its missing results were expected.
    let ends = ends?;
    Ok(passed
        && ends
            .iter()
            .all(|e| matches!(e, HostEnd::Exited(0) | HostEnd::Killed)))
}

/// The shell function that checks the kernel log once a binary has run: the first
/// warning (an rxe bug hit by a case) is shown with the kernel's own lines, leaves
/// `kernel-warning-<host>` and counts as a failure. It runs after every binary, not
/// once at the end: host b never reaches the end, since the peer-killed binary,
/// last, has it killed.
const KERNEL_CHECK: &str = "kernel_check() {\n\
     [ -e \"$XTASK_HOSTS_DIR/kernel-warning-$XTASK_HOST\" ] && return\n\
     if dmesg | grep -q -e 'cut here' -e 'BUG:'; then\n\
     echo \"xtask-guest: the guest kernel logged a warning during the two-host tests (by $1):\"\n\
     dmesg | grep -A14 -e 'cut here' -e 'BUG:' | head -60\n\
     : > \"$XTASK_HOSTS_DIR/kernel-warning-$XTASK_HOST\"\n\
     failed=$((failed + 1))\nfi\n}\n";

/// The shell code each host runs: every binary in order, each leaving its status
/// in `done-<binary>-<host>` and followed by a check of the kernel log.
fn guest_body(tests: &[DeviceTest]) -> String {
    let mut body = format!("failed=0\n{KERNEL_CHECK}");
    for (i, t) in tests.iter().enumerate() {
        let dir = sh_quote(&t.package_dir.to_string_lossy());
        let argv = [
            t.exe.to_string_lossy().into_owned(),
            "--include-ignored".into(),
            "--test-threads=1".into(),
            "--color=never".into(),
        ];
        let header = format!("==> two-host test {}/{}: {}", i + 1, tests.len(), t.name);
        body.push_str(&format!(
            "echo {}\n( cd {dir} && CARGO_MANIFEST_DIR={dir} exec {} )\nst=$?\n\
             echo $st > \"$XTASK_HOSTS_DIR/done-{}-$XTASK_HOST\"\n\
             [ $st -eq 0 ] || failed=$((failed + 1))\nkernel_check {}\n",
            sh_quote(&header),
            sh_join(&argv),
            target(t),
            target(t),
        ));
    }
    body.push_str("[ $failed -eq 0 ]");
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn body_runs_every_binary_and_leaves_its_status() {
        let t = |n: &str| DeviceTest {
            name: format!("examples/{n}"),
            exe: PathBuf::from(format!("/t/{n}-0a1b")),
            package_dir: PathBuf::from("/w/examples"),
        };
        let body = guest_body(&[t("twohost_a"), t("twohost_b")]);
        assert!(body.contains("exec /t/twohost_a-0a1b --include-ignored --test-threads=1"));
        assert!(body.contains("echo $st > \"$XTASK_HOSTS_DIR/done-twohost_b-$XTASK_HOST\""));
        assert!(body.ends_with("[ $failed -eq 0 ]"));
        // The kernel is checked after each binary, so a host that a later binary
        // has killed was still checked for what the earlier ones did.
        let a = body.find("done-twohost_a-").unwrap();
        let check_a = body.find("kernel_check twohost_a\n").unwrap();
        let b = body.find("exec /t/twohost_b-0a1b").unwrap();
        assert!(a < check_a && check_a < b, "{body}");
        assert!(body.contains("kernel_check twohost_b\n"));
    }

    #[test]
    fn kernel_check_fails_once_and_leaves_its_file() {
        // The body's shell function, run on this host against a stand-in `dmesg`.
        let dir = std::env::temp_dir().join(format!("xtask-kcheck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("dmesg"),
            "#!/bin/sh\necho '------------[ cut here ]------------'\n",
        )
        .unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(dir.join("dmesg"))
            .status()
            .unwrap();
        let script = format!(
            "failed=0\n{KERNEL_CHECK}kernel_check one\nkernel_check two\necho failed=$failed"
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
            .env("XTASK_HOSTS_DIR", &dir)
            .env("XTASK_HOST", "b")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(text.contains("two-host tests (by one)"), "{text}");
        assert!(!text.contains("(by two)"), "{text}");
        assert!(text.ends_with("failed=1\n"), "{text}");
    }
}
