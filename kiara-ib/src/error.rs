//! Errors of the transport.

use std::borrow::Cow;

/// Result of the transport's calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A verb failed (device, memory registration, queue pair, ...).
    #[error(transparent)]
    Rdma(#[from] rdma_safe::Error),
    /// The session is closed; the text says why (peer gone, protocol violation, ...).
    #[error("session closed: {0}")]
    Closed(String),
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(#[from] crate::protocol::ProtocolError),
    /// A wait ended before the operation did.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(std::time::Duration, &'static str),
    /// Socket trouble during bootstrap.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: Cow<'static, str>,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The call does not fit the transport's state or configuration.
    #[error("{0}")]
    Usage(Cow<'static, str>),
}

impl Error {
    pub(crate) fn io(what: impl Into<Cow<'static, str>>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
