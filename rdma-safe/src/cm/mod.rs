//! The RDMA connection manager (librdmacm): connect queue pairs by IP address and port
//! instead of exchanging QP numbers, PSNs and GIDs out of band.
//!
//! - [`EventChannel`]: where events arrive; blocking with a timeout, or its fd for
//!   epoll/mio/tokio.
//! - [`CmId`]: resolve, listen, connect, accept, reject, disconnect, migrate.
//! - [`CmEvent`]: a typed event ([`EventKind`]), acknowledged exactly once when
//!   dropped; it holds its id, so an id is never destroyed under an unacknowledged
//!   event (which would make `rdma_destroy_id` wait forever).
//! - [`CmId::create_qp`] makes an ordinary [`crate::QueuePair`] in `Init`; after the
//!   connection is up, [`established`] checks that the CM moved it to RTS and returns
//!   a `QueuePair<Rts>`.
//! - [`ep`]: the synchronous endpoint API of `rdma_verbs.h` (`rdma_getaddrinfo`,
//!   `rdma_create_ep`, `rdma_get_request`, `rdma_reg_msgs`, `rdma_post_*`,
//!   `rdma_get_*_comp`), every wait with a timeout.
//!
//! # Client
//!
//! ```no_run
//! use rdma_safe::cm::{self, CmId, ConnParam, EventChannel, EventKind, PortSpace};
//! use rdma_safe::*;
//! use std::time::Duration;
//!
//! let t = Duration::from_secs(5);
//! let channel = EventChannel::new()?;
//! let id = CmId::new(&channel, PortSpace::Tcp)?;
//! id.resolve(None, "198.18.0.1:7174".parse().unwrap(), t)?; // address, then route
//! let ctx = id.context()?; // the device the address resolved to
//! let pd = ProtectionDomain::new(&ctx)?;
//! let cq = CompletionQueue::new(&ctx, 16)?;
//! let qp = id.create_qp(&pd, &QpConfig::rc(&cq))?; // QueuePair<Init>: post receives now
//! id.connect(&ConnParam { private_data: b"hello".to_vec(), ..Default::default() })?;
//! let ev = channel.expect(EventKind::Established, "rdma_connect", t)?;
//! drop(ev); // acknowledged here
//! let qp = cm::established(qp)?; // QueuePair<Rts>
//! # let _ = qp;
//! id.disconnect()?;
//! # Ok::<(), Error>(())
//! ```
//!
//! # Server
//!
//! ```no_run
//! use rdma_safe::cm::{self, CmId, ConnParam, EventChannel, EventKind, PortSpace};
//! use rdma_safe::*;
//! use std::time::Duration;
//!
//! let channel = EventChannel::new()?;
//! let listener = CmId::new(&channel, PortSpace::Tcp)?;
//! listener.bind_addr("198.18.0.1:7174".parse().unwrap())?;
//! listener.listen(8)?;
//! let req = channel.expect(EventKind::ConnectRequest, "rdma_listen", Duration::from_secs(30))?;
//! let conn = req.id().clone(); // the new connection's id
//! if req.private_data().starts_with(b"hello") {
//!     let ctx = conn.context()?;
//!     let pd = ProtectionDomain::new(&ctx)?;
//!     let cq = CompletionQueue::new(&ctx, 16)?;
//!     let qp = conn.create_qp(&pd, &QpConfig::rc(&cq))?;
//!     conn.accept(&ConnParam::default())?;
//!     drop(req);
//!     channel.expect(EventKind::Established, "rdma_accept", Duration::from_secs(5))?;
//!     let _qp = cm::established(qp)?;
//! } else {
//!     conn.reject(b"go away")?;
//! }
//! # Ok::<(), Error>(())
//! ```

mod addr;
mod channel;
pub mod ep;
mod event;
mod id;

pub use channel::EventChannel;
pub use event::{reject_reason_text, CmEvent, EventKind};
pub use id::{established, CmId, ConnParam, PortSpace};

/// The snippets of `docs/cm.md`, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/cm.md")]
pub struct CmGuide;
