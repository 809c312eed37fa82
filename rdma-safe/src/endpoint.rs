//! The former home of [`Deadline`], kept so that `rdma_safe::endpoint::Deadline`
//! still names it. New code writes `rdma_safe::Deadline`.
//!
//! This module once also defined a binary endpoint message and its `exchange`. No
//! program spoke it: the ports keep their C originals' wire formats and kiara-ib has
//! its own hello, so it was removed; a program with a format of its own sends its
//! [`RemoteEndpoint`](crate::RemoteEndpoint) fields within one [`Deadline`].

pub use crate::deadline::Deadline;
