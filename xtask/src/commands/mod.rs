//! The xtask commands: `vm`, `test` (with its static checks and its two-host tier),
//! `demo`, `bench`, `setup`, `check` and `bindings`.

pub mod bench;
pub mod bench_adjacent;
pub mod bench_aggregate;
pub mod bench_code;
pub mod bench_code_functions;
pub mod bench_kiara;
pub mod bench_kiara_report;
pub mod bench_kiara_rounds;
pub mod bench_layouts;
pub mod bench_plan;
pub mod bench_plot;
pub mod bench_report;
pub mod bindings;
pub mod checks;
pub mod demo;
pub mod hosts_report;
pub mod setup;
pub mod test;
pub mod test_hosts;
pub mod vm;

use crate::error::Result;
use crate::guest::Assets;
use crate::workspace::Workspace;
use crate::{initramfs, kernel, packages};

/// Makes sure everything a guest needs is in place: the Debian packages, the
/// kernel and the initramfs (each fetched or rebuilt only when needed).
pub fn prepare_guest(ws: &Workspace) -> Result<Assets> {
    packages::ensure(true)?;
    prepare_kernel_and_initramfs(ws)
}

/// Like [`prepare_guest`], for callers that already checked the packages.
pub fn prepare_kernel_and_initramfs(ws: &Workspace) -> Result<Assets> {
    ws.ensure_vm_dir()?;
    let kernel = kernel::ensure(ws)?;
    let initramfs = initramfs::ensure(ws, &kernel)?;
    Ok(Assets { kernel, initramfs })
}

/// Results of a list of steps that each ran one program, reported one by one.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Per step, its exit status, or `None` if it never reported one.
    pub statuses: Vec<Option<i32>>,
}

impl Tally {
    /// A tally for `n` steps, none reported yet.
    pub fn new(n: usize) -> Self {
        Tally {
            statuses: vec![None; n],
        }
    }

    /// Records a `RESULT` marker value, `<index>=<status>`; returns the index
    /// and status, or `None` if the value is malformed.
    pub fn record(&mut self, value: &str) -> Option<(usize, i32)> {
        let (i, st) = value.split_once('=')?;
        let (i, st) = (
            i.trim().parse::<usize>().ok()?,
            st.trim().parse::<i32>().ok()?,
        );
        *self.statuses.get_mut(i)? = Some(st);
        Some((i, st))
    }

    /// How many steps passed (exit status 0).
    pub fn passed(&self) -> usize {
        self.statuses.iter().filter(|s| **s == Some(0)).count()
    }

    /// How many steps failed or never reported.
    pub fn failed(&self) -> usize {
        self.statuses.len() - self.passed()
    }
}

/// Renders a step's status for messages.
pub fn describe_status(status: Option<i32>) -> String {
    match status {
        Some(0) => "passed".to_string(),
        Some(n) => format!("FAILED (exit status {n})"),
        None => "FAILED (no result: the guest stopped before it ended)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts() {
        let mut t = Tally::new(3);
        assert_eq!(t.record("0=0"), Some((0, 0)));
        assert_eq!(t.record("2=101"), Some((2, 101)));
        assert_eq!(t.record("7=0"), None);
        assert_eq!(t.record("x=0"), None);
        assert_eq!(t.record("1"), None);
        assert_eq!((t.passed(), t.failed()), (1, 2));
        assert_eq!(describe_status(t.statuses[2]), "FAILED (exit status 101)");
        assert!(describe_status(t.statuses[1]).contains("no result"));
    }
}
