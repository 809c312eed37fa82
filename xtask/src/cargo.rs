//! Running cargo, and reading the artifacts it reports with `--message-format=json`.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Context, Error, Result};
use crate::json::Json;
use crate::process;

/// The cargo to run: the one that started us (`$CARGO`), else `cargo` from PATH.
pub fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// A `compiler-artifact` message: one target cargo built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The target's name, e.g. `device_verbs` for `tests/device_verbs.rs`.
    pub target_name: String,
    /// The target's kinds, e.g. `["test"]`, `["bin"]`, `["lib"]`.
    pub kinds: Vec<String>,
    /// The package's `Cargo.toml`.
    pub manifest_path: PathBuf,
    /// The executable, for binaries and test harnesses.
    pub executable: Option<PathBuf>,
}

impl Artifact {
    /// Parses one line of cargo's JSON output; `None` for any other message.
    pub fn from_json_line(line: &str) -> Option<Artifact> {
        let line = line.trim();
        if !line.starts_with('{') || !line.contains("\"compiler-artifact\"") {
            return None;
        }
        let msg = Json::parse(line).ok()?;
        if msg.get("reason")?.as_str()? != "compiler-artifact" {
            return None;
        }
        let target = msg.get("target")?;
        Some(Artifact {
            target_name: target.get("name")?.as_str()?.to_string(),
            kinds: target
                .get("kind")?
                .as_array()?
                .iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect(),
            manifest_path: PathBuf::from(msg.get("manifest_path")?.as_str()?),
            executable: msg
                .get("executable")
                .and_then(Json::as_str)
                .map(PathBuf::from),
        })
    }

    /// The package's directory (where its `Cargo.toml` is).
    pub fn package_dir(&self) -> &Path {
        self.manifest_path.parent().unwrap_or(Path::new("."))
    }

    /// Whether this is a device test: an integration test target (kind
    /// `test`) named `device*`, i.e. built from `tests/device_*.rs`, with an executable.
    pub fn is_device_test(&self) -> bool {
        self.kinds.iter().any(|k| k == "test")
            && self.target_name.starts_with("device")
            && self.executable.is_some()
    }

    /// Whether this is a two-host test: an integration test target named
    /// `twohost*` (from `tests/twohost_*.rs`) with an executable.
    pub fn is_two_host_test(&self) -> bool {
        self.kinds.iter().any(|k| k == "test")
            && self.target_name.starts_with("twohost")
            && self.executable.is_some()
    }

    /// Whether this is a binary target with an executable.
    pub fn is_bin(&self) -> bool {
        self.kinds.iter().any(|k| k == "bin") && self.executable.is_some()
    }
}

/// Whether a line is cargo's final `build-finished` message, and if so, its `success`.
pub fn build_finished(line: &str) -> Option<bool> {
    if !line.contains("\"build-finished\"") {
        return None;
    }
    let msg = Json::parse(line.trim()).ok()?;
    if msg.get("reason")?.as_str()? != "build-finished" {
        return None;
    }
    msg.get("success")?.as_bool()
}

