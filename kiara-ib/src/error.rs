//! Errors of the transport.

use std::borrow::Cow;

/// Result of the transport's calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
///
/// New variants may come in a minor release: match with a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed (device, memory registration, queue pair, ...).
    #[error(transparent)]
    Rdma(#[from] rdma_safe::Error),
    /// The session is closed, for this reason (peer gone, protocol violation, ...).
    #[error("session closed: {0}")]
    Closed(CloseReason),
    /// The peer refused a message: its acknowledgement carried this code (2: it holds
    /// as many bytes of this session as it may; send again later).
    #[error("the peer refused the message (code {0}{hint})", hint = refusal_hint(*.0))]
    Refused(u64),
    /// The session has as many messages or bytes in flight as it may
    /// (`Config::max_outstanding`, `max_outstanding_bytes`), or the transport's
    /// sessions together as many bytes (`max_outstanding_bytes_total`): wait for
    /// sends to finish, or send with a linger that waits.
    #[error(
        "the session is full: as many messages or bytes in flight as allowed \
         (max_outstanding, max_outstanding_bytes, or max_outstanding_bytes_total for \
         all sessions)"
    )]
    Full,
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(#[from] crate::protocol::ProtocolError),
    /// The message was not sent, and the session goes on: its bytes could not be
    /// registered for the peer to read (the memlock limit, whose error says how to
    /// raise it, or the device's limit of memory windows).
    #[error("the message was not sent: {0}")]
    NotSent(String),
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

/// Why a session closed.
///
/// New variants may come in a minor release: match with a `_` arm.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer said goodbye.
    #[error("the peer disconnected")]
    PeerDisconnected,
    /// The peer's process or host is gone: its bootstrap connection closed or failed.
    #[error("the peer is gone: {0}")]
    PeerGone(String),
    /// The peer broke the protocol (a malformed or lying control message).
    #[error("the peer broke the protocol: {0}")]
    Protocol(String),
    /// The peer did not acknowledge a message in time.
    #[error("the peer did not acknowledge message {id} within {after:?}")]
    AckTimeout {
        /// Our message id.
        id: u64,
        /// The acknowledgement timeout.
        after: std::time::Duration,
    },
    /// The peer's message could not be read in time: its RDMA READs (those queued
    /// behind earlier messages included) had not finished `ack_timeout` after the
    /// first sweep after it arrived (the peer stopped answering them).
    #[error("the peer's message {id} could not be read within {after:?}")]
    ReadTimeout {
        /// The peer's message id.
        id: u64,
        /// The timeout (`Config::ack_timeout`).
        after: std::time::Duration,
    },
    /// Not a close: this message alone was not sent, since its bytes could not be
    /// registered for the peer to read (the memlock limit, or the device's limit of
    /// memory windows); the session goes on. What a send's handle reports as
    /// [`Error::NotSent`].
    #[error("the message could not be registered for the peer to read: {0}")]
    NotRegistered(String),
    /// A control message of ours was not taken by the peer within this long
    /// (`Config::ack_timeout`) of going out: its queue pair posts no receives for
    /// the credits it granted (the device retries such a SEND for ever), or no
    /// longer answers.
    #[error(
        "the peer did not take a control message of ours within {after:?} (its \
         queue pair posts no receives, or does not answer)"
    )]
    SendTimeout {
        /// The timeout (`Config::ack_timeout`).
        after: std::time::Duration,
    },
    /// The peer's queue pair did not answer within this long of the handshake (the
    /// handshake's `Config::timeout`): its RDMA side is missing or cannot reach us.
    /// A client greets over RDMA at once: a server closes a session from which no
    /// control message came, and `connect` fails when the server's queue pair did
    /// not acknowledge the greeting. (Where the device gives up retrying sooner, the
    /// greeting fails first, as [`CloseReason::Rdma`].)
    #[error(
        "the peer's queue pair did not answer over RDMA within {after:?} of the \
         handshake (it is missing, or cannot reach this side)"
    )]
    Silent {
        /// How long it had (`Config::timeout`).
        after: std::time::Duration,
    },
    /// The peer refused a message (its acknowledgement carried this code; 2: it holds
    /// as many bytes of this session as it may).
    #[error("the peer refused the message (code {0}{hint})", hint = refusal_hint(*.0))]
    PeerRefused(u64),
    /// An RDMA operation failed (a completion with an error status).
    #[error("RDMA failed: {0}")]
    Rdma(String),
    /// This side disconnected the session.
    #[error("disconnected by this side")]
    Disconnected,
    /// The transport shut down (`unbind`, or the last handle dropped).
    #[error("the transport shut down")]
    Shutdown,
    /// Something this side found inconsistent (a bug, reported rather than hidden).
    #[error("internal error: {0}")]
    Local(String),
}

/// What a refusal code means, for the error's text.
fn refusal_hint(code: u64) -> &'static str {
    match code {
        crate::session::ACK_BUSY => {
            ": it holds as many bytes as its max_receiving_bytes (this session) or \
             max_receiving_bytes_total (all its sessions) allows, or could not pin \
             memory for this one (its log says; the memlock limit, `ulimit -l`); send \
             again later, or keep fewer bytes in flight"
        }
        _ => "",
    }
}

impl Error {
    /// The peer refused the message because it holds as many bytes as it may
    /// (`Config::max_receiving_bytes` for this session, or
    /// `Config::max_receiving_bytes_total` for all its sessions, on its side), or
    /// could not register a buffer to read it into (its memlock limit, which its
    /// log names): nothing of the message was read, and sending it again once
    /// earlier messages are done may succeed.
    ///
    /// ```
    /// assert!(kiara_ib::Error::Refused(2).is_busy());
    /// assert!(!kiara_ib::Error::Full.is_busy());
    /// ```
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Refused(crate::session::ACK_BUSY))
    }

    pub(crate) fn io(what: impl Into<Cow<'static, str>>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
