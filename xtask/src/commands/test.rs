//! `cargo xtask test`: the static checks ([`super::checks`]: fmt, clippy, docs, the
//! publish dry run), the host tests, then every device test binary in one guest, then
//! the two-host tier ([`super::test_hosts`]) on two guests.
//!
//! Device tests live in `tests/device_*.rs` of any workspace package and are
//! `#[ignore]`d, so plain `cargo test` skips them; here each binary runs as
//! `<exe> --include-ignored --test-threads=1` with cwd and `CARGO_MANIFEST_DIR`
//! set to its package's directory.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;

use super::{describe_status, Tally};
use crate::cargo::{self, Artifact};
use crate::error::{Error, Result};
use crate::guest::{Assets, GuestRun};
use crate::process::{self, sh_join, sh_quote};
use crate::workspace::Workspace;
use crate::{packages, step, GuestOptions};

/// Environment variable that, set to 1, means `--no-vm`.
pub const NO_VM_ENV: &str = "RDMA_NO_VM";

/// Arguments every device test binary gets.
const TEST_ARGS: &[&str] = &["--include-ignored", "--test-threads=1"];

/// One device test binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTest {
    /// `<package dir>/<target>`, e.g. `rdma-safe/device_verbs`, for messages.
    pub name: String,
    /// The test executable.
    pub exe: PathBuf,
    /// The package's directory: the test's cwd and `CARGO_MANIFEST_DIR`.
    pub package_dir: PathBuf,
}

/// The device tests among `artifacts`, one per executable, sorted by name.
pub fn device_tests(ws: &Workspace, artifacts: &[Artifact]) -> Vec<DeviceTest> {
    let mut tests: Vec<DeviceTest> = artifacts
        .iter()
        .filter(|a| a.is_device_test())
        .map(|a| DeviceTest {
            name: format!("{}/{}", ws.display(a.package_dir()), a.target_name),
            exe: a.executable.clone().expect("device tests have executables"),
            package_dir: a.package_dir().to_path_buf(),
        })
        .collect();
    tests.sort_by(|a, b| a.name.cmp(&b.name).then(a.exe.cmp(&b.exe)));
    tests.dedup_by(|a, b| a.exe == b.exe);
    tests
}

/// The header line printed before a device test binary's output.
fn header(ws: &Workspace, i: usize, n: usize, t: &DeviceTest) -> String {
    format!(
        "==> device test {}/{n}: {} ({})",
        i + 1,
        t.name,
        ws.display(&t.exe)
    )
}

/// Runs the command; returns the exit code for xtask.
pub fn run(opts: &GuestOptions, no_vm: bool, two_hosts_only: bool) -> Result<i32> {
    if two_hosts_only {
        return super::test_hosts::run_only();
    }
    let ws = Workspace::locate()?;
    let no_vm = no_vm || std::env::var(NO_VM_ENV).is_ok_and(|v| v == "1");
    // rdma-verbs-sys needs libibverbs-dev, librdmacm-dev, libclang-dev and pkg-config to build.
    packages::ensure(!no_vm)?;
    // Formatting, lints, docs and packaging need no device: they fail in minutes, not
    // after the guest tiers.
    step!("static checks (`cargo xtask check`)");
    super::checks::run_all(&ws)?;
    // Fetch the kernel before the long host tests, so that a missing one fails fast.
    let assets = if no_vm {
        None
    } else {
        Some(super::prepare_kernel_and_initramfs(&ws)?)
    };

    host_tests(&ws)?;
    let (tests, artifacts) = build_device_tests(&ws)?;
    let mut tally = Tally::new(tests.len());
    let guest_result = match &assets {
        None => {
            run_on_host(&ws, &tests, &mut tally);
            Ok(())
        }
        Some(assets) => run_in_guest(&ws, assets, opts, &tests, &mut tally),
    };

    print_summary(&tests, &tally);

    // The two-host tier runs whatever the single guest's outcome.
    let two_hosts = super::test_hosts::stage(&ws, assets.as_ref(), &artifacts);
    if let (Err(_), Err(e)) = (&guest_result, &two_hosts) {
        step!("two-host tests failed: {e}");
    }
    guest_result?;
    let two_hosts_passed = two_hosts?;
    Ok(if tally.failed() == 0 && two_hosts_passed {
        0
    } else {
        1
    })
}

