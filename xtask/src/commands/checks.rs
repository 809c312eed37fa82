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
pub const PUBLISHED: &[&str] = &["rdma-sys", "rdma-safe", "kiara-ib"];

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

/// The checks, in the order they run. `docs_rs_target` is a target directory of
/// their own for the docs.rs build, so that its `DOCS_RS` does not rebuild the
/// normal one's rdma-sys each time.
pub fn checks(docs_rs_target: &Path) -> Vec<Check> {
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
            fix: "the pregenerated bindings (rdma-sys/src/pregenerated.rs) lack something \
                  the crates use: refresh them with `cargo xtask bindings`",
        },
        Check {
            what: "publish dry run of rdma-sys, rdma-safe and kiara-ib",
            // `--workspace` packages the three together and verifies each against the
            // others' packages (a local registry overlay), as crates.io will see them.
            // `--allow-dirty`: the check is about what the tree holds, committed or not.
            args: strings(&["publish", "--dry-run", "--workspace", "--allow-dirty"]),
            env: Vec::new(),
            fix: "fix the packaging error above (metadata in Cargo.toml, a file outside \
                  the crate, a path dependency without a version)",
        },
    ]
}

/// Runs every check in the workspace; fails with the list of those that failed.
pub fn run_all(ws: &Workspace) -> Result<()> {
    let list = checks(&target_dir(ws).join("docs-rs"));
    let mut failed = Vec::new();
    for (i, check) in list.iter().enumerate() {
        step!(
            "check {}/{}: {}: {}",
            i + 1,
            list.len(),
            check.what,
            check.command_line()
        );
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
        let list = checks(Path::new("t/docs-rs"));
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
            "RUSTDOCFLAGS='-D warnings' DOCS_RS=1 cargo doc --no-deps -p rdma-sys \
             -p rdma-safe -p kiara-ib --target-dir t/docs-rs"
        );
        assert_eq!(
            lines[4],
            "cargo publish --dry-run --workspace --allow-dirty"
        );
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
