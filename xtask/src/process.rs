//! Running host programs, and the few system facts xtask needs.

use std::process::{Command, ExitStatus, Output, Stdio};

use crate::error::{Error, Result};

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// A short rendering of a command for messages: `prog arg1 arg2`.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` with inherited stdio and returns its status; failing to start it is an error.
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    cmd.status()
        .map_err(|e| Error::new(format!("cannot run `{}`: {e}", describe(cmd))))
}

/// Runs `cmd` with inherited stdio and fails unless it exits 0.
pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let st = status(cmd)?;
    if st.success() {
        Ok(())
    } else {
        Err(Error::new(format!("`{}` failed ({st})", describe(cmd))))
    }
}

/// Runs `cmd` with stdin null and captured stdout and stderr; failing to start it is an error.
pub fn output(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|e| Error::new(format!("cannot run `{}`: {e}", describe(cmd))))
}

/// The exit code a shell would report for `st`: the code, or 128 + signal.
pub fn exit_code(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code()
        .or_else(|| st.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Quotes every word of `argv` and joins them with spaces.
pub fn sh_join<S: AsRef<str>>(argv: &[S]) -> String {
    argv.iter()
        .map(|a| sh_quote(a.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("ibv_devinfo"), "ibv_devinfo");
        assert_eq!(sh_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("exit 3"), "'exit 3'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("$HOME"), "'$HOME'");
        assert_eq!(sh_join(&["sh", "-c", "exit 3"]), "sh -c 'exit 3'");
    }

    #[test]
    fn exit_codes() {
        let st = Command::new("sh").args(["-c", "exit 3"]).status().unwrap();
        assert_eq!(exit_code(st), 3);
        let st = Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .status()
            .unwrap();
        assert_eq!(exit_code(st), 137);
    }
}
