//! Errors: every failure names the verb, the errno and, where one helps, a hint.

use std::borrow::Cow;
use std::io;

/// Result of the safe verbs.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of a verb or of this crate's checks.
///
/// New variants may come in a minor release: match with a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb returned an error.
    #[error("{verb} failed: {source}{}", hint_text(hint))]
    Verb {
        /// The libibverbs or librdmacm function, e.g. `ibv_reg_mr`.
        verb: &'static str,
        /// The errno it reported.
        #[source]
        source: io::Error,
        /// What a person can do about it, when known.
        hint: Option<Cow<'static, str>>,
    },
    /// `ibv_get_device_list` found no device at all.
    #[error(
        "no RDMA device found: load a driver (e.g. `rdma link add rxe0 type rxe netdev eth0` \
         for Soft-RoCE) or run inside the project's guest (`cargo xtask vm -- ...`)"
    )]
    NoDevice,
    /// The named device does not exist.
    #[error("RDMA device `{wanted}` not found (devices here: {available})")]
    DeviceNotFound {
        /// The name asked for.
        wanted: String,
        /// The names that exist, comma-separated.
        available: String,
    },
    /// A work request completed with an error status.
    #[error("work request {wr_id} completed with {text} ({status:?}, vendor error {vendor_err:#x}){}", hint.map(|h| format!(" (hint: {h})")).unwrap_or_default())]
    Completion {
        /// The status.
        status: rdma_verbs_sys::ibv_wc_status,
        /// `ibv_wc_status_str` of the status.
        text: String,
        /// The work request's id.
        wr_id: u64,
        /// The provider's own error code.
        vendor_err: u32,
        /// What usually causes it.
        hint: Option<&'static str>,
    },
    /// A peer sent bytes that do not follow the protocol.
    #[error("protocol error: {0}")]
    Protocol(Cow<'static, str>),
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: Cow<'static, str>,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A post failed after the provider had queued its request (or, in a chain,
    /// the requests before the one it named): Soft-RoCE and siw write each request
    /// into the queue before they ring the device's doorbell with a `write(2)` to
    /// the device file, which can fail (`EACCES` once the process's credentials
    /// changed since it opened the device; `ENOMEM`). The request may still run
    /// whenever something else wakes the device's queue, so its buffers are the
    /// device's as if the post had succeeded: until its completion, or the queue
    /// pair's destruction.
    #[error(
        "{verb} failed, and its work request may have been queued: {source} (hint: \
         the request may still run, so its buffers stay with the queue pair until \
         its completion or the queue pair's destruction; Soft-RoCE's doorbell is \
         refused with EACCES once the process changed its credentials, e.g. setuid \
         or a new session keyring, after opening the device)"
    )]
    Queued {
        /// The verb: `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`,
        /// `ibv_bind_mw` or `ibv_wr_complete`.
        verb: &'static str,
        /// The errno it reported.
        #[source]
        source: io::Error,
    },
    /// An argument was rejected before any verb was called.
    #[error("invalid argument: {0}")]
    InvalidArgument(Cow<'static, str>),
    /// The process switched off something rdma-safe's guarantees rest on (see
    /// `docs/safety.md`), so it goes no further.
    #[error("refused: {0}")]
    Refused(Cow<'static, str>),
}

fn hint_text(hint: &Option<Cow<'static, str>>) -> String {
    match hint {
        Some(h) => format!(" (hint: {h})"),
        None => String::new(),
    }
}

impl Error {
    /// The error of `verb` from `errno` (the `errno` variable or a returned value).
    pub fn verb(verb: &'static str, errno: i32) -> Self {
        Error::Verb {
            verb,
            source: io::Error::from_raw_os_error(errno),
            hint: None,
        }
    }

    /// The error of `verb` from the current `errno`.
    pub fn last(verb: &'static str) -> Self {
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        Self::verb(verb, errno)
    }

    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<Cow<'static, str>>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// Adds a hint for the person reading the error.
    pub fn with_hint(mut self, text: impl Into<Cow<'static, str>>) -> Self {
        if let Error::Verb { hint, .. } = &mut self {
            *hint = Some(text.into());
        }
        self
    }

    /// The errno of a failed verb, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verb { source, .. } | Error::Queued { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// True if this is [`Error::Queued`]: a failed post whose request the device
    /// holds anyway.
    pub fn is_queued(&self) -> bool {
        matches!(self, Error::Queued { .. })
    }
}

/// Turns a verb's `int` return (0, a positive errno, or -1 with `errno`) into a result.
pub(crate) fn check(verb: &'static str, ret: i32) -> Result<()> {
    match ret {
        0 => Ok(()),
        r if r > 0 => Err(Error::verb(verb, r)),
        _ => Err(Error::last(verb)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verb_error_names_verb_errno_and_hint() {
        let err = Error::verb("ibv_reg_mr", libc::ENOMEM).with_hint("raise `ulimit -l`");
        let text = err.to_string();
        assert!(text.starts_with("ibv_reg_mr failed: "), "{text}");
        assert!(text.contains("Cannot allocate memory"), "{text}");
        assert!(text.ends_with("(hint: raise `ulimit -l`)"), "{text}");
        assert_eq!(err.errno(), Some(libc::ENOMEM));
    }

    #[test]
    fn check_reads_positive_and_negative_returns() {
        assert!(check("x", 0).is_ok());
        assert_eq!(
            check("x", libc::EINVAL).unwrap_err().errno(),
            Some(libc::EINVAL)
        );
    }
}
