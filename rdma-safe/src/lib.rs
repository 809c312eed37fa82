//! Safe RAII wrappers over libibverbs (and, later, librdmacm).
//!
//! Every verbs object is a Rust value that frees itself on drop, and every child holds
//! its parent in an `Arc`, so no drop order can free a parent under a live child.
//!
//! # Example
//!
//! ```no_run
//! use rdma_safe::{Context, DeviceList};
//!
//! for dev in DeviceList::new()?.iter() {
//!     println!("{} guid {:016x}", dev.name(), dev.guid());
//! }
//! let ctx = Context::open(None)?; // the first device
//! let port = ctx.query_port(1)?;
//! println!("port 1 active: {}, lid {}", port.is_active(), port.lid());
//! for entry in ctx.gid_table()? {
//!     println!("GID[{}] {} {:?}", entry.index, entry.gid, entry.gid_type);
//! }
//! # Ok::<(), rdma_safe::Error>(())
//! ```

#![warn(missing_docs)]

pub mod access;
pub mod ah;
pub mod channel;
pub mod context;
pub mod cq;
pub mod device;
pub mod endpoint;
pub mod error;
pub mod event;
pub mod gid;
pub mod lease;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod srq;
pub mod wr;

pub use access::Access;
pub use ah::{AddressHandle, AhAttr};
pub use channel::CompletionChannel;
pub use context::{Context, DeviceAttr, PortAttr};
pub use cq::{CompletionQueue, WorkCompletion};
pub use device::{Device, DeviceList};
pub use endpoint::{exchange, Endpoint};
pub use error::{Error, Result};
pub use event::{AsyncEvent, EventElement};
pub use gid::{Gid, GidEntry, GidType};
pub use lease::{Lease, LeasedQp, SendOp};
pub use mr::{LocalSlice, MemoryRegion, RemoteSlice};
pub use mw::{MemoryWindow, MwType};
pub use pd::ProtectionDomain;
pub use qp::{InitAttr, QpConfig, QpType, QueuePair, RemoteEndpoint, RtrAttr, RtsAttr};
pub use rdma_sys as sys;
pub use srq::SharedReceiveQueue;
pub use wr::{RecvWr, SendWr};