/// `cargo test --workspace` on the host; device tests are not run after a failure.
fn host_tests(ws: &Workspace) -> Result<()> {
    step!("running host tests: cargo test --workspace");
    let st = process::status(
        Command::new(cargo::cargo())
            .current_dir(&ws.root)
            .args(["test", "--workspace"]),
    )?;
    if !st.success() {
        return Err(Error::new(format!(
            "host tests failed (`cargo test --workspace` exited with {}); device tests not run",
            process::exit_code(st)
        )));
    }
    Ok(())
}

/// Builds every test binary and picks the device tests (`tests/device_*.rs`).
fn build_device_tests(ws: &Workspace) -> Result<(Vec<DeviceTest>, Vec<Artifact>)> {
    step!("building device tests: cargo test --workspace --no-run");
    let artifacts = cargo::build_artifacts(&ws.root, &["test", "--workspace", "--no-run"])?;
    let tests = device_tests(ws, &artifacts);
    if tests.is_empty() {
        return Err(Error::new(
            "no device test executables found: device tests are integration tests named \
             tests/device_*.rs in a workspace package",
        ));
    }
    step!(
        "found {} device test binaries: {}",
        tests.len(),
        tests
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok((tests, artifacts))
}

/// Prints the failed device test binaries and the totals.
fn print_summary(tests: &[DeviceTest], tally: &Tally) {
    let failed: Vec<String> = tests
        .iter()
        .zip(&tally.statuses)
        .filter(|(_, st)| **st != Some(0))
        .map(|(t, st)| format!("{}: {}", t.name, describe_status(*st)))
        .collect();
    if !failed.is_empty() {
        println!("failed device test binaries:");
        for f in &failed {
            println!("    {f}");
        }
    }
    println!(
        "device-tests: {} passed, {} failed",
        tally.passed(),
        tally.failed()
    );
}

/// `--no-vm`: runs each binary on this host, which must have an RDMA device.
fn run_on_host(ws: &Workspace, tests: &[DeviceTest], tally: &mut Tally) {
    step!("running device tests on this host (no guest): it needs an RDMA device (RDMA_DEVICE, RDMA_GID_INDEX)");
    for (i, t) in tests.iter().enumerate() {
        println!("{}", header(ws, i, tests.len(), t));
        let status = Command::new(&t.exe)
            .args(TEST_ARGS)
            .current_dir(&t.package_dir)
            .env("CARGO_MANIFEST_DIR", &t.package_dir)
            .env("RDMA_DEVICE_TESTS", "1")
            .status();
        let code = match status {
            Ok(st) => process::exit_code(st),
            Err(e) => {
                step!("cannot run {}: {e}", t.exe.display());
                127
            }
        };
        tally.statuses[i] = Some(code);
        step!("{}: {}", t.name, describe_status(Some(code)));
    }
}

/// Runs every binary in one guest, collecting `RESULT` markers.
fn run_in_guest(
    ws: &Workspace,
    assets: &Assets,
    opts: &GuestOptions,
    tests: &[DeviceTest],
    tally: &mut Tally,
) -> Result<()> {
    let run = GuestRun::new(ws)?;
    let body = guest_body(ws, &run, tests);
    let mut kernel_warning = false;
    let mut ran = 0u64;
    let status = run.run(assets, opts, &body, &mut |key, value| {
        if key == "RESULT" {
            if let Some((i, st)) = tally.record(value) {
                step!("{}: {}", tests[i].name, describe_status(Some(st)));
            }
        } else if key == "TESTS" {
            ran += tests_ran(value);
        } else if key == "KERNEL" {
            kernel_warning = true;
        }
    })?;
    step!("device tests run in the guest: {ran}");
    if kernel_warning {
        return Err(Error::new(
            "the guest kernel logged a warning during the device tests (see above): \
             a test triggered a kernel bug, and later tests may have run on a broken device",
        ));
    }
    if tally.statuses.iter().any(Option::is_none) {
        return Err(Error::new(format!(
            "the guest script ended (status {}) without reporting every device test",
            status
        )));
    }
    Ok(())
}

/// The count in a `TESTS` marker's value, `<index>=<tests run>` (0 if malformed).
fn tests_ran(value: &str) -> u64 {
    value
        .split_once('=')
        .and_then(|(_, n)| n.trim().parse().ok())
        .unwrap_or(0)
}

/// libtest's colour option for the guest, where it would always see a terminal.
fn color_arg(host_stdout_is_terminal: bool) -> &'static str {
    if host_stdout_is_terminal {
        "--color=always"
    } else {
        "--color=never"
    }
}

