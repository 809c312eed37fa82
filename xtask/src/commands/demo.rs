//! `cargo xtask demo`: build the examples in release mode and run the demo in one guest.

use std::path::PathBuf;

use super::{describe_status, Tally};
use crate::cargo;
use crate::error::{Error, Result};
use crate::guest::GuestRun;
use crate::process::{sh_join, sh_quote};
use crate::workspace::Workspace;
use crate::{step, GuestOptions};

/// The demo, in order: each step runs a binary of the `examples` package
/// (`target/release/<name>`) with these arguments. Edit this list to change the demo.
#[rustfmt::skip]
pub const DEMO: &[(&str, &[&str])] = &[
    ("ibv_devinfo", &[]),
    ("rdma_loopback", &["-n", "50"]),
    ("kiara-demo", &["-c", "4", "-n", "20"]),
];

/// Runs the command; returns the exit code for xtask.
pub fn run(opts: &GuestOptions) -> Result<i32> {
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    step!("building the examples: cargo build --release -p examples --bins");
    let artifacts = cargo::build_artifacts(
        &ws.root,
        &["build", "--release", "-p", "examples", "--bins"],
    )
    .map_err(|e| Error::new(format!("building the examples failed: {e}")))?;
    let (steps, missing) = demo_steps(&ws, &artifacts);
    if steps.is_empty() {
        return Err(Error::new(format!(
            "none of the demo binaries exist yet ({}); nothing to run",
            missing.join(", ")
        )));
    }

    let run = GuestRun::new(&ws)?;
    let body = script(&run, &steps);
    let mut tally = Tally::new(steps.len());
    let result = run.run(&assets, opts, &body, &mut |key, value| {
        if key == "RESULT" {
            if let Some((i, st)) = tally.record(value) {
                if st != 0 {
                    step!(
                        "demo step `{}` {}",
                        steps[i].join(" "),
                        describe_status(Some(st))
                    );
                }
            }
        }
    });
    result?;
    step!(
        "demo: {} steps passed, {} failed",
        tally.passed(),
        tally.failed()
    );
    if !missing.is_empty() {
        return Err(Error::new(format!(
            "demo incomplete: binaries not built yet: {}",
            missing.join(", ")
        )));
    }
    Ok(if tally.failed() == 0 { 0 } else { 1 })
}

/// The command line of each demo step whose binary was built (as the guest runs
/// it), and the names of those that were not.
fn demo_steps(
    ws: &Workspace,
    artifacts: &[cargo::Artifact],
) -> (Vec<Vec<String>>, Vec<&'static str>) {
    let find = |name: &str| -> Option<PathBuf> {
        artifacts
            .iter()
            .filter(|a| a.is_bin() && a.target_name == name)
            .find_map(|a| a.executable.clone())
    };
    let mut steps = Vec::new();
    let mut missing = Vec::new();
    for (name, args) in DEMO {
        match find(name) {
            Some(exe) => {
                let mut argv = vec![ws.display(&exe)];
                argv.extend(args.iter().map(|a| a.to_string()));
                steps.push(argv);
            }
            None => {
                step!(
                    "demo step `{name}`: the examples package has no binary `{name}` \
                     (expected examples/src/bin/{name}.rs or a [[bin]] entry); skipping it"
                );
                missing.push(*name);
            }
        }
    }
    (steps, missing)
}

/// The guest's script: each step's header, the step, and its exit status as a
/// `RESULT` marker.
fn script(run: &GuestRun, steps: &[Vec<String>]) -> String {
    let mut body = String::new();
    for (i, argv) in steps.iter().enumerate() {
        let header = format!("==> demo {}/{}: {}", i + 1, steps.len(), argv.join(" "));
        body.push_str(&format!(
            "echo {}\n{}\n{}\n",
            sh_quote(&header),
            sh_join(argv),
            run.marker("RESULT", &format!("{i}=$?")),
        ));
    }
    body
}
