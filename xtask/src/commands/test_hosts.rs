//! The two-host tier of `cargo xtask test`: every `tests/twohost_*.rs` binary runs
//! on both guests of a pair ([`crate::pair`]), in the same order, as
//! `<exe> --include-ignored --test-threads=1`; its tests (cases) keep in lockstep
//! through the shared directory (`examples::twohost`), host b serving and host a
//! the client. Afterwards the shared directory holds, per binary and host, its
//! exit status (`done-<binary>-<host>`) and, per case and host, how it ended
//! (`cases/<binary>/<case>/<host>.end`): the summary is made from those.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use super::test::DeviceTest;
use crate::cargo::{self, Artifact};
use crate::error::{Error, Result};
use crate::guest::Assets;
use crate::hosts::{Host, HOSTS};
use crate::pair::{HostEnd, Pair};
use crate::process::{sh_join, sh_quote};
use crate::workspace::Workspace;
use crate::{step, GuestOptions, HOST_MEM_MIB};

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
    tests
}

/// The two-host stage of `cargo xtask test`: with guests (`assets`), runs the
/// two-host binaries among `artifacts` and returns whether all passed; with
/// `--no-vm` (no `assets`) says why it does not run (one device, no second host).
pub fn stage(ws: &Workspace, assets: Option<&Assets>, artifacts: &[Artifact]) -> Result<bool> {
    let Some(assets) = assets else {
        step!("two-host tests not run: --no-vm uses this host's one device, they need two guests");
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

/// `cargo xtask test --two-hosts-only`: builds the tests and runs only the
/// two-host tier; returns the exit code for xtask.
pub fn run_only() -> Result<i32> {
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    step!("building the tests: cargo test --workspace --no-run");
    let artifacts = cargo::build_artifacts(&ws.root, &["test", "--workspace", "--no-run"])?;
    let passed = stage(&ws, Some(&assets), &artifacts)?;
    Ok(if passed { 0 } else { 1 })
}

/// The binary's target name: `twohost_cm` for `examples/twohost_cm`.
fn target(t: &DeviceTest) -> &str {
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
    let ends = ends?;
    for (host, end) in HOSTS.iter().zip(ends) {
        if end == HostEnd::Killed {
            return Err(Error::new(format!(
                "host {} was killed before the two-host tests ended",
                host.name()
            )));
        }
    }
    Ok(passed && ends.iter().all(|e| *e == HostEnd::Exited(0)))
}

/// The shell code each host runs: every binary in order, each leaving its status
/// in `done-<binary>-<host>`, then a check of the kernel log.
fn guest_body(tests: &[DeviceTest]) -> String {
    let mut body = String::from("failed=0\n");
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
             [ $st -eq 0 ] || failed=$((failed + 1))\n",
            sh_quote(&header),
            sh_join(&argv),
            target(t),
        ));
    }
    body.push_str(
        "if dmesg | grep -q -e 'cut here' -e 'BUG:'; then\n\
         echo 'xtask-guest: the guest kernel logged a warning during the two-host tests:'\n\
         dmesg | grep -A14 -e 'cut here' -e 'BUG:' | head -60\n\
         : > \"$XTASK_HOSTS_DIR/kernel-warning-$XTASK_HOST\"\n\
         failed=$((failed + 1))\nfi\n[ $failed -eq 0 ]",
    );
    body
}

/// One case: `<binary>::<case>` and how it ended on each host (`None`: no end file).
#[derive(Debug, Clone, PartialEq, Eq)]
struct CaseEnd {
    name: String,
    ends: [Option<String>; 2],
}

impl CaseEnd {
    fn passed(&self) -> bool {
        self.ends.iter().all(|e| e.as_deref() == Some("ok"))
    }

    /// `passed`, or `FAILED (host a: ...; host b: ...)`.
    fn describe(&self) -> String {
        if self.passed() {
            return "passed".into();
        }
        let side = |h: Host| {
            let e = self.ends[h.index()].as_deref();
            format!("host {}: {}", h.name(), e.unwrap_or("no result"))
        };
        format!("FAILED ({}; {})", side(Host::A), side(Host::B))
    }
}

