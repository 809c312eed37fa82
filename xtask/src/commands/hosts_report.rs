//! The summary of the two-host tier, read from the shared directory after the
//! run (see [`super::test_hosts`]): per binary and host its exit status
//! (`done-<binary>-<host>`), per case and host how it ended
//! (`cases/<binary>/<case>/<host>.end`) and what it measured (`<host>.measured`),
//! and which hosts were killed on request (`<host>.killed`).

use std::fs;
use std::path::Path;

use super::test::DeviceTest;
use super::test_hosts::{target, PEER_KILLED};
use crate::hosts::{Host, HOSTS};

/// How a case or binary ended on a host that was killed on request, where that
/// was the plan (in [`PEER_KILLED`]).
const KILLED: &str = "killed on request";

/// One case: `<binary>::<case>`, how it ended on each host (`None`: no end file)
/// and what each host measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseEnd {
    name: String,
    ends: [Option<String>; 2],
    measured: [Option<String>; 2],
}

impl CaseEnd {
    fn passed(&self) -> bool {
        let fine = |e: &Option<String>| matches!(e.as_deref(), Some("ok") | Some(KILLED));
        self.ends.iter().all(fine)
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
pub struct Report {
    /// Per binary: its name and its exit status on each host (`Err`: why none).
    binaries: Vec<(String, [Result<i32, &'static str>; 2])>,
    /// Every case, in the order they ran (binary), then by name.
    cases: Vec<CaseEnd>,
    /// Per host: its kernel logged a warning.
    kernel_warning: [bool; 2],
}

/// A file's trimmed text, if it exists.
fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

impl Report {
    /// Reads the results of `tests` from `shared`.
    pub fn read(shared: &Path, tests: &[DeviceTest]) -> Report {
        let killed = HOSTS.map(|h| shared.join(format!("{}.killed", h.name())).exists());
        let mut r = Report::default();
        for t in tests {
            // A host killed in the peer-killed binary leaves no result there, by design.
            let excused = |h: Host| killed[h.index()] && target(t) == PEER_KILLED;
            let status = HOSTS.map(|h| {
                let file = shared.join(format!("done-{}-{}", target(t), h.name()));
                match read(&file).and_then(|s| s.parse().ok()) {
                    Some(st) => Ok(st),
                    None if excused(h) => Ok(0),
                    None if killed[h.index()] => Err("killed before it ran"),
                    None => Err("no status"),
                }
            });
            r.binaries.push((t.name.clone(), status));
            let dir = shared.join("cases").join(target(t));
            let mut names: Vec<String> = fs::read_dir(&dir)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                })
                .map(Iterator::collect)
                .unwrap_or_default();
            names.sort();
            for name in names {
                let file =
                    |h: Host, what: &str| dir.join(&name).join(format!("{}.{what}", h.name()));
                let ends = HOSTS.map(|h| {
                    read(&file(h, "end")).or_else(|| excused(h).then(|| KILLED.to_string()))
                });
                let measured = HOSTS.map(|h| read(&file(h, "measured")));
                let name = format!("{}::{name}", target(t));
                r.cases.push(CaseEnd {
                    name,
                    ends,
                    measured,
                });
            }
        }
        r.kernel_warning =
            HOSTS.map(|h| shared.join(format!("kernel-warning-{}", h.name())).exists());
        r
    }

    /// Prints every case (with what it measured) and the totals; returns
    /// whether everything passed.
    pub fn print(&self) -> bool {
        println!("two-host cases:");
        for c in &self.cases {
            println!("    {}: {}", c.name, c.describe());
            for (h, m) in HOSTS.iter().zip(&c.measured) {
                if let Some(m) = m {
                    println!("        measured on host {}: {m}", h.name());
                }
            }
        }
        let mut ok = !self.cases.is_empty();
        for (name, status) in &self.binaries {
            if status.iter().any(|s| *s != Ok(0)) {
                let s = status.map(|s| s.map_or_else(str::to_string, |st| st.to_string()));
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

    fn test(name: &str) -> DeviceTest {
        DeviceTest {
            name: format!("examples/{name}"),
            exe: PathBuf::from("/x"),
            package_dir: PathBuf::from("/"),
        }
    }

    #[test]
    fn reads_the_shared_directory() {
        let dir = std::env::temp_dir().join(format!("xtask-hosts-report-{}", std::process::id()));
        let case = |c: &str| dir.join("cases/twohost_x").join(c);
        for (c, a, b) in [("one", "ok", "ok"), ("two", "FAILED: boom", "ok")] {
            fs::create_dir_all(case(c)).unwrap();
            fs::write(case(c).join("a.end"), a).unwrap();
            fs::write(case(c).join("b.end"), b).unwrap();
        }
        fs::write(case("one").join("a.measured"), "3 s\n").unwrap();
        fs::create_dir_all(case("three")).unwrap();
        fs::write(dir.join("done-twohost_x-a"), "101\n").unwrap();
        fs::write(dir.join("done-twohost_x-b"), "0\n").unwrap();
        let r = Report::read(&dir, &[test("twohost_x")]);
        assert_eq!(
            r.binaries,
            [("examples/twohost_x".to_string(), [Ok(101), Ok(0)])]
        );
        let names: Vec<&str> = r.cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["twohost_x::one", "twohost_x::three", "twohost_x::two"]
        );
        assert_eq!(r.cases[0].describe(), "passed");
        assert_eq!(r.cases[0].measured, [Some("3 s".to_string()), None]);
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
    fn a_host_killed_by_the_peer_killed_case_is_excused_there_only() {
        let dir = std::env::temp_dir().join(format!("xtask-hosts-killed-{}", std::process::id()));
        let case = dir.join("cases").join(PEER_KILLED).join("kill");
        fs::create_dir_all(&case).unwrap();
        fs::write(case.join("a.end"), "ok").unwrap();
        fs::write(dir.join("b.killed"), "").unwrap();
        fs::write(dir.join(format!("done-{PEER_KILLED}-a")), "0").unwrap();
        let r = Report::read(&dir, &[test(PEER_KILLED)]);
        assert!(r.cases[0].passed(), "{:?}", r.cases[0]);
        assert_eq!(r.binaries[0].1, [Ok(0), Ok(0)]);
        assert!(r.print());
        let r = Report::read(&dir, &[test("twohost_x")]);
        assert_eq!(
            r.binaries[0].1,
            [Err("no status"), Err("killed before it ran")]
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
