//! Safe RAII wrappers over libibverbs: the whole verbs API, with queue-pair states
//! as types and buffers that cannot be freed while the device may touch them.
//!
//! # Quick start: two queue pairs, one RDMA WRITE
//!
//! ```no_run
//! use rdma_safe::*;
//! use rdma_safe::lease::{Lease, LeasedQp, SendOp};
//!
//! let ctx = Context::open(None)?; // the first device, or Some("mlx5_0")
//! let port = ctx.query_port(1)?;
//! let gid_index = ctx.default_gid_index(1)?; // RoCE v2 IPv4 GID, or 0
//! let gid = ctx.query_gid(1, gid_index)?;
//! let pd = ProtectionDomain::new(&ctx)?;
//! let cq = CompletionQueue::new(&ctx, 256)?;
//!
//! // QueuePair<Reset> -> <Init> -> <Rtr> -> <Rts>: each step is a type.
//! let a = QueuePair::new(&pd, &QpConfig::rc(&cq))?.to_init(&InitAttr::default())?;
//! let b = QueuePair::new(&pd, &QpConfig::rc(&cq))?.to_init(&InitAttr::default())?;
//! let ep = |qp: &QueuePair<qp::Init>, psn| RemoteEndpoint { qpn: qp.qp_num(), psn, lid: port.lid(), gid: Some(gid) };
//! let (ea, eb) = (ep(&a, 1), ep(&b, 2));
//! let connect = |qp: QueuePair<qp::Init>, peer: RemoteEndpoint, psn| -> Result<_> {
//!     let mut rtr = RtrAttr::new(peer, port.active_mtu());
//!     rtr.sgid_index = gid_index as u8;
//!     Ok(qp.to_rtr(&rtr)?.to_rts(&RtsAttr::new(psn))?)
//! };
//! let (a, b) = (connect(a, eb, 1)?, connect(b, ea, 2)?);
//!
//! // The safe layer holds each buffer until its completion gives it back.
//! let target = MemoryRegion::new(&pd, 4096, Access::ALL_REMOTE)?;
//! let mut src = MemoryRegion::new(&pd, 4096, Access::LOCAL_WRITE)?;
//! src.as_mut_slice()?.fill(7); // local-only memory: a plain slice
//! let mut conn = LeasedQp::new(a)?;
//! conn.post_send(1, SendOp::Write(target.remote(0..4096)?), Lease::Owned(src), 0..4096, true)
//!     .map_err(|e| e.error)?;
//! let mut wcs = [WorkCompletion::default(); 8];
//! let src = loop {
//!     // Completions are handed out once, as values only a poll makes.
//!     if let Some(wc) = cq.poll_completions(&mut wcs)?.next() {
//!         wc.result()?; // a failed status becomes an error with its text and a hint
//!         break conn.complete(wc)?.next().unwrap().1;
//!     }
//! };
//! // `target` is remotely writable: read it with volatile copies, never as a slice.
//! assert_eq!(target.to_vec(), src.region().to_vec());
//! # drop(b);
//! # Ok::<(), Error>(())
//! ```
//!
//! `examples/src/bin/rdma_loopback.rs` and the device tests are longer programs.
//!
//! # The rules it enforces
//!
//! - **Drop order.** Every object holds an `Arc` to what it was created from (a QP its
//!   PD, CQs and SRQ; a CQ its context and channel), so parents outlive children
//!   whatever order the program drops them in.
//! - **Queue pair states.** Receives can be posted from `Init`, sends only on `Rts`;
//!   a transition that fails returns the unchanged queue pair with the error. The
//!   device may still move a QP to the error state: `query_state()` tells, `reset()`
//!   starts over.
//! - **Buffers.** Raw posting ([`QueuePair::post_send`], [`QueuePair::post_recv`]) is
//!   `unsafe` with one rule: the buffers stay alive and untouched until the completion
//!   is polled. A [`LocalSlice`] borrows its region, so a region cannot be dropped
//!   while a request built from it exists. [`LeasedQp`] is the safe layer: buffers move
//!   in and come back only through their completions.
//! - **No allocation on the data path.** Work requests are built on the stack,
//!   completions are polled into the caller's slice, and `LeasedQp` keeps its rings.
//!
//! # Threads
//!
//! All handles are `Send + Sync`: libibverbs serialises access to each queue
//! internally. Posting from several threads to one QP is allowed; ordering between
//! them is then the program's business.
//!
//! # Errors
//!
//! [`Error`] names the verb and errno and adds a hint where one helps: `ibv_reg_mr`'s
//! `ENOMEM` names the `ulimit -l` limit, a RoCE route failure names the GID index, a
//! `RETRY_EXC_ERR` completion says what to check.

pub mod access;
pub mod ah;
pub mod channel;
pub mod cm;
pub mod completion;
pub mod context;
pub mod cq;
pub mod deadline;
pub mod device;
#[doc(hidden)]
pub mod endpoint;
pub mod error;
pub mod event;
pub mod gid;
pub mod host;
pub mod lease;
pub mod mr;
pub mod mtu;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod select;
pub mod srq;
pub mod wr;

pub use access::Access;
pub use ah::{AddressHandle, AhAttr};
pub use channel::{poll_readable, CompletionChannel};
pub use completion::{Completion, Completions};
pub use context::{Context, DeviceAttr, PortAttr};
pub use cq::{CompletionQueue, ExCompletion, WcFlags, WorkCompletion};
pub use deadline::Deadline;
pub use device::{Device, DeviceList};
pub use error::{Error, Result};
pub use event::{AsyncEvent, EventElement};
pub use gid::{Gid, GidEntry, GidType};
pub use lease::{DeviceRegion, Lease, LeasedQp, SendFlags, SendOp};
pub use mr::{LocalSlice, MemoryRegion, RemoteSlice};
pub use mtu::Mtu;
pub use mw::{MemoryWindow, MwType};
pub use pd::ProtectionDomain;
pub use qp::{
    random_psn, InitAttr, QpConfig, QpType, QueuePair, RemoteEndpoint, RtrAttr, RtsAttr, SendOps,
};
pub use rdma_verbs_sys as sys;
pub use select::{Selected, Selection};
pub use srq::SharedReceiveQueue;
pub use wr::{RecvWr, SendWr};

// The README's examples compile as doctests, so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
