//! `cargo xtask check`, and the first stage of `cargo xtask test`: the static checks
//! that need no device. Formatting, clippy, the documentation (as built here and as
//! docs.rs builds it, without the rdma-core headers) and the publish dry run of the
//! three published crates.
//!
//! Every check runs even when an earlier one failed, so that one run names every
//! problem; the stage then fails with the list and what to do about each.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cargo;
use crate::error::{Error, Result};
use crate::process;
use crate::step;
use crate::workspace::Workspace;

/// The crates that go to crates.io (the others have `publish = false`).
pub const PUBLISHED: &[&str] = &["rdma-verbs-sys", "rdma-safe", "kiara-ib"];

/// One static check: a cargo command, and what to do when it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What is checked, for messages.
    pub what: &'static str,
    /// The arguments of `cargo`.
    pub args: Vec<String>,
    /// Environment variables set for it.
    pub env: Vec<(&'static str, String)>,
    /// What a person does when it fails.
    pub fix: &'static str,
}

impl Check {
    /// `cargo <args>` as a person would type it, environment first.
    pub fn command_line(&self) -> String {
        let env = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={} ", process::sh_quote(v)));
        let args = process::sh_join(&self.args);
        format!("{}cargo {args}", env.collect::<String>())
    }
}

/// The target directory cargo uses: `CARGO_TARGET_DIR`, else `<root>/target`.
fn target_dir(ws: &Workspace) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => ws.root.join(dir),
        None => ws.target.clone(),
    }
}