/// What the shared directory says after the run.
#[derive(Debug, Default)]
struct Report {
    /// Per binary: its name and its exit status on each host.
    binaries: Vec<(String, [Option<i32>; 2])>,
    /// Every case, sorted.
    cases: Vec<CaseEnd>,
    /// Per host: its kernel logged a warning.
    kernel_warning: [bool; 2],
}

impl Report {
    fn read(shared: &Path, tests: &[DeviceTest]) -> Report {
        let read = |p: &Path| fs::read_to_string(p).ok().map(|s| s.trim().to_string());
        let mut r = Report::default();
        for t in tests {
            let status = HOSTS.map(|h| {
                let file = shared.join(format!("done-{}-{}", target(t), h.name()));
                read(&file).and_then(|s| s.parse().ok())
            });
            r.binaries.push((t.name.clone(), status));
            let cases = shared.join("cases").join(target(t));
            let mut names: Vec<String> = fs::read_dir(&cases)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                })
                .map(Iterator::collect)
                .unwrap_or_default();
            names.sort();
            for name in names {
                let ends =
                    HOSTS.map(|h| read(&cases.join(&name).join(format!("{}.end", h.name()))));
                let name = format!("{}::{name}", target(t));
                r.cases.push(CaseEnd { name, ends });
            }
        }
        r.kernel_warning =
            HOSTS.map(|h| shared.join(format!("kernel-warning-{}", h.name())).exists());
        r
    }

    /// Prints every case and the totals; returns whether everything passed.
    fn print(&self) -> bool {
        println!("two-host cases:");
        for c in &self.cases {
            println!("    {}: {}", c.name, c.describe());
        }
        let mut ok = !self.cases.is_empty();
        for (name, status) in &self.binaries {
            if status.iter().any(|s| *s != Some(0)) {
                let s = status.map(|s| s.map_or("no status".to_string(), |s| s.to_string()));
                println!(
                    "two-host binary {name} failed (host a: {}, host b: {})",
                    s[0], s[1]
                );
                ok = false;
            }
        }
        for h in HOSTS.iter().filter(|h| self.kernel_warning[h.index()]) {
            println!(
                "host {}: the guest kernel logged a warning (see its lines above)",
                h.name()
            );
            ok = false;
        }
        let passed = self.cases.iter().filter(|c| c.passed()).count();
        let failed = self.cases.len() - passed;
        println!("two-host-tests: {passed} cases passed, {failed} failed");
        ok && failed == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn reads_the_shared_directory() {
        let dir = std::env::temp_dir().join(format!("xtask-hosts-report-{}", std::process::id()));
        let case = |c: &str| dir.join("cases/twohost_x").join(c);
        for (c, a, b) in [("one", "ok", "ok"), ("two", "FAILED: boom", "ok")] {
            fs::create_dir_all(case(c)).unwrap();
            fs::write(case(c).join("a.end"), a).unwrap();
            fs::write(case(c).join("b.end"), b).unwrap();
        }
        fs::create_dir_all(case("three")).unwrap();
        fs::write(dir.join("done-twohost_x-a"), "101\n").unwrap();
        fs::write(dir.join("done-twohost_x-b"), "0\n").unwrap();
        let t = DeviceTest {
            name: "examples/twohost_x".into(),
            exe: PathBuf::from("/x"),
            package_dir: PathBuf::from("/"),
        };
        let r = Report::read(&dir, &[t]);
        assert_eq!(
            r.binaries,
            [("examples/twohost_x".to_string(), [Some(101), Some(0)])]
        );
        let names: Vec<&str> = r.cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["twohost_x::one", "twohost_x::three", "twohost_x::two"]
        );
        assert_eq!(r.cases[0].describe(), "passed");
        assert_eq!(
            r.cases[1].describe(),
            "FAILED (host a: no result; host b: no result)"
        );
        assert_eq!(
            r.cases[2].describe(),
            "FAILED (host a: FAILED: boom; host b: ok)"
        );
        assert!(!r.print());
        fs::remove_dir_all(&dir).unwrap();
    }

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
    }
}
