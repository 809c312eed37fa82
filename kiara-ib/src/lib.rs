//! The KIARA middleware's InfiniBand transport: many clients served over RC queue
//! pairs, where a `send` ships only a descriptor (address, length, key) and the
//! receiver fetches the bytes with RDMA READ. Replies travel the same way.
//!
//! # Example: an echo server and a client
//!
//! ```no_run
//! use kiara_ib::{Config, Linger, Message, Transport};
//!
//! // Server: every message is sent back on the session it came from.
//! let server = Transport::new(Config::default());
//! server.register_callback(|msg, session, transport| {
//!     let _ = transport.send(session, Message::new(msg.bytes().to_vec()), Linger::NoWait);
//! })?;
//! let addr = server.bind("198.18.0.1:0")?;
//!
//! // Client: connect, send 1 MiB (read by the server with RDMA READ), await the echo.
//! let client = Transport::new(Config::default());
//! let session = client.connect(addr)?;
//! client.send(&session, vec![7u8; 1 << 20], Linger::Block)?;
//! let echo = client.recv(&session, Linger::Timeout(std::time::Duration::from_secs(10)))?;
//! assert_eq!(echo.unwrap().len(), 1 << 20);
//! client.disconnect(session)?;
//! server.unbind()?;
//! # Ok::<(), kiara_ib::Error>(())
//! ```
//!
//! # How it works
//!
//! - **Bootstrap**: a TCP connection carries a versioned, length-checked hello each
//!   way (QPN, PSN, LID, GID, MTU, credits, limits); the RC queue pairs go to RTS and
//!   the TCP connection stays open as the liveness channel: when a peer dies, its
//!   socket closes and every send pending on that session fails at once. The client
//!   then greets over RDMA; a server closes a session whose queue pair has said
//!   nothing within `Config::timeout`, so a bare TCP socket holds a session for no
//!   longer than that.
//! - **Messages**: up to `eager_threshold` bytes travel inside the SEND; larger ones
//!   are copied once into a registered buffer of the pool (or sent from a
//!   caller-registered region with no copy), described by a descriptor, read by the
//!   peer in `read_chunk` pieces into a pooled buffer, and acknowledged: the
//!   acknowledgement completes the sender's `send` and frees its buffer.
//! - **Flow control**: a peer never SENDs without a receive posted on the other
//!   side. Each side starts with the other's number of receive slots as credits;
//!   every control message returns the credits its sender owes; the last credit is
//!   kept for credit returns, so the two sides cannot both wait.
//! - **Threads**: one poller thread per transport reaps completions when nobody
//!   else does (it never spins), watches the bootstrap sockets and keeps the
//!   acknowledgement timeouts. A few callback runner threads per transport (one
//!   fewer than the cores, at most four) run the callback on every session's
//!   messages, each session's in order and one at a time; between callbacks they
//!   reap every session's completions for `Config::busy_poll`, so a request's
//!   callback runs on the thread that reaped it, with no wake-up in between. A
//!   callback that blocks for more than 20 ms gets a runner to stand in for it, so
//!   it holds up its own session only. Callbacks run there and nowhere else; a
//!   callback that would wait on a send (a `Linger` other than `NoWait`, or
//!   `SendHandle::wait`) gets `Error::Usage` instead of a deadlock. Each accepted
//!   client's handshake runs on a short thread of its own, at most
//!   `Config::max_handshakes` at once, and the server reads the client's hello
//!   (under one deadline) before it creates a queue pair or pins a buffer for it.
//! - **Bounds**: per session, `max_outstanding` messages and `max_outstanding_bytes`
//!   in flight (`send` waits or fails with `Error::Full`), `max_receiving_bytes` held
//!   for the peer (beyond, its messages are refused), `ack_timeout` for each
//!   acknowledgement and for each control message to be taken; per transport,
//!   `max_sessions` (and, if set,
//!   `max_sessions_per_address`), `max_outstanding_bytes_total`
//!   queued or in flight on all sessions and `max_receiving_bytes_total` held for all
//!   peers together. Below the process's memlock limit (`ulimit -l`), which the
//!   transport compares with those budgets at its start, a peer's message that
//!   cannot be pinned is refused as busy, and one of ours fails alone with
//!   `Error::NotSent`: no session closes for it. A peer reads a message only through
//!   a window over exactly its bytes, until its acknowledgement
//!   (`docs/kiara-protocol.md`, section 5). A thread waiting in `recv` or `SendHandle::wait` reaps its
//!   session's completions itself for up to `busy_poll`, while that session's waits
//!   are short, and sleeps otherwise.
//!
//! `docs/kiara-protocol.md` specifies the wire protocol.

mod budget;
mod callback_queue;
pub mod config;
mod conn;
mod engine;
pub mod error;
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub mod faults;
// The faults are for the crate's own tests, built unoptimized: in an optimized
// build the feature is on by mistake (features are unified, so a dependency that
// turned it on would have turned it on for every user of kiara-ib in the build).
#[cfg(all(feature = "fault-injection", not(debug_assertions)))]
compile_error!(
    "kiara-ib's fault-injection feature is for its own tests only, and is on in an \
     optimized build: remove it from the dependency that turns it on"
);
mod handshakes;
mod id_map;
mod keepalive;
mod line_limit;
mod memlock;
pub mod message;
mod poller;
pub mod pool;
pub mod protocol;
mod registrar;
mod runners;
mod send_done;
mod session;
mod shared_recv;
mod slots;
mod spare;
mod sq_gate;
pub mod transport;
mod waiting;

pub use config::Config;
pub use error::{CloseReason, Error, Result};
pub use message::Message;
pub use transport::{Callback, Linger, SendHandle, Session, SharedReceives, Transport};

// The README's examples compile as doctests, so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