/// The checks, in the order they run, for cargo's target directory `target`. The
/// docs.rs build has a target directory of its own below it (`docs-rs`), so that
/// its `DOCS_RS` does not rebuild the normal one's rdma-verbs-sys each time, and so has
/// the publish dry run (`publish-check`), whose builds of our own crates
/// [`forget_unpacked_packages`] removes before each run.
pub fn checks(target: &Path) -> Vec<Check> {
    let docs_rs_target = target.join("docs-rs");
    let publish_target = target.join("publish-check").display().to_string();
    let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let deny = || vec![("RUSTDOCFLAGS", "-D warnings".to_string())];
    let mut docs_rs = strings(&["doc", "--no-deps"]);
    for krate in PUBLISHED {
        docs_rs.extend(strings(&["-p", krate]));
    }
    docs_rs.extend([
        "--target-dir".to_string(),
        docs_rs_target.display().to_string(),
    ]);
    let mut docs_rs_env = deny();
    docs_rs_env.push(("DOCS_RS", "1".to_string()));
    vec![
        Check {
            what: "formatting",
            args: strings(&["fmt", "--all", "--check"]),
            env: Vec::new(),
            fix: "run `cargo fmt --all`",
        },
        Check {
            what: "clippy",
            args: strings(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
            env: Vec::new(),
            fix: "fix the lints above (the workspace denies warnings, missing docs and \
                  unsafe blocks without a `// SAFETY:` comment)",
        },
        Check {
            what: "documentation",
            args: strings(&["doc", "--workspace", "--no-deps"]),
            env: deny(),
            fix: "fix the rustdoc warnings above (broken links, bad code blocks)",
        },
        Check {
            what: "documentation as docs.rs builds it (no rdma-core headers)",
            args: docs_rs,
            env: docs_rs_env,
            fix: "the pregenerated bindings (rdma-verbs-sys/src/pregenerated.rs) lack something \
                  the crates use: refresh them with `cargo xtask bindings`",
        },
        Check {
            what: "publish dry run of rdma-verbs-sys, rdma-safe and kiara-ib",
            // `--workspace` packages the three together and verifies each against the
            // others' packages (a local registry overlay), as crates.io will see them.
            // `--allow-dirty`: the check is about what the tree holds, committed or not.
            args: strings(&[
                "publish",
                "--dry-run",
                "--workspace",
                "--allow-dirty",
                "--target-dir",
                &publish_target,
            ]),
            env: Vec::new(),
            fix: "fix the packaging error above (metadata in Cargo.toml, a file outside \
                  the crate, a path dependency without a version)",
        },
    ]
}

/// Runs every check in the workspace; fails with the list of those that failed.
pub fn run_all(ws: &Workspace) -> Result<()> {
    let target = target_dir(ws);
    let list = checks(&target);
    let mut failed = Vec::new();
    for (i, check) in list.iter().enumerate() {
        step!(
            "check {}/{}: {}: {}",
            i + 1,
            list.len(),
            check.what,
            check.command_line()
        );
        if check.args.first().is_some_and(|a| a == "publish") {
            forget_unpacked_packages(&target.join("publish-check"));
        }
        let mut cmd = Command::new(cargo::cargo());
        cmd.current_dir(&ws.root).args(&check.args);
        for (k, v) in &check.env {
            cmd.env(k, v);
        }
        let st = process::status(&mut cmd)?;
        if !st.success() {
            let code = process::exit_code(st);
            step!("check failed: {} (exit status {code})", check.what);
            failed.push(check);
        }
    }
    if failed.is_empty() {
        step!("all {} static checks passed", list.len());
        return Ok(());
    }
    Err(Error::new(failure_message(&failed)))
}

/// Removes what earlier publish dry runs unpacked of the published crates.
///
/// `cargo publish --dry-run --workspace` verifies each crate against the others'
/// packages through a local registry, and unpacks those into
/// `$CARGO_HOME/registry/src/-<hash>/<crate>-<version>`; a later run of the same
/// version finds that directory and does not unpack again, so it verifies against
/// the old sources (seen: kiara-ib "missing" a method just added to rdma-safe);
/// and cargo takes a registry package for immutable, so it would not rebuild
/// what it built of it either: the builds of our crates in `target` (the dry
/// run's own target directory) go too.
fn forget_unpacked_packages(target: &Path) {
    for sub in ["debug/.fingerprint", "debug/deps", "debug/build"] {
        let entries = std::fs::read_dir(target.join(sub))
            .into_iter()
            .flatten()
            .flatten();
        for path in entries.map(|e| e.path()) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let ours = PUBLISHED.iter().any(|c| {
                let c = c.replace('-', "_");
                name.starts_with(&format!("{c}-")) || name.starts_with(&format!("lib{c}-"))
            }) || PUBLISHED.iter().any(|c| name.starts_with(&format!("{c}-")));
            if ours {
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return;
    };
    let dirs = std::fs::read_dir(&src).into_iter().flatten().flatten();
    for registry in dirs.map(|e| e.path()) {
        let unpacked = std::fs::read_dir(&registry).into_iter().flatten().flatten();
        for dir in unpacked.map(|e| e.path()) {
            if is_stale_local_package(&dir) {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}

/// Whether `dir` (below `registry/src`) is one of ours unpacked from a local
/// registry: the registry's directory name starts with `-` (crates.io's is
/// `index.crates.io-<hash>`) and the package is `<published crate>-<version>`.
fn is_stale_local_package(dir: &Path) -> bool {
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_string);
    let (Some(pkg), Some(registry)) = (name(dir), dir.parent().and_then(name)) else {
        return false;
    };
    registry.starts_with('-')
        && PUBLISHED.iter().any(|c| {
            pkg.strip_prefix(c)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|v| v.starts_with(|ch: char| ch.is_ascii_digit()))
        })
}

/// The error of a failed check stage: each failed check, its command and the fix.
pub fn failure_message(failed: &[&Check]) -> String {
    let mut text = format!("{} static check(s) failed; no test was run:", failed.len());
    for check in failed {
        text.push_str(&format!(
            "\n  - {}: `{}` failed; {}",
            check.what,
            check.command_line(),
            check.fix
        ));
    }
    text
}

/// `cargo xtask check`: the checks alone.
pub fn run() -> Result<i32> {
    let ws = Workspace::locate()?;
    run_all(&ws)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checks_cover_what_ci_needs() {
        let list = checks(Path::new("t"));
        let lines: Vec<String> = list.iter().map(Check::command_line).collect();
        assert_eq!(lines[0], "cargo fmt --all --check");
        assert_eq!(
            lines[1],
            "cargo clippy --workspace --all-targets -- -D warnings"
        );
        assert_eq!(
            lines[2],
            "RUSTDOCFLAGS='-D warnings' cargo doc --workspace --no-deps"
        );
        assert_eq!(
            lines[3],
            "RUSTDOCFLAGS='-D warnings' DOCS_RS=1 cargo doc --no-deps -p rdma-verbs-sys \
             -p rdma-safe -p kiara-ib --target-dir t/docs-rs"
        );
        assert_eq!(
            lines[4],
            "cargo publish --dry-run --workspace --allow-dirty --target-dir t/publish-check"
        );
    }

    #[test]
    fn only_our_crates_from_local_registries_are_forgotten() {
        let yes = |p: &str| is_stale_local_package(Path::new(p));
        assert!(yes(
            "/h/.cargo/registry/src/-14cd1cce6819ff87/rdma-safe-0.1.0"
        ));
        assert!(yes("/h/.cargo/registry/src/-14cd/kiara-ib-0.2.0"));
        assert!(!yes(
            "/h/.cargo/registry/src/index.crates.io-1949/rdma-verbs-sys-0.1.0"
        ));
        assert!(!yes("/h/.cargo/registry/src/-14cd/rdma-safe-extras-0.1.0"));
        assert!(!yes("/h/.cargo/registry/src/-14cd/libc-0.2.0"));
    }

    #[test]
    fn a_failure_names_the_command_and_the_fix() {
        let list = checks(Path::new("d"));
        let text = failure_message(&[&list[0], &list[4]]);
        assert!(text.starts_with("2 static check(s) failed"), "{text}");
        assert!(
            text.contains("formatting: `cargo fmt --all --check` failed; run `cargo fmt --all`"),
            "{text}"
        );
        assert!(
            text.contains("a path dependency without a version"),
            "{text}"
        );
    }
}
