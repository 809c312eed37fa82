//! `cargo xtask vm [--hosts 2] -- <command...>`: run one command in a Soft-RoCE
//! guest, or in each of two guests on a virtual wire.

use crate::error::Result;
use crate::guest::GuestRun;
use crate::pair::{HostEnd, Pair};
use crate::process::sh_join;
use crate::workspace::Workspace;
use crate::{step, GuestOptions};

/// Runs `argv` in a guest (or in each of `hosts` = 2) with cwd = workspace root,
/// streaming its output, and returns its exit status (the first non-zero one of
/// two hosts).
pub fn run(opts: &GuestOptions, argv: &[String], hosts: u32) -> Result<i32> {
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    let body = sh_join(argv);
    if hosts == 2 {
        let pair = Pair::new(&ws)?;
        let ends = pair.run(
            &assets,
            opts,
            [&body, &body],
            [&mut |_, _| {}, &mut |_, _| {}],
        )?;
        step!(
            "host a: {}; host b: {}",
            describe(ends[0]),
            describe(ends[1])
        );
        return Ok(ends
            .iter()
            .map(|e| match e {
                HostEnd::Exited(st) => *st,
                HostEnd::Killed => 137,
            })
            .find(|st| *st != 0)
            .unwrap_or(0));
    }
    let run = GuestRun::new(&ws)?;
    let status = run.run(&assets, opts, &body, &mut |_, _| {})?;
    Ok(status)
}

fn describe(end: HostEnd) -> String {
    match end {
        HostEnd::Exited(st) => format!("exit status {st}"),
        HostEnd::Killed => "killed on request".to_string(),
    }
}