/// Shell code, after a binary ran with its output in `$log`: `ran` is the number of
/// tests libtest says passed, and a binary that exited 0 having run none fails
/// (status 125): a device test binary whose tests were all compiled out or
/// filtered away proves nothing.
///
/// libtest's own summary is the last such line (a child may print one first), and
/// with `--color=always` its "ok" is wrapped in escape codes.
const RAN_TESTS: &str = "ran=$(sed -n 's/^test result: [^ ]*\\. \\([0-9][0-9]*\\) passed;.*/\\1/p' \"$log\" | tail -n 1)\n\
     ran=${ran:-0}\n\
     if [ $st -eq 0 ] && [ \"$ran\" -eq 0 ]; then echo 'xtask-guest: this binary ran no test'; st=125; fi\n";

/// The shell code that runs every test binary and reports each status.
fn guest_body(ws: &Workspace, run: &GuestRun, tests: &[DeviceTest]) -> String {
    let mut body = String::from("failed=0\n");
    for (i, t) in tests.iter().enumerate() {
        let dir = sh_quote(&t.package_dir.to_string_lossy());
        let mut argv = vec![t.exe.to_string_lossy().into_owned()];
        argv.extend(TEST_ARGS.iter().map(|s| s.to_string()));
        // The guest console is a terminal; colour only if ours is one too.
        argv.push(color_arg(std::io::stdout().is_terminal()).to_string());
        // The output goes to a file that `tail` shows as it grows (a pipe would
        // wait for every process that inherited it), so that the count of tests
        // run can be read from libtest's summary line.
        body.push_str(&format!(
            "echo {}\nlog=\"${{TMPDIR:-/tmp}}/xtask-device-test-{i}.log\"\n: > \"$log\"\n\
             ( cd {dir} && CARGO_MANIFEST_DIR={dir} exec {} ) > \"$log\" 2>&1 &\n\
             pid=$!\ntail -s 0.2 -n +1 -f --pid=$pid \"$log\"\nwait $pid\nst=$?\n{RAN_TESTS}\
             {}\n{}\n[ $st -eq 0 ] || failed=$((failed + 1))\n",
            sh_quote(&header(ws, i, tests.len(), t)),
            sh_join(&argv),
            run.marker("TESTS", &format!("{i}=$ran")),
            run.marker("RESULT", &format!("{i}=$st")),
        ));
    }
    // A kernel warning (an rxe bug hit by some test) can break the device for every
    // test after it: report it, with the kernel's own lines, as a failure.
    body.push_str(&format!(
        "if dmesg | grep -q -e 'cut here' -e 'BUG:'; then\n\
         echo 'xtask-guest: the guest kernel logged a warning during the device tests:'\n\
         dmesg | grep -A14 -e 'cut here' -e 'BUG:' | head -60\n\
         {}\nfailed=$((failed + 1))\nfi\n",
        run.marker("KERNEL", "warning")
    ));
    body.push_str("[ $failed -eq 0 ]");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(pkg: &str, kind: &str, name: &str, exe: Option<&str>) -> Artifact {
        Artifact {
            target_name: name.into(),
            kinds: vec![kind.into()],
            manifest_path: PathBuf::from(format!("/ws/{pkg}/Cargo.toml")),
            executable: exe.map(PathBuf::from),
        }
    }

    #[test]
    fn picks_device_tests() {
        let ws = Workspace::at(PathBuf::from("/ws"));
        let arts = [
            artifact(
                "rdma-safe",
                "test",
                "device_verbs",
                Some("/ws/target/debug/deps/device_verbs-1"),
            ),
            artifact(
                "rdma-safe",
                "test",
                "device_verbs",
                Some("/ws/target/debug/deps/device_verbs-1"),
            ),
            artifact(
                "examples",
                "test",
                "device_interop",
                Some("/ws/target/debug/deps/device_interop-2"),
            ),
            artifact(
                "rdma-safe",
                "test",
                "api",
                Some("/ws/target/debug/deps/api-3"),
            ),
            artifact(
                "rdma-safe",
                "lib",
                "rdma_safe",
                Some("/ws/target/debug/deps/rdma_safe-4"),
            ),
            artifact("rdma-verbs-sys", "lib", "rdma_verbs_sys", None),
        ];
        let t = device_tests(&ws, &arts);
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["examples/device_interop", "rdma-safe/device_verbs"]);
        assert_eq!(t[1].package_dir, PathBuf::from("/ws/rdma-safe"));
        assert_eq!(
            header(&ws, 1, 2, &t[1]),
            "==> device test 2/2: rdma-safe/device_verbs (target/debug/deps/device_verbs-1)"
        );
    }

    #[test]
    fn guest_body_reports_each_binary() {
        // Fake "test binaries" (sh scripts) run by the body on the host.
        let ws = Workspace::locate().unwrap();
        let dir = ws
            .target
            .join(format!("xtask-test-body-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.sh");
        let bad = dir.join("bad.sh");
        let none = dir.join("none.sh");
        std::fs::write(&ok, "#!/bin/sh\n[ \"$1 $2\" = '--include-ignored --test-threads=1' ] && case \"$3\" in --color=*) ;; *) exit 9 ;; esac && [ \"$CARGO_MANIFEST_DIR\" = \"$PWD\" ] && echo 'test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s'\n").unwrap();
        std::fs::write(&bad, "#!/bin/sh\nexit 101\n").unwrap();
        std::fs::write(&none, "#!/bin/sh\necho 'test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out; finished in 0.00s'\n").unwrap();
        // libtest with --color=always, after a child's own summary line.
        let colour = dir.join("colour.sh");
        std::fs::write(&colour, "#!/bin/sh\necho 'test result: ok. 0 passed; 0 failed'\nprintf 'test result: \\033[32mok\\033[m\\017. 2 passed; 0 failed; 0 ignored\\n'\n").unwrap();
        for f in [&ok, &bad, &none, &colour] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let tests = [
            DeviceTest {
                name: "a/device_ok".into(),
                exe: ok,
                package_dir: ws.root.join("xtask"),
            },
            DeviceTest {
                name: "b/device_bad".into(),
                exe: bad,
                package_dir: ws.root.clone(),
            },
            DeviceTest {
                name: "c/device_none".into(),
                exe: none,
                package_dir: ws.root.clone(),
            },
            DeviceTest {
                name: "d/device_colour".into(),
                exe: colour,
                package_dir: ws.root.clone(),
            },
        ];
        let run = GuestRun::new(&ws).unwrap();
        let body = guest_body(&ws, &run, &tests);
        let out = Command::new("sh")
            .arg("-c")
            .arg(&body)
            .env("TMPDIR", &dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        let mut tally = Tally::new(4);
        let mut ran = Vec::new();
        for line in text.lines() {
            if let Some(m) = crate::guest::parse_marker(line, run.nonce()) {
                match m.key {
                    "RESULT" => drop(tally.record(m.value).unwrap()),
                    "TESTS" => ran.push(tests_ran(m.value)),
                    other => panic!("marker {other}"),
                }
            }
        }
        // The binary that ran no test fails though it exited 0.
        assert_eq!(tally.statuses, [Some(0), Some(101), Some(125), Some(0)]);
        assert_eq!(ran, [3, 0, 0, 2]);
        assert!(text.contains("==> device test 1/4: a/device_ok"));
        assert!(text.contains("test result: ok. 3 passed"), "{text}");
        assert!(
            text.contains("xtask-guest: this binary ran no test"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