/// Runs `cargo <command> --message-format=json-render-diagnostics <rest>` in
/// `dir` (`args` is the command and the rest, which may end in `-- <rustc args>`:
/// the format goes before it, or rustc would get it), with diagnostics and
/// progress on our stderr, and returns the artifacts it built. Fails if the
/// build fails or `args` is empty.
pub fn build_artifacts(dir: &Path, args: &[&str]) -> Result<Vec<Artifact>> {
    let Some((command, rest)) = args.split_first() else {
        return Err(Error::new("build_artifacts: no cargo command given"));
    };
    let mut cmd = Command::new(cargo());
    cmd.current_dir(dir)
        .arg(command)
        .arg("--message-format=json-render-diagnostics")
        .args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let shown = format!("cargo {}", args.join(" "));
    let mut child = cmd.spawn().context(format!("cannot run `{shown}`"))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut artifacts = Vec::new();
    let mut finished = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.context(format!("reading the output of `{shown}`"))?;
        if let Some(a) = Artifact::from_json_line(&line) {
            artifacts.push(a);
        } else if let Some(ok) = build_finished(&line) {
            finished = Some(ok);
        }
    }
    let st = child.wait().context(format!("waiting for `{shown}`"))?;
    if !st.success() || finished == Some(false) {
        return Err(Error::new(format!(
            "`{shown}` failed ({}); see the compiler messages above",
            process::exit_code(st)
        )));
    }
    Ok(artifacts)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shapes cargo 1.7x-1.9x prints (one line each; wrapped here for reading).
    const DEVICE_TEST: &str = concat!(
        r#"{"reason":"compiler-artifact","package_id":"path+file:///ws/rdma-safe#0.1.0","#,
        r#""manifest_path":"/ws/rdma-safe/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"#,
        r#""name":"device_verbs","src_path":"/ws/rdma-safe/tests/device_verbs.rs","edition":"2021","#,
        r#""doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"#,
        r#""debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"#,
        r#""filenames":["/ws/target/debug/deps/device_verbs-0123abcd"],"#,
        r#""executable":"/ws/target/debug/deps/device_verbs-0123abcd","fresh":false}"#
    );
    const LIB: &str = concat!(
        r#"{"reason":"compiler-artifact","package_id":"path+file:///ws/rdma-verbs-sys#0.1.0","#,
        r#""manifest_path":"/ws/rdma-verbs-sys/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"#,
        r#""name":"rdma_verbs_sys","src_path":"/ws/rdma-verbs-sys/src/lib.rs","edition":"2021","doc":true,"#,
        r#""doctest":true,"test":true},"profile":{"test":false},"features":[],"#,
        r#""filenames":["/ws/target/debug/deps/librdma_verbs_sys-1.rlib"],"executable":null,"fresh":true}"#
    );
    const UNIT_TESTS: &str = concat!(
        r#"{"reason":"compiler-artifact","package_id":"path+file:///ws/device-thing#0.1.0","#,
        r#""manifest_path":"/ws/device-thing/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"#,
        r#""name":"device_thing","src_path":"/ws/device-thing/src/lib.rs","edition":"2021","#,
        r#""doc":true,"doctest":true,"test":true},"profile":{"test":true},"features":[],"#,
        r#""filenames":["/ws/target/debug/deps/device_thing-2"],"#,
        r#""executable":"/ws/target/debug/deps/device_thing-2","fresh":true}"#
    );
    const HOST_TEST: &str = concat!(
        r#"{"reason":"compiler-artifact","package_id":"path+file:///ws/rdma-safe#0.1.0","#,
        r#""manifest_path":"/ws/rdma-safe/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"#,
        r#""name":"api","src_path":"/ws/rdma-safe/tests/api.rs","edition":"2021","doc":false,"#,
        r#""doctest":false,"test":true},"profile":{"test":true},"features":[],"#,
        r#""filenames":["/ws/target/debug/deps/api-3"],"executable":"/ws/target/debug/deps/api-3","fresh":true}"#
    );
    const BIN: &str = concat!(
        r#"{"reason":"compiler-artifact","package_id":"path+file:///ws/examples#0.1.0","#,
        r#""manifest_path":"/ws/examples/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"#,
        r#""name":"rdma_loopback","src_path":"/ws/examples/src/bin/rdma_loopback.rs","edition":"2021","#,
        r#""doc":true,"doctest":false,"test":true},"profile":{"test":false},"features":[],"#,
        r#""filenames":["/ws/target/release/rdma_loopback"],"executable":"/ws/target/release/rdma_loopback","fresh":false}"#
    );

    #[test]
    fn finds_device_tests_only() {
        let a = Artifact::from_json_line(DEVICE_TEST).unwrap();
        assert_eq!(a.target_name, "device_verbs");
        assert_eq!(a.kinds, ["test"]);
        assert_eq!(a.package_dir(), Path::new("/ws/rdma-safe"));
        assert_eq!(
            a.executable.as_deref(),
            Some(Path::new("/ws/target/debug/deps/device_verbs-0123abcd"))
        );
        assert!(a.is_device_test());
        for other in [LIB, UNIT_TESTS, HOST_TEST, BIN] {
            let a = Artifact::from_json_line(other).unwrap();
            assert!(!a.is_device_test(), "{}", a.target_name);
        }
        let lib = Artifact::from_json_line(LIB).unwrap();
        assert_eq!(lib.executable, None);
        assert!(Artifact::from_json_line(BIN).unwrap().is_bin());
    }

    #[test]
    fn ignores_other_messages() {
        for line in [
            r#"{"reason":"build-script-executed","package_id":"x","linked_libs":[],"linked_paths":[],"cfgs":[],"env":[],"out_dir":"/o"}"#,
            r#"{"reason":"build-finished","success":true}"#,
            "   Compiling foo v0.1.0",
            "",
            r#"{"reason":"compiler-artifact""#,
        ] {
            assert_eq!(Artifact::from_json_line(line), None, "{line}");
        }
        assert_eq!(
            build_finished(r#"{"reason":"build-finished","success":true}"#),
            Some(true)
        );
        assert_eq!(
            build_finished(r#"{"reason":"build-finished","success":false}"#),
            Some(false)
        );
        assert_eq!(build_finished(DEVICE_TEST), None);
    }

    /// Cargo's real output for this package: the xtask test harness is found,
    /// and is not a device test.
    #[test]
    #[ignore = "runs cargo; slow"]
    fn real_cargo_output() {
        let ws = crate::workspace::Workspace::locate().unwrap();
        let arts = build_artifacts(&ws.root, &["test", "-p", "xtask", "--no-run"]).unwrap();
        let harness = arts
            .iter()
            .find(|a| a.target_name == "xtask" && a.executable.is_some())
            .expect("xtask test harness");
        assert!(!harness.is_device_test());
        assert_eq!(harness.package_dir(), ws.root.join("xtask"));
    }
}
