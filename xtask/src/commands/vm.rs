//! `cargo xtask vm -- <command...>`: run one command in a Soft-RoCE guest.

use crate::error::Result;
use crate::guest::GuestRun;
use crate::process::sh_join;
use crate::workspace::Workspace;
use crate::GuestOptions;

/// Runs `argv` in a guest with cwd = workspace root, streaming its output,
/// and returns its exit status.
pub fn run(opts: &GuestOptions, argv: &[String]) -> Result<i32> {
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    let run = GuestRun::new(&ws)?;
    let status = run.run(&assets, opts, &sh_join(argv), &mut |_, _| {})?;
    Ok(status)
}
